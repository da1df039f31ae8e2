"""quack-kernels' CuTe DSL Hopper GEMM (``quack.gemm_sm90.GemmSm90`` with quack's default linear epilogue,
``pip install quack-kernels``) behind Mosaicist's kernel-file contract (docs/kernel-files.md). This file is an
adapter, not a kernel: its entry builds quack's own ``quack.gemm_default_epi.GemmDefaultSm90`` from the
installed package and calls it; no quack code is copied here.

    mosaic capture --file examples/kernels/cute/quack_gemm.py --lang cute --family gemm \\
        --shape 4096x4096x4096 --dtype bf16 --lower-only -o quack-gemm.bundle

The kernel is what ``quack.gemm_interface.gemm(a, b)`` builds for a plain bf16/f16 GEMM on sm_90 (fp32
accumulation, D = A @ B, no C, no bias, no alpha/beta), launched the way ``quack.gemm.gemm`` launches it:

* the operands cross in mosaic's gemm-family layouts, ``a[m,k]`` row-major (quack's "k-major" A), ``b[k,n]``
  row-major and ``c[m,n]`` row-major. quack takes B in that (k, n) orientation too (its ``b_kn`` route:
  ``b_transposed`` set on the kernel object, and ``GemmBase.rotate_batch_last`` relabels the layout to the
  kernel's (n, k, l) at trace time), and rank-2 operands get quack's trivial batch mode appended at trace
  time, so nothing is copied or transposed on the device;
* always persistent (``quack.gemm_interface`` passes ``persistent=True``), with quack's static tile
  scheduler (sm_90's default; its dynamic scheduler needs a tile-count semaphore buffer the family does
  not have, so it is not a knob), split_k = 1, no swap_ab;
* the scheduler bound ``max_active_clusters`` is quack's own query (``cutlass.utils.HardwareInfo
  .get_max_active_clusters(cluster size)``, what ``quack.gemm`` passes), made when this file is imported on
  a machine with a CUDA device. It is a launch argument: it sets the persistent grid and nothing in the
  device code, so an ahead-of-time lowering without a device (which launches nothing) uses 1
  (the CPU test checks that the PTX is the same for any value).

The knobs are the fields of quack's ``GemmConfig`` that this launch reads, each defaulting to the value of
quack's own sm_90 ``default_config`` (``quack.gemm_config._default_config_for_cap(9)``: 128 x 192 tiles, a
2 x 1 cluster, the ping-pong schedule: what ``gemm_interface.gemm`` uses when nvMatmulHeuristics is not
installed, as in the project's environments; the CPU test checks these defaults against quack's record).
A value given with ``--knob`` replaces quack's choice for that field only; a value quack does not build is
refused by quack's own checks (``GemmSm90.__init__``), one error line.
"""

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from quack.gemm_default_epi import GemmDefaultSm90
from quack.tile_scheduler import TileSchedulerOptions

ENTRY = "gemm"
INPUTS = {"a": ("m", "k"), "b": ("k", "n")}
OUTPUTS = {"c": ("m", "n")}

CLUSTER_SIZES = (1, 2, 4)  # CTAs per cluster this adapter builds (quack's sm_90 tuner searches 2)


@dataclasses.dataclass(frozen=True)
class Knobs:
    tile_m: int = 128  # CTA tile M (quack: 64/128/192/256/320; ping-pong 64/128/192)
    tile_n: int = 192  # CTA tile N (a multiple of 16; quack's bounds depend on tile_m and the schedule)
    tile_k: int = 0  # CTA tile K; 0: quack's choice (4 MMA instructions' K: 64 for 16-bit inputs)
    cluster_m: int = 2  # CTAs of a cluster along M (TMA multicast of B)
    cluster_n: int = 1  # CTAs of a cluster along N (TMA multicast of A)
    pingpong: bool = True  # two consumer warp groups on alternate tiles (False: cooperative, one tile)
    persistent: bool = True  # persistent CTAs over the tile schedule (ping-pong requires it)
    max_swizzle_size: int = 8  # the tile scheduler's raster swizzle group (quack's GemmConfig default)
    max_active_clusters: int = 0  # the persistent grid's bound; 0: quack's device query (see above)

    def __post_init__(self):
        if self.tile_k < 0 or self.tile_k % 16:
            raise ValueError(f"tile_k={self.tile_k}: a multiple of 16 (0: quack's choice)")
        if self.cluster_m not in CLUSTER_SIZES or self.cluster_n not in CLUSTER_SIZES:
            raise ValueError(f"cluster_m={self.cluster_m}, cluster_n={self.cluster_n}: each one of "
                             f"{', '.join(map(str, CLUSTER_SIZES))}")
        if self.cluster_m * self.cluster_n not in CLUSTER_SIZES:
            raise ValueError(f"cluster_m * cluster_n = {self.cluster_m * self.cluster_n}: at most "
                             f"{CLUSTER_SIZES[-1]} CTAs per cluster")
        if self.max_swizzle_size < 1:
            raise ValueError(f"max_swizzle_size={self.max_swizzle_size}: at least 1")
        if self.max_active_clusters < 0:
            raise ValueError(f"max_active_clusters={self.max_active_clusters}: >= 0 (0: quack's device query)")


def _device_max_active_clusters() -> dict:
    """quack's ``get_max_active_clusters`` per cluster size, on this machine's device 0 (empty without one).

    Done at import, outside any trace: the query compiles and loads an empty kernel of its own."""
    import torch

    if not torch.cuda.is_available():
        return {}
    from quack.cute_dsl_utils import get_max_active_clusters

    torch.empty(1, device="cuda")  # the primary context, current on this thread, as quack's callers have it
    try:
        return {size: get_max_active_clusters(size, device_capacity=(9, 0)) for size in CLUSTER_SIZES}
    except Exception as exc:  # noqa: BLE001 - a launch bound only: say so and bound the grid by the SM count
        import warnings

        sms = torch.cuda.get_device_properties(0).multi_processor_count
        warnings.warn(f"quack's get_max_active_clusters failed ({type(exc).__name__}: {exc}); the persistent grid "
                      f"is bounded by {sms} SMs / cluster size instead", stacklevel=1)
        return {size: sms // size for size in CLUSTER_SIZES}


MAX_ACTIVE_CLUSTERS = _device_max_active_clusters()


def scheduler_bound(knobs: Knobs) -> int:
    """The ``max_active_clusters`` the launch passes: the knob, or quack's device query, or 1 with no device."""
    if not knobs.persistent:
        return 0  # quack.gemm passes 0 for a non-persistent launch
    if knobs.max_active_clusters:
        return knobs.max_active_clusters
    return MAX_ACTIVE_CLUSTERS.get(knobs.cluster_m * knobs.cluster_n, 1)


def quack_gemm(knobs: Knobs, a_dtype) -> GemmDefaultSm90:
    """quack's sm_90 GEMM object for these knobs, set up as ``quack.gemm_tvm_ffi_utils.compile_gemm_kernel``
    sets it up (fp32 accumulator; B crossing in the caller's (k, n) orientation)."""
    arch = cutlass.base_dsl.BaseDSL._get_dsl().get_arch_enum()  # the compile target (--gpu-arch)
    if arch.major != 9:
        raise ValueError(f"this adapter builds quack's sm_90 GEMM; the compile target is {arch}")
    tile = (knobs.tile_m, knobs.tile_n) if not knobs.tile_k else (knobs.tile_m, knobs.tile_n, knobs.tile_k)
    op = GemmDefaultSm90(cutlass.Float32, a_dtype, tile, (knobs.cluster_m, knobs.cluster_n, 1),
                         pingpong=knobs.pingpong, is_persistent=knobs.persistent)
    op.b_transposed = True  # quack's b_kn: mB is (k, n); rotate_batch_last makes it (n, k, l) at trace time
    return op


@cute.jit
def gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, knobs: cutlass.Constexpr, stream):
    op = quack_gemm(knobs, a.element_type)
    # the default epilogue with every optional term off (D = acc), as quack.gemm's epi_static for a plain GEMM
    epi = GemmDefaultSm90.EpilogueArguments()
    sched = TileSchedulerOptions(max_active_clusters=Int32(scheduler_bound(knobs)),
                                 max_swizzle_size=Int32(knobs.max_swizzle_size))
    # GemmSm90.__call__(mA, mB, mD, mC, epilogue_args, scheduler_args, varlen_args, stream, mSFA, mSFB)
    op(a, b, c, None, epi, sched, None, stream, None, None)
