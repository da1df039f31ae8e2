"""The deliberately naive CuTe DSL attention forward -- the "first naive translation" that establishes correctness
before the convergence loop improves it: one thread per query row (``rows_per_block`` rows per CTA, one CTA
column per (batch, head)), the row of q in registers, then for every visible key (all of them, or keys 0..i for
query i when causal) a dot product of plain global loads, an online softmax in fp32 with the natural ``exp``
(running max, running sum, the output row rescaled), and the value row accumulated in fp32 registers; a direct
global store of the normalised row. No shared memory, no TMA, no tensor cores, no pipelining.

It lowers for sm_90a with no GPU; its numerics were first checked on an H100 on 2026-12-07 (float64 oracle
passed at 1x256x2x128 f16; results/2026-12-07/session20/h100-a/).

It takes the same tensors as :mod:`~mosaic_target_cute.kernels.hopper_attention`: ``q``/``o`` (seq, head_dim,
batch*heads), ``k`` (seq, head_dim, batch*kv_heads), ``vt`` (head_dim, seq, batch*kv_heads).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute

from mosaic_target_cute.kernels.hopper_attention import kv_head_index
from mosaic_target_cute.knobs import AttentionKnobs, AttentionShape


class NaiveAttention:
    def __init__(self, knobs: AttentionKnobs, shape: AttentionShape):
        self.knobs = knobs
        self.shape = shape
        self.rows = knobs.rows_per_block
        self.threads = self.rows
        self.smem_bytes = 0
        self.row_blocks = -(-shape.seq // self.rows)
        self.grid_ctas = self.row_blocks * shape.batch * shape.heads
        self.scale = 1.0 / math.sqrt(shape.head_dim)

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, vt: cute.Tensor, o: cute.Tensor, stream):
        self.kernel(q, k, vt, o).launch(grid=[self.row_blocks, self.shape.batch * self.shape.heads, 1],
                                        block=[self.rows, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, vt: cute.Tensor, o: cute.Tensor):
        tx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        d = self.shape.head_dim
        row = bx * self.rows + tx
        l_q = by
        l_kv = kv_head_index(l_q, self.shape)
        if row < self.shape.seq:
            q_row = cute.make_rmem_tensor(d, cutlass.Float32)
            out = cute.make_rmem_tensor(d, cutlass.Float32)
            for c in cutlass.range_constexpr(d):
                q_row[c] = q[row, c, l_q].to(cutlass.Float32)
                out[c] = 0.0
            running_max = -cutlass.Float32.inf
            running_sum = cutlass.Float32(0.0)
            keys = self.shape.seq
            if cutlass.const_expr(self.shape.causal):
                keys = row + 1  # bottom-right aligned with equal lengths: keys 0..row
            for j in range(keys):
                score = cutlass.Float32(0.0)
                for c in cutlass.range_constexpr(d):
                    score += q_row[c] * k[j, c, l_kv].to(cutlass.Float32)
                score = score * self.scale
                new_max = score if score > running_max else running_max
                correction = cute.math.exp(running_max - new_max)
                weight = cute.math.exp(score - new_max)
                running_sum = running_sum * correction + weight
                for c in cutlass.range_constexpr(d):
                    out[c] = out[c] * correction + weight * vt[c, j, l_kv].to(cutlass.Float32)
                running_max = new_max
            for c in cutlass.range_constexpr(d):
                o[row, c, l_q] = (out[c] / running_sum).to(o.element_type)
