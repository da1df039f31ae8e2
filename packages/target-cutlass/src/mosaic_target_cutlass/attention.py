"""Attention forward for Hopper (sm_90a) in CuTe C++ (``templates/attention_sm90.cuh``): the knob class, the rules
that decide whether a knob combination can be built (data: each rule a code, the knobs it reads, its reason and its
predicate), the budget estimates they use, and the translation unit it renders to (``templates/attention_sm90.cu``).

``o = softmax(q k^T / sqrt(head_dim) [causal]) v`` per (batch, head), bf16/f16 in, fp32 accumulate and softmax,
same-type out, grouped-query heads, in the family's layout (:mod:`mosaic.families.attention`). One CTA per (query
block, head, batch): a producer warpgroup (one thread issues TMA: Q once, K and V blocks into two ``stages``-deep
mbarrier rings) and ``consumer_warpgroups`` consumer warpgroups (``block_m / consumer_warpgroups`` rows each):
S = Q K^T by wgmma from shared memory, online softmax in registers with exp2 and the log2(e) fold, O += P V by a
second wgmma whose A operand P is read from registers (``p_in='registers'``) or staged through shared memory
(``'smem'``). The template's header comment gives the protocol.

Compile-time: the element type, ``head_dim`` and ``causal`` (from the problem) and every knob; run-time: batch,
seq, heads and kv_heads (one build serves every such shape). Any ``seq``: the tail block is masked, its loads
zero-filled by TMA, its stores predicated.

It lowers with no GPU (PTX, cubin, SASS, ptxas resources) and its fragment maps are checked on the host
(:func:`fragment_check`). Its numerics were verified on an H100 on 2026-12-07 by ``tools/attention_selfcheck.sh --run``
(the template compiled into a stand-alone program: 5 problems over 4 configurations against a float64 reference, all
pass). The device runner (``backend.AttentionRunnable``: the build's shim allocates, copies and launches, as the GEMM's
does) takes the inputs :data:`INPUT_RULES` accept; it has not run on a GPU yet (``tools/attention_capture_check.sh``).
"""

from __future__ import annotations

from importlib import resources

import attrs
import numpy as np
from mosaic import budget as fit
from mosaic.errors import Diagnostic
from mosaic.fields import fail, one_of
from mosaic.records import GpuTarget, KernelSpec

from mosaic_target_cutlass.gemm import ELEMENTS, _in, _int

HEAD_DIMS = (64, 128)
ARCHES = ("sm_90a",)
ROWS_PER_WARPGROUP = (64, 128)  # one or two 64-row wgmma atoms per consumer warpgroup
#: registers per thread: the launch bound with one consumer warpgroup (256 threads), setmaxnreg's grant with two
CONSUMER_REGS = {1: 255, 2: 240}
PRODUCER_REGS = 24  # setmaxnreg.dec of the producer warpgroup (two consumer warpgroups)
#: registers a consumer thread needs besides its S, O and P fragments (addresses, loop state, row statistics, mask
#: coordinates): a working margin, not a measurement; ptxas's spill report on the lowering is the truth
CONSUMER_OVERHEAD_REGS = 24
SMEM_ALIGN = 1024  # the swizzled tiles start on 1 KiB boundaries; the launch asks 1 KiB more to align its base
GRID_LIMIT = 65535  # heads and batch are the grid's y and z


def _bool(value):
    """Knobs arrive as strings from the command line (``--knob causal_skip=false``)."""
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    return value


def _block_n(inst, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or not (16 <= value <= 256) or value % 16:
        fail(inst, attribute, value, "a multiple of 16 from 16 to 256 (the wgmma N of S, the K of P V)")


def _is_bool(inst, attribute, value):
    if not isinstance(value, bool):
        fail(inst, attribute, value, "true or false")


@attrs.frozen
class AttentionKnobs:
    """Knobs of the CUTLASS (CuTe C++) Hopper attention forward. Every field is validated at construction; the
    combinations and the fit on the GPU by :data:`RULES`.

    ``block_m`` query rows per CTA, ``block_n`` keys per block; ``stages`` K and V slots each in shared memory;
    ``consumer_warpgroups`` (1 or 2) share the ``block_m`` rows, 64 or 128 each (two: the producer's registers are cut
    to 24 and the consumers' raised to 240 by setmaxnreg); ``causal_skip`` (causal problems; no effect otherwise):
    visit only the key blocks at or below the diagonal, else visit all and mask; ``p_in``: the P V wgmma reads P from
    registers (RS) or from a shared-memory tile the consumers store it to (SS).
    """

    block_m: int = attrs.field(default=128, converter=_int, validator=_in(64, 128, 256),
                               metadata={"interacts": ("consumer_warpgroups",)})
    block_n: int = attrs.field(default=128, converter=_int, validator=_block_n,
                               metadata={"values": (128, 64, 96, 160, 192, 176, 112, 256)})
    stages: int = attrs.field(default=2, converter=_int, validator=_in(1, 2, 3, 4, 5, 6))
    consumer_warpgroups: int = attrs.field(default=2, converter=_int, validator=_in(1, 2),
                                           metadata={"interacts": ("block_m",)})
    causal_skip: bool = attrs.field(default=True, converter=_bool, validator=_is_bool)
    p_in: str = attrs.field(default="registers", validator=one_of("registers", "smem"),
                            metadata={"values": ("registers", "smem")})

    @property
    def rows_per_warpgroup(self) -> int:
        return self.block_m // self.consumer_warpgroups

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumer_warpgroups)

    @property
    def label(self) -> str:
        return (f"attn-{self.block_m}x{self.block_n}-s{self.stages}-wg{self.consumer_warpgroups}"
                f"-{'skip' if self.causal_skip else 'noskip'}-p{self.p_in}")


# -- the problem as the template sees it ------------------------------------------------------------------------

def problem(spec: KernelSpec) -> dict:
    """batch, seq, heads, kv_heads, head_dim and causal of the spec (kv_heads defaults to heads, causal to 0)."""
    s = spec.shape
    out = {k: s.get(k) for k in ("batch", "seq", "heads", "head_dim")}
    out["kv_heads"] = s.get("kv_heads", s.get("heads"))
    out["causal"] = int(s.get("causal", 0))
    return out


def smem_bytes(knobs: AttentionKnobs, head_dim: int, elem_bytes: int = 2) -> int:
    """Dynamic shared memory one CTA asks: Q (``block_m x head_dim``), ``stages`` K and V tiles (``block_n x
    head_dim``), the P tile when staged (``block_m x block_n``), the mbarriers (padded to the tiles' 1 KiB alignment)
    and 1 KiB to align the base. This is the template's ``Cfg::SmemBytes`` (the build's reported figure is checked
    against the GPU again after lowering)."""
    q = knobs.block_m * head_dim
    kv = 2 * knobs.stages * knobs.block_n * head_dim
    p = knobs.block_m * knobs.block_n if knobs.p_in == "smem" else 0
    barriers = SMEM_ALIGN  # 8 + 32 * stages bytes, padded
    return (q + kv + p) * elem_bytes + barriers + SMEM_ALIGN


def consumer_registers(knobs: AttentionKnobs, head_dim: int) -> dict:
    """32-bit registers a consumer thread holds live through a key block: the fp32 S and O fragments of its
    warpgroup's rows over 128 threads, P packed two 16-bit values to a register when it stays in registers, plus
    :data:`CONSUMER_OVERHEAD_REGS`; and the limit (:data:`CONSUMER_REGS`)."""
    rows = knobs.rows_per_warpgroup
    s = rows * knobs.block_n // 128
    o = rows * head_dim // 128
    p = rows * knobs.block_n // 256 if knobs.p_in == "registers" else 0
    total = s + o + p + CONSUMER_OVERHEAD_REGS
    return {"S": s, "O": o, "P": p, "other": CONSUMER_OVERHEAD_REGS, "total": total,
            "limit": CONSUMER_REGS[knobs.consumer_warpgroups]}


# -- rules as data: (code, the knobs and problem fields it reads, its reason, the predicate) -------------------------

@attrs.frozen
class Rule:
    code: str
    fields: tuple
    reason: str
    check: object  # (knobs, spec, gpu) -> iterable of Diagnostic


def _arch(k, spec, gpu):
    if gpu.arch not in ARCHES:
        yield Diagnostic("CUTLASS-ATT-ARCH", "gpu", " or ".join(ARCHES), gpu.arch,
                         "the attention template issues wgmma, TMA and setmaxnreg: Hopper (sm_90a) only")


def _dtype(k, spec, gpu):
    if spec.dtype not in ELEMENTS:
        yield Diagnostic("CUTLASS-DTYPE", "dtype", sorted(ELEMENTS), spec.dtype,
                         "the attention template takes 16-bit inputs (fp32 accumulate)")


def _shape(k, spec, gpu):
    pr = problem(spec)
    missing = [d for d in ("batch", "seq", "heads", "head_dim") if pr[d] is None]
    for d in missing:
        yield Diagnostic("CUTLASS-ATT-SHAPE", f"shape.{d}", "present", None,
                         "attention needs batch, seq, heads, head_dim")
    if missing:
        return
    for d in ("batch", "seq", "heads", "kv_heads"):
        if pr[d] < 1:
            yield Diagnostic("CUTLASS-ATT-SHAPE", f"shape.{d}", ">= 1", pr[d], f"{d} must be positive")
            return
    if pr["heads"] % pr["kv_heads"]:
        yield Diagnostic("CUTLASS-ATT-SHAPE", "shape.kv_heads", f"a divisor of heads={pr['heads']}", pr["kv_heads"],
                         "grouped-query heads: heads must be a multiple of kv_heads")


def _grid(k, spec, gpu):
    pr = problem(spec)
    for d in ("batch", "heads"):
        if pr[d] is not None and pr[d] > GRID_LIMIT:
            yield Diagnostic("CUTLASS-ATT-GRID", f"shape.{d}", f"<= {GRID_LIMIT}", pr[d],
                             f"{d} is a grid dimension of the launch (one CTA per query block, head, batch)")


def _head_dim(k, spec, gpu):
    d = spec.shape.get("head_dim")
    if d is not None and d not in HEAD_DIMS:
        yield Diagnostic("CUTLASS-ATT-HEAD-DIM", "shape.head_dim", " or ".join(map(str, HEAD_DIMS)), d,
                         "the template's Q/K/V tiles are 128-byte swizzled and head_dim is the N of the P V wgmma: "
                         "64 or 128")


def _rows(k, spec, gpu):
    if k.block_m % k.consumer_warpgroups or k.rows_per_warpgroup not in ROWS_PER_WARPGROUP:
        yield Diagnostic("CUTLASS-ATT-ROWS", "block_m", f"{' or '.join(str(r * k.consumer_warpgroups) for r in ROWS_PER_WARPGROUP)} "
                         f"(consumer_warpgroups={k.consumer_warpgroups})", k.block_m,
                         "each consumer warpgroup takes 64 or 128 query rows (one or two 64-row wgmma atoms)")


def _p_smem_tile(k, spec, gpu):
    if k.p_in == "smem" and k.block_n % 64:
        yield Diagnostic("CUTLASS-ATT-P-SMEM", "block_n", "a multiple of 64 with p_in='smem'", k.block_n,
                         "the staged P tile is 128-byte swizzled (64 16-bit columns per swizzle atom)")


def _smem(k, spec, gpu):
    d = spec.shape.get("head_dim")
    if d not in HEAD_DIMS or spec.dtype not in ELEMENTS:
        return
    need = smem_bytes(k, d)
    for x in fit.diagnose(fit.Footprint(where="attention tiles", smem_bytes=need), gpu, ("smem-per-block",)):
        yield attrs.evolve(x, code="CUTLASS-SMEM", expected=f"<= {gpu.smem_per_block} bytes of shared memory",
                           message=f"Q {k.block_m}x{d} + {k.stages} stages x (K + V) {k.block_n}x{d}"
                                   + (f" + P {k.block_m}x{k.block_n}" if k.p_in == "smem" else "")
                                   + f" = {need} B exceed {gpu.name}'s {gpu.smem_per_block} B per block")


def _registers(k, spec, gpu):
    d = spec.shape.get("head_dim")
    if d not in HEAD_DIMS or k.rows_per_warpgroup not in ROWS_PER_WARPGROUP:
        return
    need = consumer_registers(k, d)
    limit = min(need["limit"], gpu.max_regs_per_thread)
    if need["total"] > limit:
        yield Diagnostic("CUTLASS-ATT-ACC-REGS", "block_n", f"<= {limit} registers per consumer thread",
                         need["total"],
                         f"S {need['S']} + O {need['O']} + P {need['P']} + {need['other']} registers per consumer thread "
                         f"({k.rows_per_warpgroup} rows per warpgroup, block_n {k.block_n}, head_dim {d}) exceed "
                         f"{limit}: the fragments would spill inside the key loop")


def _register_split(k, spec, gpu):
    if k.consumer_warpgroups == 2:
        need = 128 * (PRODUCER_REGS + 2 * CONSUMER_REGS[2])
        if need > gpu.regs_per_sm:
            yield Diagnostic("CUTLASS-ATT-REG-SPLIT", "consumer_warpgroups", f"<= {gpu.regs_per_sm}", need,
                             f"the setmaxnreg split 128 x ({PRODUCER_REGS} + 2 x {CONSUMER_REGS[2]}) exceeds "
                             f"{gpu.name}'s {gpu.regs_per_sm} registers per SM")


RULES = (
    Rule("CUTLASS-ATT-ARCH", ("gpu",), "wgmma/TMA/setmaxnreg: sm_90a only", _arch),
    Rule("CUTLASS-DTYPE", ("dtype",), "16-bit inputs", _dtype),
    Rule("CUTLASS-ATT-SHAPE", ("shape",), "batch, seq, heads, head_dim present; kv_heads divides heads", _shape),
    Rule("CUTLASS-ATT-GRID", ("shape.batch", "shape.heads"), "heads and batch fit the grid's y and z", _grid),
    Rule("CUTLASS-ATT-HEAD-DIM", ("shape.head_dim",), "head_dim 64 or 128", _head_dim),
    Rule("CUTLASS-ATT-ROWS", ("block_m", "consumer_warpgroups"), "64 or 128 rows per consumer warpgroup", _rows),
    Rule("CUTLASS-ATT-P-SMEM", ("p_in", "block_n"), "a staged P tile needs block_n % 64 == 0", _p_smem_tile),
    Rule("CUTLASS-SMEM", ("block_m", "block_n", "stages", "p_in", "shape.head_dim"), "the tiles fit shared memory",
         _smem),
    Rule("CUTLASS-ATT-ACC-REGS", ("block_m", "block_n", "consumer_warpgroups", "p_in", "shape.head_dim"),
         "S + O + P fragments fit a consumer thread's registers", _registers),
    Rule("CUTLASS-ATT-REG-SPLIT", ("consumer_warpgroups",), "the setmaxnreg split fits the register file",
         _register_split),
)


def problems(knobs: AttentionKnobs, spec: KernelSpec, gpu: GpuTarget) -> list[Diagnostic]:
    return [d for rule in RULES for d in rule.check(knobs, spec, gpu)]


# -- the device runner's inputs, rules as data too: each check (spec, inputs) -> iterable of Diagnostic -------------

def input_shapes(spec: KernelSpec) -> dict[str, tuple]:
    """The arrays the runner takes, in the family's layout: q (batch, heads, seq, head_dim), k and v (batch, kv_heads,
    seq, head_dim) (:mod:`mosaic.families.attention`); ``o`` comes back shaped like q."""
    pr = problem(spec)
    kv = (pr["batch"], pr["kv_heads"], pr["seq"], pr["head_dim"])
    return {"q": (pr["batch"], pr["heads"], pr["seq"], pr["head_dim"]), "k": kv, "v": kv}


def _input_names(spec, inputs):
    want = input_shapes(spec)
    for name in sorted(set(inputs) - {*want, "causal"}):
        yield Diagnostic("CUTLASS-ATT-INPUT", f"inputs.{name}", "q, k, v (and causal)", name,
                         "not an input of the attention forward")
    for name in want:
        if name not in inputs:
            yield Diagnostic("CUTLASS-ATT-INPUT", f"inputs.{name}", "present", None, "q, k and v are all needed")


def _input_shapes(spec, inputs):
    for name, want in input_shapes(spec).items():
        if name in inputs and tuple(np.shape(inputs[name])) != want:
            yield Diagnostic("CUTLASS-ATT-INPUT-SHAPE", f"inputs.{name}", want, tuple(np.shape(inputs[name])),
                             "the family's layout: q (batch, heads, seq, head_dim), k and v (batch, kv_heads, seq, "
                             "head_dim), from the problem's shape")


def _input_causal(spec, inputs):
    if "causal" in inputs:
        flag = np.asarray(inputs["causal"])
        if flag.shape != () or bool(flag) != bool(problem(spec)["causal"]):
            yield Diagnostic("CUTLASS-ATT-INPUT-CAUSAL", "inputs.causal", bool(problem(spec)["causal"]),
                             flag.tolist(), "the inputs' causal flag must be the problem's (shape causal=1 or "
                             "absent): the build's mask is compile-time")


INPUT_RULES = (
    Rule("CUTLASS-ATT-INPUT", ("inputs",), "q, k, v present, nothing else but causal", _input_names),
    Rule("CUTLASS-ATT-INPUT-SHAPE", ("inputs", "shape"), "q, k, v shaped as the problem says", _input_shapes),
    Rule("CUTLASS-ATT-INPUT-CAUSAL", ("inputs.causal", "shape.causal"), "causal agrees with the problem",
         _input_causal),
)


def input_problems(spec: KernelSpec, inputs) -> list[Diagnostic]:
    """Every problem of ``inputs`` for the runner of ``spec`` (:data:`INPUT_RULES`, all run)."""
    return [d for rule in INPUT_RULES for d in rule.check(spec, inputs)]


def can_implement(knobs: AttentionKnobs, spec: KernelSpec, gpu: GpuTarget) -> list[Diagnostic]:
    """The plugin's CPU predicate (no nvcc): every rule of :data:`RULES`."""
    return problems(knobs, spec, gpu)


def key_blocks(knobs: AttentionKnobs, m_block: int, seq: int, causal: bool) -> tuple[int, int]:
    """(first masked key block, key blocks visited) of query block ``m_block``: the template's ``key_blocks`` rule
    in Python (tests compare the two through the build's ``mosaic_key_blocks``)."""
    bm, bn = knobs.block_m, knobs.block_n
    total = -(-seq // bn)
    if causal:
        visited = -(-min((m_block + 1) * bm, seq) // bn) if knobs.causal_skip else total
        return min(m_block * bm // bn, visited), visited
    return (total - 1 if seq % bn else total), total


def render(knobs: AttentionKnobs, spec: KernelSpec) -> str:
    """The CUDA C++ translation unit (the kernel header inlined, one configuration, the host shim)."""
    files = resources.files("mosaic_target_cutlass").joinpath("templates")
    kernel = files.joinpath("attention_sm90.cuh").read_text().replace("#pragma once\n", "", 1)
    text = files.joinpath("attention_sm90.cu").read_text()
    pr = problem(spec)
    values = {
        "ELEMENT": ELEMENTS[spec.dtype], "HEAD_DIM": pr["head_dim"], "BLOCK_M": knobs.block_m,
        "BLOCK_N": knobs.block_n, "STAGES": knobs.stages, "CONSUMER_WGS": knobs.consumer_warpgroups,
        "CAUSAL": "true" if pr["causal"] else "false", "CAUSAL_SKIP": "true" if knobs.causal_skip else "false",
        "P_IN_REGS": "true" if knobs.p_in == "registers" else "false",
    }
    for key, val in values.items():
        text = text.replace("{{" + key + "}}", str(val))
    text = text.replace("{{KERNEL}}", kernel)
    header = "// knobs: " + ", ".join(f"{a.name}={getattr(knobs, a.name)}" for a in attrs.fields(AttentionKnobs))
    return f"// dtype: {spec.dtype}, head_dim: {pr['head_dim']}, causal: {pr['causal']}\n{header}\n{text}"


def kv_index(batch: int, head: int, heads: int, kv_heads: int) -> int:
    """The key/value L index query head ``head`` of ``batch`` reads: the template's ``kv_index`` in Python."""
    return batch * kv_heads + head // (heads // kv_heads)


#: a child's script: the host-side fragment-map check, the key-block rule, the GQA map and the launch grids of a build
#: (argv[1]: the library, argv[2]: JSON {"blocks": [[m_block, seq], ...], "heads": [[batch, head, heads, kv_heads],
#: ...], "grids": [[batch, seq, heads], ...]}), as JSON
CHECK_SCRIPT = ("import ctypes, json, sys\n"
                "lib = ctypes.CDLL(sys.argv[1])\n"
                "ask = json.loads(sys.argv[2])\n"
                "out = (ctypes.c_int * 2)()\n"
                "blocks = []\n"
                "for m, s in ask['blocks']:\n"
                "    lib.mosaic_key_blocks(m, s, out)\n"
                "    blocks.append([out[0], out[1]])\n"
                "heads = [lib.mosaic_kv_index(*h) for h in ask['heads']]\n"
                "xyz = (ctypes.c_int * 3)()\n"
                "grids = []\n"
                "for g in ask.get('grids', []):\n"
                "    lib.mosaic_attention_grid(*g, xyz)\n"
                "    grids.append(list(xyz))\n"
                "print(json.dumps({'fragment_violations': lib.mosaic_fragment_check(), 'key_blocks': blocks, "
                "'kv_index': heads, 'grids': grids}))\n")


def fragment_check(library, blocks=(), heads=(), grids=()) -> dict:
    """Run the build's host-side checks in a child process (the library is never loaded here): the number of
    fragment-map violations (``check_fragment_maps`` in the template: 0 when the S, O and P maps agree), the
    template's (masked, visited) key blocks for each ``(m_block, seq)`` of ``blocks``, its kv head index for
    each ``(batch, head, heads, kv_heads)`` of ``heads`` and its launch grid for each ``(batch, seq, heads)`` of
    ``grids`` (the runner's :meth:`~mosaic_target_cutlass.backend.AttentionRunnable.planned_launch` asks the same
    function in its own process)."""
    import json

    from mosaic_target_cutlass.build import run_shim

    ask = {"blocks": [list(c) for c in blocks], "heads": [list(h) for h in heads], "grids": [list(g) for g in grids]}
    return run_shim(library, CHECK_SCRIPT, json.dumps(ask))


def grid(knobs: AttentionKnobs, batch: int, seq: int, heads: int) -> tuple[int, int, int]:
    """The launch grid, one CTA per (query block, head, batch): the template's ``grid_shape`` in Python."""
    return -(-seq // knobs.block_m), heads, batch


# -- knob dependencies (data for the ``knobs`` proposer's compound edits; mosaic.proposers.dependencies) ------------

def _dependencies():
    from mosaic.proposers.dependencies import Dependencies, Dependency

    return Dependencies(check=can_implement, rules=(
        Dependency("CUTLASS-ATT-ROWS", ("block_m", "consumer_warpgroups"),
                   {"consumer_warpgroups": (2, 1), "block_m": (128, 64, 256)},
                   "each consumer warpgroup takes 64 or 128 query rows"),
        Dependency("CUTLASS-ATT-P-SMEM", ("p_in", "block_n"), {"block_n": (128, 64, 192, 256), "p_in": ("registers",)},
                   "a staged P tile needs block_n % 64 == 0"),
        Dependency("CUTLASS-SMEM", ("stages", "block_n", "block_m", "p_in"), {"stages": (2, 1, 3)},
                   "a bigger key block leaves room for fewer stages"),
        Dependency("CUTLASS-ATT-ACC-REGS", ("block_n", "block_m", "consumer_warpgroups", "p_in"),
                   {"consumer_warpgroups": (2,), "block_n": (128, 64, 96), "p_in": ("smem",)},
                   "the S, O and P fragments of a consumer thread must fit its registers"),
    ))


AttentionKnobs.DEPENDENCIES = _dependencies()
