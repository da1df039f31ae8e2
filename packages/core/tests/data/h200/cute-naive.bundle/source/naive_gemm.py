"""The deliberately naive CuTe DSL GEMM — the "first naive translation" that establishes correctness
before the convergence loop improves it: one thread per output element, a k loop of plain global loads
(no shared memory, no TMA, no cp.async, no pipelining), fp32 FMA on CUDA cores, a direct global store.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from mosaic_target_cute.knobs import GemmKnobs


class NaiveGemm:
    def __init__(self, knobs: GemmKnobs):
        self.block_m, self.block_n = knobs.block_mn
        self.threads = self.block_m * self.block_n
        self.smem_bytes = 0

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
        m, n = cute.size(c, mode=[0]), cute.size(c, mode=[1])
        self.kernel(a, b, c).launch(grid=[n // self.block_n, m // self.block_m, 1],
                                    block=[self.block_n, self.block_m, 1], stream=stream)

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor):
        tx, ty, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        row = by * self.block_m + ty
        col = bx * self.block_n + tx
        acc = cutlass.Float32(0.0)
        for kk in range(cute.size(a, mode=[1])):
            acc += a[row, kk, 0].to(cutlass.Float32) * b[col, kk, 0].to(cutlass.Float32)
        c[row, col, 0] = acc.to(c.element_type)
