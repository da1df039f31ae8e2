"""The six-layer fingerprint of one kernel.

``lift_program`` runs the whole lift: CFG and loops (``cfg``), work loops with prologue/body/epilogue
(``normalize``), warp roles (``roles``), then the features of each layer. Features that the input cannot
tell (the grid of a bare cubin, registers of PTX, stall reasons without Nsight Compute metrics) are
``None``: reported as unknown or absent, never guessed, and never compared. Counts are taken per warp role
and per steady-state loop body; whole-kernel facts are sets of forms (present or not), which unrolling does
not change.
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs

from mosaic.lift.cfg import build_cfg
from mosaic.lift.instruction import Program
from mosaic.lift.normalize import WorkLoop, class_counts, loop_unroll, stepped_counters, work_loops
from mosaic.lift.opclass import CRITICAL
from mosaic.lift.resources import METRICS, metric, occupancy, stall_top
from mosaic.lift.roles import find_roles
from mosaic.lift.stages import pipeline_stages
from mosaic.records import LAYERS

KINDS = ("cat", "num", "set", "map", "seq")


@attrs.frozen
class Feature:
    layer: str
    key: str
    value: Any
    kind: str
    role: str = ""  # "" for kernel-wide features; a role name for per-role ones
    where: str = "kernel"

    def to_json(self) -> dict:
        return {"key": self.key, "value": _plain(self.value), "kind": self.kind, "role": self.role,
                "where": self.where}


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


@attrs.define
class Fingerprint:
    kernel: str
    dialect: str
    origin: str
    features: list
    roles: list
    main_role: str
    loops: list
    warnings: list
    unknown_opcodes: dict
    instructions: int

    def layer(self, name: str) -> list:
        return [f for f in self.features if f.layer == name]

    def get(self, key: str, role: str = "") -> Feature | None:
        return next((f for f in self.features if f.key == key and f.role == role), None)

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "dialect": self.dialect, "origin": self.origin,
                "instructions": self.instructions, "roles": self.roles, "main_role": self.main_role,
                "loops": self.loops, "unknown_opcodes": self.unknown_opcodes, "warnings": self.warnings,
                "layers": {name: [f.to_json() for f in self.layer(name)] for name in LAYERS}}


@attrs.define
class Context:
    """What lifting knows besides the instructions: cubin attributes, launch record, ptxas log, metrics, GPU."""

    cubin: Any = None  # disasm.CubinAttributes
    launch: Any = None  # records.LaunchRecord
    ptxas: dict | None = None  # resources.parse_ptxas_log entry
    metrics: dict | None = None  # None: no metrics file; {} / {...}: what it holds
    gpu: Any = None  # records.GpuTarget
    origin: str = ""


# -- helpers -----------------------------------------------------------------------------------------------
_SCORE = {"mma": 16, "tma.load": 4, "bulk.copy": 4, "cp.async": 4, "ldsm": 4, "ld.global": 2, "st.global": 2,
          "ld.shared": 2, "st.shared": 2, "mbar.wait": 1, "fp32.fma": 1, "fp32.add": 1, "fp32.mul": 1,
          "fp16": 1, "fp64": 1, "mufu": 1}
_MMA_FORM_SASS = {"HMMA": "mma.sync", "IMMA": "mma.sync", "DMMA": "mma.sync", "BMMA": "mma.sync",
                  "QMMA": "mma.sync", "OMMA": "mma.sync", "HGMMA": "wgmma", "QGMMA": "wgmma", "IGMMA": "wgmma",
                  "BGMMA": "wgmma"}
#: how tiles arrive and how results leave; ``.generic``: plain loads and stores through generic addresses (PTX ``ld`` /
#: ``st`` with no state space, SASS ``LD.E`` / ``ST.E``: the space is resolved at run time), as Mosaic GPU emits for
#: register loads and stores of a global ref
_TRANSFER = {"tma.load": "tma", "bulk.copy": "bulk", "cp.async": "cp.async", "ld.global": "ld.global",
             "ld.generic": "ld.generic"}
_PLAIN_LOADS = ("ld.global", "ld.generic")
_STORE = {"tma.store": "tma", "bulk.store": "bulk", "st.global": "st.global", "st.generic": "st.generic",
          "atomic": "atomic"}
_BARRIERS = ("bar.sync", "mbar.init", "mbar.arrive", "mbar.arrive.tx", "mbar.wait", "cp.async.arrive",
             "cp.async.wait", "wgmma.sync", "cluster.bar", "fence")
_SASS_WIDTH = {"128": 128, "64": 64, "U8": 8, "S8": 8, "U16": 16, "S16": 16}
_PTX_WIDTH = {"b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16, "b32": 32,
              "u32": 32, "s32": 32, "f32": 32, "b64": 64, "u64": 64, "s64": 64, "f64": 64, "b128": 128}
_NCTAID_SASS = ("c[0x0][0xc]", "c[0x0][0x10]", "c[0x0][0x14]")


def access_width(insn) -> int:
    if insn.opcode in ("ld", "ldu", "st"):
        base = next((_PTX_WIDTH[m] for m in insn.mods if m in _PTX_WIDTH), 32)
        vec = next((int(m[1:]) for m in insn.mods if m in ("v2", "v4", "v8")), 1)
        return base * vec
    if insn.opcode == "LDGSTS" or insn.opcode.startswith("LDSM"):
        return next((_SASS_WIDTH[m] for m in insn.mods if m in _SASS_WIDTH), 32)
    return next((_SASS_WIDTH[m] for m in insn.mods if m in _SASS_WIDTH), 32)


#: tcgen05 (sm_100) tensor-memory operations, SASS opcode -> op (a function of the modifiers where they decide):
#: UTCATOMSWS.FIND_AND_SET claims columns (tcgen05.alloc), UTCATOMSWS.AND clears them (dealloc); LDTM / STTM
#: read / write tensor memory (tcgen05.ld / st); UTCCP copies shared -> tensor memory; UTCBAR is tcgen05.commit
_TMEM_OPS_SASS = {"UTCATOMSWS": lambda mods: "alloc" if "FIND_AND_SET" in mods else "dealloc", "LDTM": "ld",
                  "STTM": "st", "UTCCP": "cp", "UTCSHIFT": "shift", "UTCBAR": "commit"}
#: PTX tcgen05.<op> -> the same names; relinquish_alloc_permit, wait and fence leave no SASS of their own to
#: match, so they are not listed (a PTX and a SASS lift of one kernel give the same row)
_TMEM_OPS_PTX = {"alloc": "alloc", "dealloc": "dealloc", "ld": "ld", "st": "st", "cp": "cp", "shift": "shift",
                 "commit": "commit"}
#: tcgen05 MMA kinds: the operand family lives in the instruction descriptor (a register) in SASS, so the
#: opcode names it; PTX spells ``kind::f16``
_TCGEN05_KIND_SASS = {"UTCHMMA": "kind::f16", "UTCQMMA": "kind::f8f6f4", "UTCIMMA": "kind::i8"}


def _mma_info(insn) -> tuple[str, str | None, tuple]:
    if insn.opcode in ("mma", "wgmma", "tcgen05"):
        form = {"mma": "mma.sync", "wgmma": "wgmma", "tcgen05": "tcgen05"}[insn.opcode]
        shape = next((m for m in insn.mods if re.fullmatch(r"m\d+n\d+k\d+", m)), None)
        types = tuple(m for m in insn.mods if re.fullmatch(r"(f|bf|s|u|e4m3|e5m2|tf|b)\d*(x\d)?|e4m3|e5m2|tf32", m)
                      or m.startswith("kind::"))
        return form, shape, types
    if insn.opcode in _TCGEN05_KIND_SASS or insn.opcode.startswith("UTC"):
        kind = _TCGEN05_KIND_SASS.get(insn.opcode)
        return "tcgen05", None, (kind,) if kind else ()
    form = _MMA_FORM_SASS.get(insn.opcode, insn.opcode)
    shape = None
    for m in insn.mods:
        if re.fullmatch(r"\d+x\d+x\d+", m):
            a, b, c = m.split("x")
            shape = f"m{a}n{b}k{c}"
        elif re.fullmatch(r"\d{3,5}", m):  # HMMA.16816 -> m16n8k16, HMMA.1688 -> m16n8k8
            s = m
            shape = f"m{s[:2]}n{s[2]}k{s[3:]}"
    types = tuple(m.lower() for m in insn.mods if re.fullmatch(r"(F|BF|S|U|E4M3|E5M2|TF)\d*|E4M3|E5M2", m))
    if insn.opcode == "HMMA" and not {"BF16", "TF32"} & set(insn.mods):
        types = (*types, "f16")  # HMMA.16816.F32: f16 operands (only bf16/tf32 are spelled), f32 accumulator
    if insn.opcode in ("IGMMA", "IMMA") and "s32" not in types:
        types = (*types, "s32")  # IGMMA.64x256x32.S8.S8: the integer accumulator (always s32) is not spelled
    return form, shape, types


def mma_operand_sources(insns) -> list[str]:
    """Where the warpgroup MMAs read their A operand: ``smem`` (a descriptor: ``HGMMA ... R24, gdesc[UR8], R24``)
    or ``registers`` (``HGMMA ... R88, R24, gdesc[UR8].tnspB, R88``: attention's P fed to the second MMA from
    the first's accumulator). mma.sync reads both from registers and tcgen05 from shared or tensor memory by
    descriptor, so only the Hopper wgmma opcodes count. SASS only: PTX's operand lists are not read here."""
    out = set()
    for i in insns:
        if _MMA_FORM_SASS.get(i.opcode) == "wgmma" and len(i.operands) > 1:
            out.add("smem" if i.operands[1].startswith("gdesc") else "registers")
    return sorted(out)


def reduce_sequence(seq: list[str]) -> list[str]:
    """Collapse runs (``ld ld ld`` -> ``ld+``) and reduce an exact repetition to one period."""
    out: list[str] = []
    for s in seq:
        if out and (out[-1] == s or out[-1] == s + "+"):
            out[-1] = s + "+"
        else:
            out.append(s)
    n = len(out)
    for p in range(1, n // 2 + 1):
        if n % p == 0 and out[:p] * (n // p) == out:
            return out[:p]
    return out


_TIER = (("mma",), ("tma.load", "bulk.copy", "cp.async"))


def _hotness(w: WorkLoop) -> tuple:
    """The hot loop of a role: the deepest loop that issues MMAs (a GEMM's k-loop, not the persistent tile loop
    around it, whose body also holds a peeled first k-step and the epilogue); with no MMA loop the deepest that
    issues async copies (a producer's k-loop); otherwise the loop with the most weighted work."""
    classes = {i.opclass for i in w.body}
    tier = next((len(_TIER) - n for n, t in enumerate(_TIER) if classes & set(t)), 0)
    return (tier, w.depth if tier else 0, sum(_SCORE.get(i.opclass, 0) for i in w.body), w.depth, -w.header)


# -- the lift ------------------------------------------------------------------------------------------------
def lift_program(program: Program, ctx: Context | None = None) -> Fingerprint:
    ctx = ctx or Context()
    cfg = build_cfg(program)
    loops = work_loops(cfg)
    headers = {w.header for w in loops}
    bound = ctx.launch.block if ctx.launch else (ctx.cubin.max_threads if ctx.cubin and ctx.cubin.max_threads
                                                 else program.directives.get("maxntid"))
    roles, role_branches = find_roles(cfg, headers, math.prod(bound) if bound else None)
    insns = [i for i in program.instructions if cfg.block_of[i.index] in cfg.reachable]
    warnings = list(program.warnings)
    if program.unknown:
        total = sum(program.unknown.values())
        warnings.append(f"{total} instruction(s) with unknown opcode(s) kept as 'other': "
                        + ", ".join(f"{k}×{v}" for k, v in sorted(program.unknown.items())))
    # role -> its work loops
    role_loops: dict[str, list[WorkLoop]] = {}
    if roles:
        for r in roles:
            role_loops[r.name] = [w for w in loops if w.header in r.blocks]
    else:
        role_loops["all"] = loops
    hot: dict[str, WorkLoop | None] = {}
    for name, wls in role_loops.items():
        hot[name] = max(wls, key=_hotness) if wls else None
    # the main role holds the MMA loop (a warp-specialised kernel's consumer), else the most weighted loop
    scored = [(_hotness(w)[0], sum(_SCORE.get(i.opclass, 0) for i in w.body), name) for name, w in hot.items() if w]
    main_role = max(scored)[-1] if scored else next(iter(role_loops))
    F: list[Feature] = []

    def add(layer, key, value, kind, role="", where="kernel"):
        F.append(Feature(layer, key, value, kind, role, where))

    _launch(add, program, ctx, roles)
    _instruction(add, insns, hot)
    add("instruction", "mma.operands", mma_operand_sources(insns) if program.dialect == "sass" else None, "set")
    _control(add, program, cfg, insns, loops, hot, role_branches)
    _sequence(add, hot)
    _numerics(add, insns, program)
    _machine(add, program, insns, hot, ctx)
    loop_info = [{"name": w.name, "depth": w.depth, "body": len(w.body), "prologue": len(w.prologue),
                  "epilogue": len(w.epilogue), "unroll": loop_unroll(w),
                  "role": next((r for r, ws in role_loops.items() if w in ws), None)} for w in loops]
    wg = (next((f.value for f in F if f.key == "roles.warpgroups"), None) or {})
    role_info = [{"name": r.name, "instructions": sum(cfg.blocks[b].end - cfg.blocks[b].start for b in r.blocks),
                  "setmaxnreg": r.setmaxnreg, "warpgroups": wg.get(r.name),
                  "hot_loop": hot[r.name].name if hot.get(r.name) else None}
                 for r in roles] or [{"name": "all", "instructions": len(insns), "setmaxnreg": None,
                                      "warpgroups": None, "hot_loop": hot["all"].name if hot.get("all") else None}]
    return Fingerprint(kernel=program.kernel, dialect=program.dialect, origin=ctx.origin, features=F,
                       roles=role_info, main_role=main_role, loops=loop_info, warnings=warnings,
                       unknown_opcodes=dict(program.unknown), instructions=len(program.instructions))


def _where(role: str, w: WorkLoop | None) -> str:
    loop = f"loop {w.name} (depth {w.depth})" if w else "no loop"
    return loop if role == "all" else f"role {role}, {loop}"


def _launch(add, program: Program, ctx: Context, roles) -> None:
    lr, cb, d = ctx.launch, ctx.cubin, program.directives
    add("launch", "grid", tuple(lr.grid) if lr else None, "cat")
    block = tuple(lr.block) if lr else (tuple(cb.req_threads) if cb and cb.req_threads else d.get("reqntid"))
    add("launch", "block", block, "cat")
    add("launch", "block.max_threads", (tuple(cb.max_threads) if cb and cb.max_threads else d.get("maxntid")), "cat")
    cluster = tuple(lr.cluster) if lr else (tuple(cb.cluster) if cb and cb.cluster else d.get("reqnctapercluster"))
    add("launch", "cluster", cluster, "cat")
    threads = math.prod(block) if block else None
    add("launch", "warpgroups", (threads + 127) // 128 if threads else None, "num")
    add("launch", "roles", sorted(r.name for r in roles) or ["all"], "set")
    add("launch", "roles.registers", {r.name: r.setmaxnreg for r in roles if r.setmaxnreg is not None}, "map")
    ptxas = ctx.ptxas or {}
    regs = (lr.registers_per_thread or None) if lr else None
    regs = regs or (cb.registers if cb else None) or ptxas.get("registers")
    bound = cb.max_threads if cb and cb.max_threads else d.get("maxntid")
    split_threads = threads or (math.prod(bound) if bound else None)  # the launch bound caps the rest side
    add("launch", "roles.warpgroups", role_warpgroups(roles, split_threads, regs) if roles else None, "map")
    smem = lr.static_smem if lr else (cb.static_smem if cb else ptxas.get("static_smem", d.get("shared_bytes")))
    add("launch", "smem.static", smem, "num")
    add("launch", "smem.dynamic", lr.dynamic_smem if lr else None, "num")
    add("launch", "registers", regs, "num")
    occ = None
    if ctx.gpu is not None and threads and regs is not None and smem is not None:
        dyn = lr.dynamic_smem if lr else 0
        occ = occupancy(ctx.gpu, threads, regs, smem + dyn)["warps_per_sm"]
    add("launch", "occupancy.warps_per_sm", occ, "num", where=f"kernel on {ctx.gpu.name}" if ctx.gpu else "kernel")


def role_warpgroups(roles, threads: int | None, regs: int | None) -> dict | None:
    """Warpgroups per role: from the role branch's compare (``warpgroup != 2`` leaves one warpgroup on one
    side and the rest on the other), else from the register budget ``setmaxnreg`` redistributes: with W
    warpgroups launched at R registers, p producer warpgroups at r_p and c = W - p consumers at r_c satisfy
    p * r_p + c * r_c = W * R (jax's matmul: 3 x 168 = 1 x 40 + 2 x 232). ``None`` when neither tells."""
    out = {}
    for r in roles:
        n = r.warpgroups(threads)
        if n is not None:
            out[r.name] = out.get(r.name, 0) + n
    if len(out) == len(roles):
        return out if not threads or sum(out.values()) == threads // 128 else None
    budgets = {r.name: r.setmaxnreg for r in roles}
    if threads and threads % 128 == 0 and threads // 128 == len(roles) and None not in budgets.values():
        # setmaxnreg is warpgroup-collective: each role that runs it holds at least one whole warpgroup
        return {r.name: 1 for r in roles}
    if not threads or threads % 128 or not regs or len(roles) != 2 or None in budgets.values():
        return None
    (a, ra), (b, rb) = budgets.items()
    w = threads // 128
    if ra == rb:
        return None
    na = w * (rb - regs) / (rb - ra)  # na * ra + (w - na) * rb = w * regs
    if na != int(na) or not 0 < na < w:
        return None
    return {a: int(na), b: w - int(na)}


def tcgen05_facts(insns) -> tuple[set, set, set]:
    """What the tcgen05 era adds (sm_100): where each MMA accumulates (``registers`` for mma.sync / wgmma,
    ``tmem`` for tcgen05), the CTAs each MMA spans (1; 2 for a tcgen05 CTA pair: SASS ``.2CTA``, PTX
    ``cta_group::2``) and the tensor-memory operations (:data:`_TMEM_OPS_SASS` / the PTX ``tcgen05.<op>``)."""
    acc, groups, ops = set(), set(), set()
    for i in insns:
        if i.opclass == "mma":
            form = _mma_info(i)[0]
            acc.add("tmem" if form == "tcgen05" else "registers")
            # one CTA per mma.sync / wgmma; a tcgen05 MMA may be issued for a CTA pair
            groups.add(2 if form == "tcgen05" and ("2CTA" in i.mods or "cta_group::2" in i.mods) else 1)
        if i.opcode == "tcgen05" and i.mods and i.mods[0].split("::")[0] in _TMEM_OPS_PTX:
            ops.add(_TMEM_OPS_PTX[i.mods[0].split("::")[0]])
        elif i.opcode in _TMEM_OPS_SASS:
            op = _TMEM_OPS_SASS[i.opcode]
            ops.add(op(i.mods) if callable(op) else op)
    return acc, groups, ops


def _instruction(add, insns, hot) -> None:
    forms, shapes, types = set(), set(), set()
    for i in insns:
        if i.opclass == "mma":
            f, s, t = _mma_info(i)
            forms.add(f)
            if s:
                shapes.add(s)
            types.update(t)
    add("instruction", "mma.form", sorted(forms), "set")
    add("instruction", "mma.shape", sorted(shapes), "set")
    add("instruction", "mma.types", sorted(types), "set")
    acc, groups, tmem_ops = tcgen05_facts(insns)
    add("instruction", "mma.accumulator", sorted(acc), "set")
    add("instruction", "mma.cta_group", sorted(groups), "set")
    add("instruction", "tmem.ops", sorted(tmem_ops), "set")
    classes = {i.opclass for i in insns}
    forms = {v for k, v in _TRANSFER.items() if k in classes}
    for plain in _PLAIN_LOADS:
        if forms - set(_PLAIN_LOADS) and not any(i.opclass == plain for w in hot.values() if w for i in w.body):
            # tiles arrive by TMA / bulk / cp.async; plain loads outside the hot loops fetch scalars (CUTLASS's
            # epilogue reads alpha and beta through pointers), not tiles
            forms.discard(plain)
    add("instruction", "transfer.form", sorted(forms), "set")
    stores = {v for k, v in _STORE.items() if k in classes and k != "atomic"}
    if any(i.opclass == "atomic" and i.opcode != "ATOMS" and not any(m.startswith("shared") for m in i.mods)
           for i in insns):
        stores.add("atomic")  # global atomics and reductions; shared-memory ones (ATOMS) are no result store
    add("instruction", "transfer.store_form", sorted(stores), "set")
    barriers = sorted(c for c in _BARRIERS if c in classes)
    if "commit" in tmem_ops:
        barriers.append("tcgen05.commit")  # the MMA pipe arrives on an mbarrier when its MMAs complete
    add("instruction", "barrier.ops", barriers, "set")
    for space, ld, st in (("global", "ld.global", "st.global"), ("generic", "ld.generic", "st.generic"),
                          ("shared", "ld.shared", "st.shared")):
        add("instruction", f"access.{space}.load_width",
            sorted({access_width(i) for i in insns if i.opclass == ld or (space == "shared" and i.opclass == "ldsm")}),
            "set")
        add("instruction", f"access.{space}.store_width", sorted({access_width(i) for i in insns if i.opclass == st}),
            "set")
    add("instruction", "access.async_copy_width", sorted({access_width(i) for i in insns if i.opclass == "cp.async"}),
        "set")
    for role, w in hot.items():
        if w is None:
            continue
        counts = class_counts(w.body)
        u = loop_unroll(w)
        mix = {c: round(counts[c] / u, 2) for c in CRITICAL if counts.get(c) and c not in ("fp32.add", "fp32.mul",
                                                                                           "fp32.fma", "cvt")}
        add("instruction", "hot_loop.mix", mix, "map", role, _where(role, w))


def _nctaid_regs(program: Program, in_loop: set | None = None) -> set[str]:
    """Registers holding the grid size, and (outside the loops ``in_loop`` holds: straight-line code) what is
    computed from it there (CUTLASS's PTX: ``stride = nctaid.x * nctaid.y * nctaid.z`` before its tile loop)."""
    regs: set[str] = set()
    for i in program.instructions:
        ops = i.operands
        if len(ops) < 2:
            continue
        if any(o in _NCTAID_SASS or o.startswith("%nctaid") for o in ops[1:]):
            regs.add(ops[0])
        elif regs and in_loop is not None and i.index not in in_loop and \
                any(o.removesuffix(".reuse") in regs for o in ops[1:]):
            regs.add(ops[0])
    return regs


_CTAID_READS = {"S2R", "S2UR", "CS2R", "mov"}
_CTAID_RE = re.compile(r"SR_CTAID\.[XYZ]|%ctaid\.[xyz]")
_COMBINE = {"IMAD", "UIMAD", "IADD3", "UIADD3", "LEA", "ULEA", "IMAD.WIDE", "VIADD", "UVIADD", "mad", "add", "IADD"}


def is_persistent(program: Program, loops) -> bool:
    """A CTA loops over work units strided by the grid: a work loop reads the grid size (``nctaid``; a
    grid-stride loop, CUTLASS/CuTe tile schedulers), or combines the block index with a counter the loop
    steps (``tile = ctaid + step * 132``: jax's Pallas matmul bakes the SM count into the stride)."""
    if not loops:
        return False
    in_loop = {i.index for w in loops for i in w.body}
    grid_regs = _nctaid_regs(program, in_loop)
    reads = [i for i in program.instructions
             if i.opcode in _CTAID_READS and any(_CTAID_RE.search(o) for o in i.operands[1:])]
    if reads:
        writes: dict[str, int] = {}
        for i in program.instructions:
            if i.operands:
                writes[i.operands[0]] = writes.get(i.operands[0], 0) + 1
    for w in loops:
        counters = stepped_counters(w.body)
        own = {i.index for i in w.body}
        # the block index: read in this loop (jax re-reads SR_CTAID.X each tile), or read once outside and
        # never written again (a register reused as a counter later is no block index)
        ctaid = {i.operands[0] for i in reads if i.index in own or writes.get(i.operands[0]) == 1}
        for i in w.body:
            srcs = [o.removesuffix(".reuse") for o in i.operands[1:]]
            if any(o in grid_regs or o in _NCTAID_SASS or o.startswith("%nctaid") for o in srcs):
                return True
            if i.opcode in _COMBINE and ctaid:
                blocks = {o for o in srcs if o in ctaid}
                if blocks and any(o in counters and o not in blocks for o in srcs):
                    return True
    return False


def _control(add, program, cfg, insns, loops, hot, role_branches) -> None:
    add("control", "persistent", is_persistent(program, loops), "cat")
    add("control", "warp_role_branches", role_branches, "num")
    add("control", "loops.depth", max((w.depth for w in loops), default=0), "num")
    for role, w in hot.items():
        if w is None:
            continue
        add("control", "loop.unroll", loop_unroll(w), "num", role, _where(role, w))
    # pipeline depth: the rules of ``stages`` on the role's hot loop (S3 on the loop that issues async-copy
    # groups); the wait depth is the immediate of the steady-state wait.
    for role, w in hot.items():
        issuing = [x for x in loops if any(i.opclass in ("cp.async.commit", "mbar.arrive.tx") for i in x.body)]
        if role != "all":
            issuing = [x for x in issuing if x is w or x.header == (w.header if w else -1)] or \
                [x for x in issuing if w and x.depth >= 1 and x in loops and x is w]
        target = w if w in issuing else (max(issuing, key=lambda x: len(x.body)) if issuing and role == "all"
                                         else None)
        stages, rule = pipeline_stages(w, target, insns)
        wait = None
        if target is not None:
            waits = [i for i in target.body if i.opclass == "cp.async.wait"]
            imms = []
            for i in waits:
                for o in i.operands[1:] if i.opcode == "DEPBAR" else i.operands:
                    if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", o):
                        imms.append(int(o, 0))
            wait = max(imms) if imms else None
        where = _where(role, w if rule and not rule.startswith("S3") else target)
        add("control", "pipeline.stages", stages, "num", role, f"{where} [{rule}]" if rule else where)
        add("control", "pipeline.wait_depth", wait, "num", role, _where(role, target))
    main = max((w for w in hot.values() if w), key=lambda w: len(w.body), default=None)
    if main is not None:
        epi = {v for k, v in _STORE.items() if any(i.opclass == k for i in main.epilogue)}
        if any(i.opclass == "st.shared" for i in main.epilogue) and "tma" in epi:
            epi = (epi - {"tma"}) | {"smem+tma"}
        add("control", "epilogue.form", sorted(epi) or ["none"], "set", where=f"after loop {main.name}")


def _sequence(add, hot) -> None:
    for role, w in hot.items():
        if w is None:
            continue
        seq = reduce_sequence([i.opclass for i in w.body if i.opclass in CRITICAL])
        add("sequence", "hot_loop.order", seq, "seq", role, _where(role, w))


def _defs_before(insns, idx, reg, window=12):
    for j in range(idx - 1, max(-1, idx - window - 1), -1):
        if insns[j].operands and insns[j].operands[0] == reg:
            return insns[j]
    return None


def _integer_reciprocal(insns, n: int) -> bool:
    """``MUFU.RCP`` of a divisor converted from an integer (``I2F.U32.RP R0, R5; MUFU.RCP R0, R0``): ptxas's
    integer division / remainder by a run-time value, which is no floating-point divide."""
    src = insns[n].operands[1].lstrip("-|").removesuffix(".reuse") if len(insns[n].operands) > 1 else ""
    d = _defs_before(insns, n, src, 64)  # ptxas may schedule the conversion far ahead of the reciprocal
    return d is not None and d.opcode == "I2F"


_FP32 = frozenset(("fp32.fma", "fp32.add", "fp32.mul"))
_NO_MODS: frozenset = frozenset()
_NUMERIC_CLASSES = _FP32 | {"call", "cvt"}
_NUMERIC_OPCODES = frozenset(("MUFU", "FCHK", "div", "rcp", "ex2"))
_IEEE_DIV_CALL = re.compile(r"(div|rcp)_rn")


def f32_or_64(mods) -> bool:
    return "f32" in mods or "f64" in mods


def _numerics(add, insns, program) -> None:
    fused = unfused = 0
    exp_forms, div_forms, cvts = set(), set(), set()
    seeded: set[str] = set()
    calls = [program.labels[t] for i in insns if i.opclass == "call" for t in i.targets if t in program.labels]
    sub_start = min(calls, default=len(program.instructions))
    ftz = noftz = 0
    for n, i in enumerate(insns):
        c = i.opclass
        if not seeded and c not in _NUMERIC_CLASSES and i.opcode not in _NUMERIC_OPCODES:
            continue  # nothing below looks at it (every branch needs one of these classes or opcodes)
        mods_u = {m.upper() for m in i.mods} if i.mods and (c in _FP32 or c == "cvt") else _NO_MODS
        if c == "fp32.fma" and not (mods_u & {"RM", "RP", "SAT"}):
            fused += 1
        if c == "fp32.add" and len(i.operands) >= 3:
            for src in i.operands[1:3]:
                d = _defs_before(insns, n, src.lstrip("-|"), 8)
                if d is not None and d.opclass == "fp32.mul":
                    unfused += 1
                    break
        plain = c in _FP32 and i.index < sub_start
        if plain and c == "fp32.add":
            plain = "RZ" not in i.operands and "-RZ" not in i.operands
        if plain and seeded:
            plain = not any(o.lstrip("-|").removesuffix(".reuse") in seeded for o in i.operands[1:])
        if plain:
            # ptxas's own refinement of a MUFU result (the IEEE sqrt/divide fast paths use FMUL.FTZ), its
            # negations (FADD.FTZ R0, -R0, -RZ) and the slow-path subroutines say nothing about the kernel's
            # denormal mode
            if "FTZ" in mods_u:
                ftz += 1
            else:
                noftz += 1
        if i.opcode == "MUFU" and i.operands:
            seeded.add(i.operands[0])
        elif seeded and i.operands and i.operands[0] in seeded:
            seeded.discard(i.operands[0])  # overwritten
        is_ex2 = (i.opcode == "MUFU" and "EX2" in i.mods) or i.opcode == "ex2"
        if is_ex2:
            window = insns[max(0, n - 24):n]  # unrolled expf interleaves its range reductions
            precise = any({m.upper() for m in x.mods} & {"RM"} and x.opclass == "fp32.fma" for x in window)
            exp_forms.add("precise" if precise else "approx")
        callee = " ".join(i.targets) if c == "call" else ""
        if i.opcode == "FCHK" or (i.opcode == "div" and "rn" in i.mods and f32_or_64(i.mods)) or \
                (i.opcode == "rcp" and "rn" in i.mods) or _IEEE_DIV_CALL.search(callee) or \
                (i.opcode == "MUFU" and "RCP64H" in i.mods):
            div_forms.add("ieee")  # checked Newton (FCHK), the div_rn / rcp_rn slow-path subroutines, FP64
        elif (i.opcode == "MUFU" and "RCP" in i.mods and not _integer_reciprocal(insns, n)) or \
                (i.opcode == "div" and ("approx" in i.mods or "full" in i.mods)) or (i.opcode == "rcp" and "approx" in i.mods):
            div_forms.add("approx")
        if c == "cvt" and i.opcode not in ("FRND",):
            cvts.add(i.full if program.dialect == "sass" else ".".join(m for m in (i.opcode, *i.mods)))
    if "ieee" in div_forms and program.dialect == "sass":
        div_forms.discard("approx")  # the IEEE path seeds its Newton iteration with MUFU.RCP
    contraction = "fused" if fused and not unfused else "unfused" if unfused and not fused else \
        "mixed" if fused and unfused else "none"
    add("numerics", "fma.contraction", contraction, "cat")
    add("numerics", "exp.form", sorted(exp_forms), "set")
    add("numerics", "div.form", sorted(div_forms), "set")
    add("numerics", "conversion.modes", sorted(cvts), "set")
    flush = "ftz" if ftz and not noftz else "ieee" if noftz and not ftz else "mixed" if ftz and noftz else "none"
    add("numerics", "denormal.flush", flush, "cat")


def _machine(add, program, insns, hot, ctx: Context) -> None:
    sass = program.dialect == "sass"
    for role, w in hot.items():
        if w is None:
            continue
        add("machine", "hot_loop.length", len(w.body) if sass else None, "num", role, _where(role, w))
    # the whole kernel's reachable machine code: a fully unrolled body with inline range reductions (an exact
    # expf per element) is long even where no loop is left to measure
    add("machine", "code.length", len(insns) if sass else None, "num")
    spills: dict[str, int] = {}
    if sass:
        spills["local_instructions"] = sum(1 for i in insns if i.opclass in ("ld.local", "st.local"))
    if ctx.ptxas:
        for k in ("spill_store_bytes", "spill_load_bytes"):
            if k in ctx.ptxas:
                spills[k] = ctx.ptxas[k]
    add("machine", "spills", spills or None, "map")
    frame = (ctx.ptxas or {}).get("stack_frame")
    if frame is None and ctx.cubin is not None:
        frame = ctx.cubin.frame_size
    add("machine", "stack_frame", frame, "num")
    m = ctx.metrics
    add("machine", "stalls.top", stall_top(m) if m else None, "seq")
    for key, names in METRICS.items():
        add("machine", key, metric(m, names) if m else None, "num")
