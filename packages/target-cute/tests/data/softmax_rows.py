"""Softmax in the CuTe DSL for the rewrite tests: y = exp(x - max(x)) / sum(exp(x - max(x))) over each row, one CTA
per row, float32 accumulation (a butterfly shuffle per warp, then one warp over the per-warp partials in shared
memory). Written for Mosaicist's kernel-file contract (docs/kernel-files.md); each row's elements are read in
copies of ``num_bits_per_copy`` bits through a universal copy atom.

The entry is a ``@cute.jit`` function taking the input, then the output, then the knobs (a compile-time
constant) and the CUDA stream.
"""

import dataclasses

import cutlass
import cutlass.cute as cute

ENTRY = "softmax"
INPUTS = {"x": ("rows", "cols")}
OUTPUTS = {"y": ("rows", "cols")}


@dataclasses.dataclass(frozen=True)
class Knobs:
    threads: int = 128  # threads per CTA: a multiple of 32, at most 1024


@cute.jit
def block_reduce(v: cutlass.Float32, partial: cute.Tensor, tidx, warps: cutlass.Constexpr, is_max: cutlass.Constexpr):
    """The CTA-wide max or sum of v: a butterfly per warp, then warp 0 over the per-warp partials."""
    for i in cutlass.range_constexpr(5):
        other = cute.arch.shuffle_sync_bfly(v, offset=16 >> i)
        v = cute.arch.fmax(v, other) if is_max else v + other
    if tidx % 32 == 0:
        partial[tidx // 32] = v
    cute.arch.sync_threads()
    if tidx < 32:
        s = partial[0]
        if tidx < warps:
            s = partial[tidx]
        for i in cutlass.range_constexpr(5):
            other = cute.arch.shuffle_sync_bfly(s, offset=16 >> i)
            s = cute.arch.fmax(s, other) if is_max else s + other
        if tidx == 0:
            partial[warps] = s
    cute.arch.sync_threads()
    out = partial[warps]
    cute.arch.sync_threads()
    return out


@cute.kernel
def softmax_kernel(x: cute.Tensor, y: cute.Tensor, threads: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    cols = cute.size(x, mode=[1])
    warps = threads // 32
    smem = cutlass.utils.SmemAllocator()
    partial = smem.allocate_tensor(cutlass.Float32, cute.make_layout(warps + 1), byte_alignment=16)

    m = -cutlass.Float32.inf
    for j in cutlass.range(tidx, cols, threads):
        m = cute.arch.fmax(m, x[row, j].to(cutlass.Float32))
    m = block_reduce(m, partial, tidx, warps, True)

    s = cutlass.Float32(0.0)
    for j in cutlass.range(tidx, cols, threads):
        s += cute.math.exp(x[row, j].to(cutlass.Float32) - m)  # the row's sum of exponentials
    s = block_reduce(s, partial, tidx, warps, False)

    for j in cutlass.range(tidx, cols, threads):
        y[row, j] = (cute.math.exp(x[row, j].to(cutlass.Float32) - m) / s).to(y.element_type)


@cute.jit
def softmax(x: cute.Tensor, y: cute.Tensor, knobs: cutlass.Constexpr, stream):
    rows = cute.size(x, mode=[0])
    softmax_kernel(x, y, knobs.threads).launch(grid=[rows, 1, 1], block=[knobs.threads, 1, 1], stream=stream)
