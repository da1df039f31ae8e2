"""Budget rules of the Blackwell GEMM (``kernel='blackwell'``), as data, checked before compiling.

Each :data:`RULES` row names a code, what the configuration asks (a function of the knobs) and the limit
(a function of the GpuTarget record); :func:`refusals` runs every row and returns one Diagnostic per limit
exceeded, so a refused configuration is recorded with its rule code, never dropped. Shared memory per
block and cluster size come from the record (``smem_per_block``, ``max_cluster_size``); the record states
no tensor-memory size, so the TMEM columns per SM are a table keyed by compute capability
(:data:`TMEM_COLUMNS`: 512 columns x 128 lanes x 32 bit on cc 10.x, PTX ISA "Tensor Memory"). After the
compile, :mod:`mosaic_target_cute.budget` checks the real figures (ptxas registers, the launch's shared
memory) against the same record.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from mosaic.errors import Diagnostic
from mosaic.records import GpuTarget

from mosaic_target_cute.knobs import GemmKnobs

#: tensor-memory columns per SM by compute capability (tcgen05 exists on cc 10.x only here)
TMEM_COLUMNS = {(10, 0): 512, (10, 3): 512}
#: bytes of the kernel's shared storage besides the A/B slots: mbarriers, the TMEM address, alignment pad
SMEM_OVERHEAD = 1024
#: architectures the kernel is built for (tcgen05 and tensor memory; sm_120 has neither)
ARCHS = ("sm_100a", "sm_100f", "sm_103a")


def tmem_columns(k: GemmKnobs) -> int:
    """Columns one CTA allocates: ``acc_stages x tile_n`` fp32 accumulators, a power of two >= 32."""
    need = k.tile_mn[1] * k.acc_stages
    return max(32, 1 << (need - 1).bit_length())


def smem_bytes(k: GemmKnobs) -> int:
    """Shared memory per CTA: ``stages`` slots of A (tile_m x tile_k) and B (its half of tile_n with a CTA
    pair), 16-bit elements, plus the barriers and alignment."""
    a = k.tile_mn[0] * k.tile_k * 2
    b = k.tile_mn[1] // k.cta_group * k.tile_k * 2
    return k.stages * (a + b) + SMEM_OVERHEAD


def _cluster(k: GemmKnobs) -> int:
    return k.cluster_mn[0] * k.cluster_mn[1]


@attrs.frozen
class BudgetRule:
    code: str
    what: str  # the knobs it reads
    asks: Callable[[GemmKnobs], int]
    limit: Callable[[GpuTarget], int | None]  # None: the record gives no limit (the rule cannot pass)
    why: str


RULES = (
    BudgetRule("smem-per-block", "tile_mn, tile_k, stages, cta_group", smem_bytes,
               lambda g: g.smem_per_block, "A/B slots of every stage share one CTA's shared memory"),
    BudgetRule("tmem-columns", "tile_mn, acc_stages", tmem_columns,
               lambda g: TMEM_COLUMNS.get(tuple(g.compute_capability)),
               "the accumulator stages live in tensor memory (128 lanes x columns per SM)"),
    BudgetRule("cluster-size", "cluster_mn", _cluster, lambda g: g.max_cluster_size,
               "CTAs of one cluster must be co-scheduled on one GPC"),
)


def refusals(k: GemmKnobs, gpu: GpuTarget) -> list[Diagnostic]:
    """Every budget rule the configuration breaks on ``gpu`` (all rules run), plus CUTE-ARCH when the
    GPU has no tcgen05."""
    out = []
    if gpu.arch not in ARCHS:
        out.append(Diagnostic("CUTE-ARCH", "kernel", f"one of {', '.join(ARCHS)}", gpu.arch,
                              "kernel='blackwell' issues tcgen05.mma from tensor memory (sm_100a family)"))
    for rule in RULES:
        asks, limit = rule.asks(k), rule.limit(gpu)
        if limit is None:
            if rule.code == "tmem-columns" and out:
                continue  # CUTE-ARCH already says it
            out.append(Diagnostic(rule.code, rule.what, "a limit in the record", asks, f"{gpu.name}: {rule.why}"))
        elif asks > limit:
            out.append(Diagnostic(rule.code, rule.what, f"<= {limit}", asks, f"{gpu.name}: {rule.why}"))
    return out


def for_gpu(k: GemmKnobs, gpu: GpuTarget) -> tuple[GemmKnobs, str | None]:
    """The knobs a lowering for ``gpu`` builds, and a note when they were changed: ``kernel='hopper'`` knobs
    for an sm_100a-family GPU build the Blackwell kernel with the same tile width, cluster, stages and
    scheduler (wgmma does not exist there; the Hopper kernel 'expects sm_90a')."""
    if k.kernel != "hopper" or gpu.arch not in ARCHS:
        return k, None
    bw = attrs.evolve(k, kernel="blackwell", tile_mn=(128, k.tile_mn[1]), epi_tile=(128, k.epi_tile[1]))
    return bw, f"kernel=blackwell (hopper knobs picked the tcgen05 kernel for {gpu.arch})"
