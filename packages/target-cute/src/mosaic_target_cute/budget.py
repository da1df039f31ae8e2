"""Lowering checks against a GpuTarget, through core's rule table (:mod:`mosaic.budget`): every rule runs,
every problem comes back as a Diagnostic worded for a CuTe build; :func:`check` raises Unbuildable carrying
them all."""

from __future__ import annotations

import attrs
from mosaic import budget as rules
from mosaic.backend import Unbuildable
from mosaic.errors import Diagnostic
from mosaic.records import GpuTarget

from mosaic_target_cute.lowering import CuteBuild

#: the rules a CuTe build is checked by (its launch needs no particular SM count)
CODES = ("smem-per-block", "regs-per-thread", "regs-per-block", "threads-per-block", "cluster-size")


def footprint(b: CuteBuild) -> rules.Footprint:
    """What the build asks of one SM: static + dynamic shared memory, registers, threads, cluster."""
    return rules.Footprint(where=b.kernel_name[:60], smem_bytes=b.static_smem + b.dynamic_smem,
                           registers=b.registers, threads=b.threads,
                           cluster_size=b.cluster[0] * b.cluster[1] * b.cluster[2])


def _worded(d: Diagnostic, b: CuteBuild, g: GpuTarget) -> Diagnostic:
    if d.code == "smem-per-block":
        return attrs.evolve(d, message=f"static {b.static_smem} + dynamic {b.dynamic_smem} B exceed {g.name}'s "
                                       "per-block limit")
    if d.code == "regs-per-block":
        return d
    return attrs.evolve(d, message="")  # the expected/actual figures say it all


def diagnose(build: CuteBuild, gpu: GpuTarget) -> list[Diagnostic]:
    return [_worded(d, build, gpu) for d in rules.diagnose(footprint(build), gpu, CODES)]


def check(build: CuteBuild, gpu: GpuTarget) -> None:
    problems = diagnose(build, gpu)
    if problems:
        raise Unbuildable("; ".join(p.line() for p in problems), f"{gpu.name}")


# -- attention -------------------------------------------------------------------------------------------------
#
# Before compiling, a hopper attention configuration is held to rules from the knobs, the problem and the GpuTarget
# record (:func:`attention_diagnose`); after compiling, the build's real figures are held to core's rules and to the
# register pool its setmaxnreg split asks of the launch (:func:`check_attention`). Every rule runs; each problem
# is a Diagnostic whose code names the rule.

#: registers a consumer thread needs besides its accumulators (addresses, loop state, row statistics, masks): a
#: working margin, not a measurement -- ptxas's spill report on the lowering is the truth
CONSUMER_OVERHEAD_REGS = 24
#: bytes besides the tiles: the struct's mbarriers padded to the tiles' 1 KiB alignment, and the 1 KiB of static shared
#: memory the compiled kernels report (their cubin's figure; the lowering checks the real total)
ATTENTION_SMEM_SLACK = 2048


def attention_smem_bytes(knobs, shape, elem_bytes: int = 2) -> int:
    """Shared memory one hopper attention CTA asks: the Q tile (which the O tile overlays), ``stages`` K and V
    tiles, the P tile when ``p_in='smem'``, barriers and alignment (estimated; the compiled kernel's figure is
    checked after lowering)."""
    d = shape.head_dim
    q = knobs.block_m * d
    kv = 2 * knobs.stages * knobs.block_n * d
    p = knobs.block_m * knobs.block_n if knobs.p_in == "smem" else 0
    return (q + kv + p) * elem_bytes + ATTENTION_SMEM_SLACK


def consumer_registers(knobs, shape) -> dict:
    """32-bit registers one consumer thread holds live through a key block: the fp32 S and O accumulators of its
    warpgroup's rows over 128 threads, P packed two 16-bit values a register when it stays in registers, plus
    :data:`CONSUMER_OVERHEAD_REGS`."""
    rows = knobs.rows_per_warpgroup
    s = rows * knobs.block_n // 128
    o = rows * shape.head_dim // 128
    p = rows * knobs.block_n // 256 if knobs.p_in == "registers" else 0
    return {"S": s, "O": o, "P": p, "other": CONSUMER_OVERHEAD_REGS, "total": s + o + p + CONSUMER_OVERHEAD_REGS}


def _attention_smem(knobs, shape, gpu, where):
    need = attention_smem_bytes(knobs, shape)
    d = rules.diagnose(rules.Footprint(where=where, smem_bytes=need), gpu, ("smem-per-block",))
    return [attrs.evolve(x, message=f"Q {knobs.block_m}x{shape.head_dim} + {knobs.stages} stages x (K + V) "
                                    f"{knobs.block_n}x{shape.head_dim}"
                                    + (f" + P {knobs.block_m}x{knobs.block_n}" if knobs.p_in == "smem" else "")
                                    + f" = {need} B exceed {gpu.name}'s per-block limit") for x in d]


def _attention_threads(knobs, shape, gpu, where):
    return rules.diagnose(rules.Footprint(where=where, threads=knobs.threads), gpu, ("threads-per-block",))


def _register_split(knobs, shape, gpu, where):
    """CUTE-REG-SPLIT: the setmaxnreg split must fit the SM's register file (a consumer warpgroup's
    setmaxnreg.inc waits until the pool holds what it asks: a split that cannot fit never starts)."""
    need = 128 * (knobs.producer_regs + knobs.consumer_warpgroups * knobs.consumer_regs)
    if need <= gpu.regs_per_sm:
        return []
    return [Diagnostic("CUTE-REG-SPLIT", where, f"<= {gpu.regs_per_sm}", need,
                       f"128 x ({knobs.producer_regs} producer + {knobs.consumer_warpgroups} x {knobs.consumer_regs} "
                       f"consumer) registers exceed {gpu.name}'s {gpu.regs_per_sm} per SM")]


def _consumer_registers(knobs, shape, gpu, where):
    """CUTE-ACC-REGS: a consumer's accumulators must fit the registers setmaxnreg gives it (and the thread limit),
    else they spill to local memory inside the key loop."""
    need = consumer_registers(knobs, shape)
    limit = min(knobs.consumer_regs, gpu.max_regs_per_thread)
    if need["total"] <= limit:
        return []
    return [Diagnostic("CUTE-ACC-REGS", where, f"<= {limit}", need["total"],
                       f"S {need['S']} + O {need['O']} + P {need['P']} + {need['other']} registers per consumer "
                       f"thread ({knobs.rows_per_warpgroup} rows per warpgroup, block_n {knobs.block_n}, head_dim "
                       f"{shape.head_dim}) exceed consumer_regs={knobs.consumer_regs}")]


#: the architectures the hopper attention's wgmma builds for
ATTENTION_ARCHS = ("sm_90a",)


def _attention_arch(knobs, shape, gpu, where):
    """CUTE-ARCH: the hopper attention issues wgmma, which sm_100a replaced with tcgen05 (the DSL refuses it with
    'expects arch to be sm_90a' deep in cute.compile; this says it before compiling, with what does build)."""
    if gpu.arch in ATTENTION_ARCHS:
        return []
    return [Diagnostic("CUTE-ARCH", "kernel", " or ".join(ATTENTION_ARCHS), gpu.arch,
                       f"kernel='hopper' attention issues wgmma (sm_90a only); for {gpu.arch} kernel=naive lowers, and "
                       "the project has no tcgen05 attention (flash-attn-4's FlashAttentionForwardSm100 is one)")]


#: code -> rule of a hopper attention configuration, in report order
ATTENTION_RULES = {
    "CUTE-ARCH": _attention_arch,
    "smem-per-block": _attention_smem,
    "threads-per-block": _attention_threads,
    "CUTE-REG-SPLIT": _register_split,
    "CUTE-ACC-REGS": _consumer_registers,
}


def attention_diagnose(knobs, shape, gpu: GpuTarget) -> list[Diagnostic]:
    """Every rule of :data:`ATTENTION_RULES` a configuration breaks, before compiling (none for the naive kernel
    beyond its thread count)."""
    where = f"attention {knobs.kernel} {knobs.block_m}x{knobs.block_n} s{knobs.stages}"
    if knobs.kernel == "naive":
        return _attention_threads(knobs, shape, gpu, f"attention naive {knobs.rows_per_block} rows")
    return [d for rule in ATTENTION_RULES.values() for d in rule(knobs, shape, gpu, where)]


def register_pool(build: CuteBuild, knobs, gpu: GpuTarget) -> list[Diagnostic]:
    """CUTE-REG-POOL: the registers the launch gives the CTA (ptxas's count x threads, per warp in allocation
    units) must hold the setmaxnreg split, else the consumers' setmaxnreg.inc waits forever."""
    if knobs.kernel != "hopper":
        return []
    pool = rules.registers_per_block(build.registers, build.threads, gpu)
    need = 128 * (knobs.producer_regs + knobs.consumer_warpgroups * knobs.consumer_regs)
    if need <= pool:
        return []
    return [Diagnostic("CUTE-REG-POOL", build.kernel_name[:60], f"<= {pool}", need,
                       f"the launch holds {build.registers} registers x {build.threads} threads; the split asks "
                       f"128 x ({knobs.producer_regs} + {knobs.consumer_warpgroups} x {knobs.consumer_regs})")]


def check_attention(build: CuteBuild, knobs, gpu: GpuTarget) -> None:
    """The compiled attention kernel against the GpuTarget (core's rules) and its register split."""
    problems = diagnose(build, gpu) + register_pool(build, knobs, gpu)
    if problems:
        raise Unbuildable("; ".join(p.line() for p in problems), f"{gpu.name}")
