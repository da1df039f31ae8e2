"""Row scaling in the CuTe DSL for the rewrite tests: y = x * 2 over each row, one CTA per row. Each thread moves
``VEC`` contiguous elements per step: loaded from global memory into registers through a universal copy atom of
``num_bits_per_copy`` bits, scaled, stored back through the same kind of atom. Written for Mosaicist's
kernel-file contract (docs/kernel-files.md); registered as the softmax family's shapes (x[rows, cols] -> y).
"""

import dataclasses

import cutlass
import cutlass.cute as cute

ENTRY = "scale_rows"
INPUTS = {"x": ("rows", "cols")}
OUTPUTS = {"y": ("rows", "cols")}

VEC = 8  # elements per thread and step: 128 bits of bf16


@dataclasses.dataclass(frozen=True)
class Knobs:
    threads: int = 128  # threads per CTA: a multiple of 32, at most 1024


@cute.kernel
def scale_kernel(x: cute.Tensor, y: cute.Tensor, threads: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    xv = cute.zipped_divide(x[row, None], (VEC,))  # (VEC, cols // VEC)
    yv = cute.zipped_divide(y[row, None], (VEC,))
    load = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), x.element_type, num_bits_per_copy=64)
    store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), y.element_type, num_bits_per_copy=64)
    for t in cutlass.range(tidx, cute.size(xv, mode=[1]), threads):
        frag = cute.make_fragment_like(xv[None, t])
        cute.copy(load, xv[None, t], frag)
        v = frag.load().to(cutlass.Float32) * 2.0
        frag.store(v.to(y.element_type))
        cute.copy(store, frag, yv[None, t])


@cute.jit
def scale_rows(x: cute.Tensor, y: cute.Tensor, knobs: cutlass.Constexpr, stream):
    rows = cute.size(x, mode=[0])
    scale_kernel(x, y, knobs.threads).launch(grid=[rows, 1, 1], block=[knobs.threads, 1, 1], stream=stream)
