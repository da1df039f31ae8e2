"""Operation classes: the opcode tables that turn a mnemonic into what it does.

Both dialects map onto the same classes, so a SASS kernel and a PTX kernel can be compared class by
class. A mnemonic missing from the tables is kept with class ``other``, counted and warned about by the
parsers. ``CRITICAL`` lists the classes that the sequence layer aligns and that per-loop counts report.
"""

from __future__ import annotations

# -- SASS ------------------------------------------------------------------------------------------------
# Base mnemonic -> class, for mnemonics whose class does not depend on modifiers.
SASS_BASE = {
    # matrix multiply: warp-level, warpgroup (sm_90), tcgen05 (sm_100)
    **dict.fromkeys(["HMMA", "IMMA", "DMMA", "BMMA", "QMMA", "OMMA"], "mma"),
    **dict.fromkeys(["HGMMA", "QGMMA", "IGMMA", "BGMMA"], "mma"),
    **dict.fromkeys(["UTCHMMA", "UTCQMMA", "UTCIMMA", "UTCOMMA", "UTCMMA", "UTCBMMA"], "mma"),
    # tensor memory accelerator and bulk copies
    "UTMALDG": "tma.load", "UTMASTG": "tma.store", "UTMAREDG": "tma.store", "UTMAPF": "tma.other",
    "UTMACCTL": "tma.other", "UTMACMDFLUSH": "tma.other", "UBLKCP": "bulk.copy", "UBLKRED": "bulk.copy",
    "UBLKPF": "tma.other",
    # cp.async (LDGSTS) and its groups
    "LDGSTS": "cp.async", "LDGDEPBAR": "cp.async.commit", "DEPBAR": "cp.async.wait",
    "ARRIVES": "cp.async.arrive",
    # memory
    "LDG": "ld.global", "STG": "st.global", "LDS": "ld.shared", "STS": "st.shared", "LDSM": "ldsm",
    # STAS: st.async to a cluster peer's shared memory with mbarrier completion (quack's GEMM; PTX
    # st.async.shared::cluster..., which ptx_class reads as st.shared by its state space)
    "STSM": "stsm", "STAS": "st.shared", "LDL": "ld.local", "STL": "st.local", "LDC": "ld.const", "ULDC": "ld.const", "LDCU": "ld.const",
    "LD": "ld.generic", "ST": "st.generic", "ATOM": "atomic", "ATOMG": "atomic", "ATOMS": "atomic",
    "RED": "atomic", "REDG": "atomic", "REDUX": "shuffle", "CCTL": "fence", "CCTLL": "fence",
    "LDTM": "tmem", "STTM": "tmem", "UTCBAR": "mbar.arrive", "UTCCP": "tmem", "UTCSHIFT": "tmem",
    "UTCATOMSWS": "tmem",
    # cluster launch control (clusterlaunchcontrol.try_cancel: the Sm100 tile scheduler asks for the next tile)
    "UGETNEXTWORKID": "other",
    # barriers and fences
    "BAR": "bar.sync", "MEMBAR": "fence", "FENCE": "fence", "ERRBAR": "fence", "WARPGROUP": "wgmma.sync",
    "UCGABAR_ARV": "cluster.bar", "UCGABAR_WAIT": "cluster.bar", "CGAERRBAR": "fence",
    "USETMAXREG": "setmaxnreg", "ACQBULK": "fence", "ACQSHMINIT": "fence",
    # floating point
    "FFMA": "fp32.fma", "FFMA2": "fp32.fma", "FADD": "fp32.add", "FADD2": "fp32.add", "FMUL": "fp32.mul",
    "FMUL2": "fp32.mul", "FMNMX": "fp32.other", "FMNMX3": "fp32.other", "FSETP": "fp32.other", "FSEL": "fp32.other",
    "FSET": "fp32.other", "FCHK": "fp32.other", "FSWZADD": "fp32.other", "FRND": "cvt",
    **dict.fromkeys(["HADD2", "HFMA2", "HMUL2", "HSET2", "HSETP2", "HMNMX2", "HADD", "HMUL", "HFMA"], "fp16"),
    **dict.fromkeys(["DFMA", "DADD", "DMUL", "DSETP", "DMNMX", "DSET"], "fp64"),
    "MUFU": "mufu",
    **dict.fromkeys(["F2F", "F2I", "I2F", "F2FP", "I2FP", "F2IP", "I2I", "I2IP"], "cvt"),
    # integer and uniform datapath
    **dict.fromkeys(["IADD3", "IADD", "IMAD", "IMUL", "LEA", "LOP3", "LOP", "SHF", "SHL", "SHR", "ISETP",
                     "IABS", "IMNMX", "VIMNMX", "VIMNMX3", "POPC", "FLO", "BREV", "PRMT", "SEL", "IDP",
                     "IDP4A", "BMSK", "SGXT", "VABSDIFF", "VABSDIFF4", "IADD32I", "IMAD32I", "ISCADD",
                     "IMADSP", "BITEXTRACT", "PLOP3", "PSETP", "P2R", "R2P", "CSET", "CSETP", "LEPC"], "int"),
    **dict.fromkeys(["UIADD3", "UIMAD", "ULEA", "ULOP3", "ULOP", "USHF", "USHL", "USHR", "UISETP", "USEL",
                     "UPRMT", "UFLO", "UPOPC", "UBMSK", "UBREV", "USGXT", "UPLOP3", "UPSETP", "UP2UR",
                     "UR2UP", "ULOP32I", "UIABS", "UIMNMX", "UVIADD", "UCLEA", "UVIRTCOUNT", "UFMUL",
                     "UFADD", "UFFMA", "UFSETP", "UFSEL", "UF2F", "UF2FP", "UI2F", "UF2I", "UI2FP"], "uniform"),
    **dict.fromkeys(["VIADD", "VIADDMNMX", "VHMNMX", "IMNMX3"], "int"),
    # data movement
    **dict.fromkeys(["MOV", "MOV32I", "UMOV", "S2R", "S2UR", "CS2R", "R2UR", "R2B", "B2R", "GETLMEMBASE",
                     "SETLMEMBASE", "LDTRAM", "PMTRIG", "RPCMOV"], "move"),
    **dict.fromkeys(["SHFL", "VOTE", "VOTEU", "MATCH", "ELECT", "QSPC"], "shuffle"),
    # control
    **dict.fromkeys(["BRA", "BRX", "JMP", "JMX", "BRXU", "JMXU"], "branch"),
    **dict.fromkeys(["EXIT", "KILL", "BPT"], "exit"),
    "CALL": "call", "RET": "return",  # a called subroutine (ptxas's IEEE divide / sqrt slow paths) and its return
    **dict.fromkeys(["BSSY", "BSYNC", "BREAK", "WARPSYNC", "YIELD", "NANOSLEEP", "BMOV", "ENDCOLLECTIVE",
                     "PREEXIT", "WARPGROUPSET"], "sync"),
    "NOP": "nop",
    **dict.fromkeys(["TEX", "TLD", "TLD4", "TMML", "TXD", "TXQ", "SUST", "SULD", "SURED", "SUATOM", "SUQUERY",
                     "TEXS", "TLDS", "TLD4S"], "tex"),
    **dict.fromkeys(["AL2P", "ALD", "AST", "ISBERD", "ISBEWR", "OUT", "IPA", "PIXLD"], "other.graphics"),
}


def sass_class(opcode: str, mods: tuple) -> str | None:
    """Class of a SASS instruction, or ``None`` for a mnemonic the tables do not know."""
    if opcode == "SYNCS":
        if "EXCH" in mods:
            return "mbar.init"
        if "PHASECHK" in mods:
            return "mbar.wait"
        if "ARRIVE" in mods:
            # arrive with a transaction count (expect_tx) vs a plain arrive (A1T0: 1 arrival, 0 bytes)
            return "mbar.arrive" if any(m.startswith("A1T0") or m == "RED" for m in mods) else "mbar.arrive.tx"
        return "mbar.other"
    if opcode in ("UBLKCP", "UBLKRED") and mods[:1] == ("G",):
        return "bulk.store"  # UBLKCP.G.S: a non-tensor bulk copy shared -> global (the destination first)
    return SASS_BASE.get(opcode)


# -- PTX -------------------------------------------------------------------------------------------------
PTX_FLOAT_TYPES = {"f32", "f16", "f16x2", "bf16", "bf16x2", "f64", "ftz"}
PTX_BASE = {
    "mma": "mma", "wgmma": "wgmma", "tcgen05": "tcgen05", "ldmatrix": "ldsm", "stmatrix": "stsm",
    "bar": "bar.sync", "barrier": "bar.sync", "membar": "fence", "fence": "fence", "setmaxnreg": "setmaxnreg",
    "ex2": "mufu", "lg2": "mufu", "rcp": "mufu", "rsqrt": "mufu", "sqrt": "mufu", "sin": "mufu", "cos": "mufu",
    "tanh": "mufu", "cvt": "cvt", "cvta": "int", "bra": "branch", "brx": "branch", "ret": "exit",
    "exit": "exit", "trap": "exit", "call": "call", "mov": "move", "shfl": "shuffle", "vote": "shuffle",
    "match": "shuffle", "elect": "shuffle", "redux": "shuffle", "activemask": "shuffle",
    "atom": "atomic", "red": "atomic", "prefetch": "other.prefetch", "prefetchu": "other.prefetch",
    "nanosleep": "sync", "bar.warp": "sync", "griddepcontrol": "sync", "tex": "tex", "tld4": "tex",
    "suld": "tex", "sust": "tex", "sured": "tex", "txq": "tex", "suq": "tex", "isspacep": "int",
    "getctarank": "int", "mapa": "int", "applypriority": "other.prefetch", "discard": "other.prefetch",
    "createpolicy": "int", "pmevent": "other", "brkpt": "other", "clusterlaunchcontrol": "other",
    "multimem": "atomic", "st": "st.generic", "ld": "ld.generic", "ldu": "ld.global", "alloca": "int",
    "stacksave": "int", "stackrestore": "int", "istypep": "int",
}
PTX_INT_OPS = {"add", "sub", "mul", "mad", "mul24", "mad24", "sad", "div", "rem", "abs", "neg", "min", "max",
               "popc", "clz", "bfind", "fns", "brev", "bfe", "bfi", "szext", "bmsk", "dp4a", "dp2a", "and",
               "or", "xor", "not", "cnot", "lop3", "shf", "shl", "shr", "prmt", "setp", "set", "selp", "slct",
               "testp", "copysign", "fma", "mad.lo", "addc", "subc", "madc", "mul.hi"}


def ptx_class(opcode: str, mods: tuple) -> str | None:
    """Class of a PTX instruction, or ``None`` for a mnemonic the tables do not know."""
    if opcode == "cp":
        if mods[:2] == ("async", "bulk"):
            if "tensor" in mods:
                rest = mods[mods.index("tensor") + 2:]  # after the dimensionality: destination space first
                return "tma.store" if rest and rest[0].startswith("global") else "tma.load"
            if "commit_group" in mods:
                return "cp.async.commit"
            if "wait_group" in mods or "wait_group.read" in mods:
                return "cp.async.wait"
            if "prefetch" in mods:
                return "tma.other"
            if len(mods) > 2 and mods[2].startswith("global"):
                return "bulk.store"  # cp.async.bulk.global.shared::cta: shared -> global (the destination first)
            return "bulk.copy"
        if mods[:1] == ("async",):
            if "commit_group" in mods:
                return "cp.async.commit"
            if "wait_group" in mods or "wait_all" in mods:
                return "cp.async.wait"
            if "mbarrier" in mods:
                return "cp.async.arrive"
            return "cp.async"
        if mods[:1] == ("reduce",):
            return "bulk.store" if len(mods) > 3 and mods[3].startswith("global") else "bulk.copy"
        return None
    if opcode == "mbarrier":
        if "init" in mods:
            return "mbar.init"
        if "try_wait" in mods or "test_wait" in mods:
            return "mbar.wait"
        if "expect_tx" in mods:
            return "mbar.arrive.tx"
        if "arrive" in mods or "arrive_drop" in mods:
            return "mbar.arrive"
        return "mbar.other"
    if opcode in ("wgmma", "tcgen05"):
        if "mma_async" in mods or "mma" in mods or "mma.ws" in mods:
            return "mma"
        if opcode == "wgmma":
            return "wgmma.sync"
        return "tmem"
    if opcode in ("ld", "ldu", "st"):
        space = next((m for m in mods if m.split("::")[0] in ("global", "shared", "local", "const", "param")), "")
        space = space.split("::")[0]
        kind = "ld" if opcode in ("ld", "ldu") else "st"
        if space == "param" or space == "const":
            return "ld.const"
        return f"{kind}.{space}" if space else f"{kind}.generic"
    if opcode == "barrier" and "cluster" in mods:
        return "cluster.bar"
    base = PTX_BASE.get(opcode)
    if base is not None:
        return base
    if opcode in PTX_INT_OPS or opcode in ("fma", "testp", "copysign"):
        floaty = any(m in PTX_FLOAT_TYPES for m in mods)
        if not floaty:
            return "int"
        if any(m in ("f64",) for m in mods):
            return "fp64"
        if any(m in ("f16", "f16x2", "bf16", "bf16x2") for m in mods):
            return "fp16"
        if opcode in ("fma", "mad"):
            return "fp32.fma"
        if opcode in ("add", "sub"):
            return "fp32.add"
        if opcode == "mul":
            return "fp32.mul"
        if opcode == "div":
            return "fp32.div"
        return "fp32.other"
    return None


# Classes whose order and count describe a loop body (sequence layer, per-loop counts).
CRITICAL = ("mma", "tma.load", "tma.store", "bulk.copy", "bulk.store", "cp.async", "cp.async.commit", "cp.async.wait",
            "cp.async.arrive", "ld.global", "st.global", "ld.shared", "st.shared", "ldsm", "stsm", "atomic",
            "bar.sync", "mbar.arrive", "mbar.arrive.tx", "mbar.wait", "wgmma.sync", "cluster.bar", "tmem",
            "fp32.fma", "fp32.add", "fp32.mul", "fp16", "fp64", "mufu", "cvt")
# Classes replicated by unrolling (the unroll estimate is the gcd of their counts in the loop body).
REPLICATED = ("mma", "tma.load", "tma.store", "bulk.copy", "bulk.store", "cp.async", "ld.global", "st.global", "ld.shared",
              "st.shared", "ldsm", "stsm", "fp32.fma", "fp32.add", "fp32.mul", "fp16", "fp64", "mufu")
