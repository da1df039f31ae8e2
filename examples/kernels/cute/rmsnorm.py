"""RMSNorm in the CuTe DSL: y = x / sqrt(mean(x^2) + eps) * w over each row, one CTA per row, float32
accumulation (a butterfly shuffle per warp, then one warp over the per-warp sums in shared memory).
Written for Mosaicist's kernel-file contract (docs/kernel-files.md):

    mosaic capture --file examples/kernels/cute/rmsnorm.py --lang cute --family rmsnorm \\
        --shape 4096x8192 --dtype bf16 --knob threads=512 --lower-only -o rmsnorm.bundle

The entry is a ``@cute.jit`` function taking the inputs, then the outputs (row-major ``cute.Tensor``s of
the shapes INPUTS/OUTPUTS name), then the knobs (a compile-time constant) and the CUDA stream.
"""

import dataclasses

import cutlass
import cutlass.cute as cute

ENTRY = "rmsnorm"
INPUTS = {"x": ("rows", "cols"), "w": ("cols",)}
OUTPUTS = {"y": ("rows", "cols")}


@dataclasses.dataclass(frozen=True)
class Knobs:
    threads: int = 256  # threads per CTA: a multiple of 32, at most 1024
    eps: float = 1e-6  # mosaic's rmsnorm oracle uses 1e-6

    def __post_init__(self):
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads={self.threads}: a multiple of 32 in [32, 1024]")


@cute.kernel
def rmsnorm_kernel(x: cute.Tensor, w: cute.Tensor, y: cute.Tensor, threads: cutlass.Constexpr,
                   eps: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    cols = cute.size(x, mode=[1])
    warps = threads // 32
    smem = cutlass.utils.SmemAllocator()
    partial = smem.allocate_tensor(cutlass.Float32, cute.make_layout(warps), byte_alignment=16)

    acc = cutlass.Float32(0.0)
    for j in cutlass.range(tidx, cols, threads):
        v = x[row, j].to(cutlass.Float32)
        acc += v * v
    for i in cutlass.range_constexpr(5):
        acc += cute.arch.shuffle_sync_bfly(acc, offset=16 >> i)
    if tidx % 32 == 0:
        partial[tidx // 32] = acc
    cute.arch.sync_threads()
    if tidx < 32:
        s = cutlass.Float32(0.0)
        if tidx < warps:
            s = partial[tidx]
        for i in cutlass.range_constexpr(5):
            s += cute.arch.shuffle_sync_bfly(s, offset=16 >> i)
        if tidx == 0:
            partial[0] = s
    cute.arch.sync_threads()
    scale = cute.math.rsqrt(partial[0] / cutlass.Float32(cols) + cutlass.Float32(eps))
    for j in cutlass.range(tidx, cols, threads):
        y[row, j] = (x[row, j].to(cutlass.Float32) * scale * w[j].to(cutlass.Float32)).to(y.element_type)


@cute.jit
def rmsnorm(x: cute.Tensor, w: cute.Tensor, y: cute.Tensor, knobs: cutlass.Constexpr, stream):
    rows = cute.size(x, mode=[0])
    rmsnorm_kernel(x, w, y, knobs.threads, knobs.eps).launch(grid=[rows, 1, 1], block=[knobs.threads, 1, 1],
                                                             stream=stream)
