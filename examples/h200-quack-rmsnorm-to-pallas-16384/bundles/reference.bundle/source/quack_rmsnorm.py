"""quack-kernels' CuTe DSL RMSNorm forward (Tri Dao et al., ``pip install quack-kernels``) behind Mosaicist's
kernel-file contract (docs/kernel-files.md). This file is an adapter, not a kernel: its entry builds quack's
own ``quack.rmsnorm.RMSNorm`` from the installed package and calls it; no quack code is copied here.

    mosaic capture --file examples/kernels/cute/quack_rmsnorm.py --lang cute --family rmsnorm \\
        --shape 16384x8192 --dtype bf16 --lower-only -o quack-rmsnorm.bundle

The knobs are the fields of quack's ``RmsNormFwdConfig`` (its launch configuration: what its autotuner
searches), each defaulting to quack's own analytical choice for the shape (``0`` / ``"auto"``:
``RmsNormFwdConfig.from_analytical_heuristic`` for the row width, the element width and the compile
target's arch, the config ``quack.rmsnorm.rmsnorm_fwd`` uses); a value given with ``--knob`` replaces
quack's choice for that field only. ``eps`` is quack's runtime ``eps`` argument, here a constant.
"""

import dataclasses

import cutlass
import cutlass.cute as cute
from quack.rmsnorm import RMSNorm
from quack.rmsnorm_config import RmsNormFwdConfig

ENTRY = "rmsnorm"
INPUTS = {"x": ("rows", "cols"), "w": ("cols",)}
OUTPUTS = {"y": ("rows", "cols")}

RELOAD = {"none": None, "smem": "smem", "gmem": "gmem"}  # quack's reload_from values (None: keep x in registers)


@dataclasses.dataclass(frozen=True)
class Knobs:
    num_threads: int = 0  # threads per CTA, 128 or 256 (quack's _CTA_THREAD_SIZE); 0: quack's choice
    threads_per_row: int = 0  # threads reducing one row: 8..256, a power of two, <= num_threads; 0: quack's
    cluster_n: int = 0  # CTAs of a cluster splitting one row (1, 2, 4, 8, 16; sm_90+); 0: quack's choice
    reload_from: str = "auto"  # reload x before the epilogue: none (registers), smem, gmem; auto: quack's
    delay_w_load: bool = False  # load the weight after the row reduction (quack's default False)
    eps: float = 1e-6  # mosaic's rmsnorm oracle uses 1e-6

    def __post_init__(self):
        if self.num_threads not in (0, 128, 256):
            raise ValueError(f"num_threads={self.num_threads}: quack builds 128 or 256 (0: its choice)")
        if self.threads_per_row not in (0, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"threads_per_row={self.threads_per_row}: one of 8, 16, 32, 64, 128, 256 (0: quack's)")
        if self.cluster_n not in (0, 1, 2, 4, 8, 16):
            raise ValueError(f"cluster_n={self.cluster_n}: one of 1, 2, 4, 8, 16 (0: quack's choice)")
        if self.reload_from != "auto" and self.reload_from not in RELOAD:
            raise ValueError(f"reload_from={self.reload_from!r}: auto, {', '.join(RELOAD)}")


def quack_config(knobs: Knobs, cols: int, dtype_width: int, arch_major: int) -> RmsNormFwdConfig:
    """quack's heuristic config for this row width and arch, with the knobs that are set replacing its fields."""
    base = RmsNormFwdConfig.from_analytical_heuristic(cols, dtype_width, arch_major=arch_major)
    chosen = {"num_threads": knobs.num_threads or base.num_threads,
              "threads_per_row": knobs.threads_per_row or base.threads_per_row,
              "cluster_n": knobs.cluster_n or base.cluster_n,
              "reload_from": base.reload_from if knobs.reload_from == "auto" else RELOAD[knobs.reload_from],
              "delay_w_load": knobs.delay_w_load}
    if chosen["threads_per_row"] > chosen["num_threads"] or chosen["num_threads"] % chosen["threads_per_row"]:
        raise ValueError(f"threads_per_row={chosen['threads_per_row']} must divide num_threads={chosen['num_threads']}")
    if chosen["threads_per_row"] * chosen["cluster_n"] > cols:  # quack's prune_invalid_rmsnorm_fwd_configs
        raise ValueError(f"threads_per_row * cluster_n = {chosen['threads_per_row'] * chosen['cluster_n']} "
                         f"exceeds the row width {cols}")
    return RmsNormFwdConfig(**chosen)


@cute.jit
def rmsnorm(x: cute.Tensor, w: cute.Tensor, y: cute.Tensor, knobs: cutlass.Constexpr, stream):
    cols = cute.size(x, mode=[1])
    arch = cutlass.base_dsl.BaseDSL._get_dsl().get_arch_enum()  # the compile target (--gpu-arch), as quack reads it
    op = RMSNorm(x.element_type, cols, config=quack_config(knobs, cols, x.element_type.width, arch.major))
    # quack's RMSNorm.__call__(mX, mW, mB, mRes, mO, mResO, mRstd, mMean, eps, stream): no bias, residual,
    # rstd or mean output -- the plain y = x * rsqrt(mean(x^2) + eps) * w forward
    op(x, w, None, None, y, None, None, None, cutlass.Float32(knobs.eps), stream)
