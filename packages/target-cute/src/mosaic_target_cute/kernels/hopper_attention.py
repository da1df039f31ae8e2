"""The project's FlashAttention-3-style attention forward for Hopper (sm_90a) in CuTe DSL:
``o = softmax(q k^T / sqrt(head_dim) [causal]) v`` per (batch, head), bf16/f16 in, fp32 accumulate and
softmax, same-type out, grouped-query heads.

It lowers for sm_90a on a machine with no GPU (PTX, cubin, SASS, ptxas resources); CuTe DSL has no CPU
interpreter, so its numerics are checked on the GPU only: first run on an H100 on 2026-12-07, 11 configurations
(default f16/bf16, causal, causal GQA, seq 300 with and without causal, p_in=smem with block_n 64 and 3 stages,
pingpong, persistent, head_dim 64 with one consumer warpgroup, causal without block skipping) all passed the
float64 oracle (results/2026-12-07/session20/h100-a/; tests/test_attention_gpu.py).

Operands (the family's layout, ``q`` (batch, heads, seq, head_dim) row-major, ``k``/``v`` (batch, kv_heads,
seq, head_dim), ``o`` like ``q``) are seen as rank-3 CuTe tensors whose last mode L runs over (batch, head):
``mQ``/``mO`` (seq, head_dim, batch*heads), ``mK`` (seq, head_dim, batch*kv_heads) -- both K-major (head_dim
contiguous) -- and ``mVt`` (head_dim, seq, batch*kv_heads), V seen transposed so that it is the MN-major B
operand of the second GEMM (O[m, d] += P[m, j] V^T[d, j]). Query head ``l = b*heads + h`` reads key/value head
``b*kv_heads + h // (heads // kv_heads)`` (GQA head mapping).

Roles inside a CTA of ``128 * (1 + consumer_warpgroups)`` threads, one CTA per (m block, batch*head):

* warpgroup 0 is the producer: setmaxnreg decreases its registers to ``producer_regs``; its first warp issues
  the TMA load of the CTA's Q tile (``block_m x head_dim``, a one-slot pipeline), then for every key block it
  visits, from the last one down to block 0, a K tile and a V tile (``block_n x head_dim`` each) into two
  ``stages``-deep rings of shared-memory slots, each slot with a full/empty mbarrier pair (PipelineTmaAsync:
  wait "empty", arm "full" with the byte count, the TMA completes it). Rows past ``seq`` are zero-filled.
* warpgroups 1.. are consumers (setmaxnreg increases to ``consumer_regs``), ``block_m / consumer_warpgroups``
  rows each. Per key block: S = Q K^T (wgmma, K slot released when done); mask (only in the blocks that need
  it: the diagonal blocks of a causal problem, the last block when ``seq % block_n``); online softmax in
  registers with exp2 and the log2(e) fold (``p = exp2(s * scale*log2e - m * scale*log2e)``, one FFMA + one
  MUFU.EX2 per score), running row max (quad shuffles: four threads share a row of the wgmma accumulator) and
  per-thread partial row sums, the O accumulator rescaled by ``exp2((m_old - m_new) * scale*log2e)``; P
  converted to bf16/f16 and O += P V by a second wgmma, P the register A operand (``p_in='registers'``, RS
  wgmma) or staged through a shared-memory tile (``p_in='smem'``: stmatrix, async-proxy fence, a named barrier
  over the warpgroup, SS wgmma); V slot released. Epilogue: the partial row sums are summed over the quad, O is
  divided by them (a row with a zero sum is left unscaled), converted, written to shared memory over the Q tile
  (each warpgroup overwrites only the rows it read), and one warp TMA-stores the ``block_m x head_dim`` tile
  (rows past ``seq`` are clipped by the TMA unit).

Causal masking (bottom-right aligned, equal query and key lengths: key j visible from query i when j <= i):
with ``causal_skip`` the CTA visits key blocks ``0 .. ceil(min((m+1) block_m, seq) / block_n) - 1`` only (block
skipping); the masked ones are those from ``m block_m // block_n`` up. Without it, every key block is visited
and those above the diagonal are masked whole. Causal CTAs are launched heaviest first (m blocks in reverse).

``pingpong`` (two consumer warpgroups): named barriers ``TURN + g`` hand the tensor cores back and forth;
warpgroup g waits for its turn before issuing P_j V and Q K_{j+1}, and passes the turn right after issuing
them, so its softmax overlaps the other warpgroup's GEMMs (FlashAttention-3's inter-warpgroup overlap).

``persistent``: ``min(sm_count, tiles)`` CTAs walk the (m block, batch*head) tiles of
``utils.StaticPersistentTileScheduler``; the consumers release the Q slot after their last S GEMM of a tile and
the storing warp waits for the TMA store to finish reading the O tile (which overlays Q) before the next Q is
loaded, through a second one-slot pipeline (``o_done``).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.utils import LayoutEnum

from mosaic_target_cute.knobs import AttentionKnobs, AttentionShape

WARPGROUP = 128
LOG2E = math.log2(math.e)
SLOT_ALIGN = 1024
# named barriers (id 0 is the CTA-wide __syncthreads)
BAR_EPILOGUE = 1  # all consumer threads: the O tile is in shared memory
BAR_P = 2  # + consumer warpgroup: its P tile is in shared memory (p_in='smem')
BAR_TURN = 5  # + consumer warpgroup: its turn at the tensor cores (pingpong)


def key_block_range(shape: AttentionShape, knobs: AttentionKnobs, m_block, minimum=min):
    """(first masked key block, key blocks visited) of query block ``m_block``: a CTA visits key blocks
    ``visited - 1`` down to 0, masking ``[masked, visited)``. Plain Python over ints (tests, the budget) or device
    integers (the kernel passes ``minimum=cutlass.min``): the one rule both sides use.

    Causal: with ``causal_skip`` only the blocks holding a key <= the block's last query are visited; the masked
    ones start at the block holding its first query (``m_block * block_m // block_n``); the last block of a
    ``seq`` that ``block_n`` does not divide is among them. Not causal: every block, the last one masked when
    ``block_n`` does not divide ``seq``."""
    bm, bn, s = knobs.block_m, knobs.block_n, shape.seq
    total = (s + bn - 1) // bn
    if shape.causal:
        visited = (minimum((m_block + 1) * bm, s) + bn - 1) // bn if knobs.causal_skip else total
        return minimum(m_block * bm // bn, visited), visited
    return (total - 1 if s % bn else total), total


def kv_head_index(l_q, shape: AttentionShape):
    """The key/value L index (batch * kv_heads + kv head) query L index ``l_q`` (batch * heads + head) reads:
    query head h shares kv head ``h // (heads // kv_heads)`` (GQA; ints or device integers)."""
    return (l_q // shape.heads) * shape.kv_heads + (l_q % shape.heads) // shape.group


class HopperAttention:
    def __init__(self, knobs: AttentionKnobs, shape: AttentionShape, sm_count: int):
        self.knobs = knobs
        self.shape = shape
        self.bm, self.bn = knobs.block_m, knobs.block_n
        self.d = shape.head_dim
        self.consumers = knobs.consumer_warpgroups
        self.threads = WARPGROUP * (1 + self.consumers)
        self.stages = knobs.stages
        self.p_in_regs = knobs.p_in == "registers"
        self.pingpong = knobs.pingpong
        self.scale_log2 = LOG2E / math.sqrt(shape.head_dim)
        self.m_blocks = -(-shape.seq // self.bm)
        self.n_blocks = -(-shape.seq // self.bn)
        self.tiles = self.m_blocks * shape.batch * shape.heads
        self.persistent = knobs.persistent
        self.grid_ctas = min(sm_count, self.tiles) if knobs.persistent else self.tiles
        self.smem_bytes = None  # filled at trace time: the launch's dynamic shared memory

    # -- host side ------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, vt: cute.Tensor, o: cute.Tensor, stream):
        dt = q.element_type
        self.dtype = dt
        bm, bn, d = self.bm, self.bn, self.d
        k_major = warpgroup.OperandMajorMode.K
        mn_major = warpgroup.OperandMajorMode.MN
        mma_qk = sm90.make_trivial_tiled_mma(dt, dt, k_major, k_major, cutlass.Float32, (self.consumers, 1, 1),
                                             tiler_mn=(64, bn))
        mma_pv = sm90.make_trivial_tiled_mma(
            dt, dt, k_major, mn_major, cutlass.Float32, (self.consumers, 1, 1), tiler_mn=(64, d),
            a_source=warpgroup.OperandSource.RMEM if self.p_in_regs else warpgroup.OperandSource.SMEM)

        # shared memory: Q (bm x d, K-major), K stages (bn x d, K-major), V stages seen as (d x bn, MN-major),
        # P (bm x bn, K-major) when staged
        sq = sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (bm, bn, d), dt, 1)
        sk = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (bm, bn, d), dt, self.stages)
        sv = sm90.make_smem_layout_b(LayoutEnum.COL_MAJOR, (bm, d, bn), dt, self.stages)
        sp = sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (bm, d, bn), dt, 1)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tq = cpasync.make_tiled_tma_atom(g2s, q, cute.slice_(sq, (None, None, 0)), (bm, d))
        tma_k, tk = cpasync.make_tiled_tma_atom(g2s, k, cute.slice_(sk, (None, None, 0)), (bn, d))
        tma_v, tv = cpasync.make_tiled_tma_atom(g2s, vt, cute.slice_(sv, (None, None, 0)), (d, bn))
        tma_o, to = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), o,
                                                cute.slice_(sq, (None, None, 0)), (bm, d))

        stages = self.stages

        @cute.struct
        class Storage:
            bar_q: cute.struct.MemRange[cutlass.Int64, 2]
            bar_k: cute.struct.MemRange[cutlass.Int64, stages * 2]
            bar_v: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sq)], SLOT_ALIGN]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sk)], SLOT_ALIGN]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sv)], SLOT_ALIGN]

        @cute.struct
        class StorageWithP:
            bar_q: cute.struct.MemRange[cutlass.Int64, 2]
            bar_k: cute.struct.MemRange[cutlass.Int64, stages * 2]
            bar_v: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sq)], SLOT_ALIGN]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sk)], SLOT_ALIGN]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sv)], SLOT_ALIGN]
            sP: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sp)], SLOT_ALIGN]

        if cutlass.const_expr(not self.p_in_regs):
            Storage = StorageWithP
        self.storage = Storage
        self.smem_bytes = Storage.size_in_bytes()
        self.q_bytes = cute.size_in_bytes(dt, cute.slice_(sq, (None, None, 0)))
        self.kv_bytes = cute.size_in_bytes(dt, cute.slice_(sk, (None, None, 0)))

        # the persistent walk over (m block, batch*head) tiles (unused by a one-tile-per-CTA launch)
        sched = utils.PersistentTileSchedulerParams((self.m_blocks, self.shape.batch * self.shape.heads, 1),
                                                    (1, 1, 1))
        if cutlass.const_expr(self.persistent):
            grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, self.grid_ctas)
        else:
            grid = (self.m_blocks, self.shape.batch * self.shape.heads, 1)
        self.kernel(tma_q, tq, tma_k, tk, tma_v, tv, tma_o, to, mma_qk, mma_pv, sq, sk, sv, sp, sched).launch(
            grid=grid, block=[self.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    # -- device side ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor,
               tma_v: cute.CopyAtom, mVt: cute.Tensor, tma_o: cute.CopyAtom, mO: cute.Tensor,
               mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, sq_layout: cute.ComposedLayout,
               sk_layout: cute.ComposedLayout, sv_layout: cute.ComposedLayout, sp_layout: cute.ComposedLayout,
               sched: utils.PersistentTileSchedulerParams):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP)

        if warp == 0:
            for atom in (tma_q, tma_k, tma_v, tma_o):
                cpasync.prefetch_descriptor(atom)

        st = utils.SmemAllocator().allocate(self.storage)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.consumers * 4)
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        # the Q slot is released by the warp that stores O (O overlays Q): once its TMA store has read the tile
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.bar_q.data_ptr(), num_stages=1, producer_group=one_thread,
            consumer_group=one_thread, tx_count=self.q_bytes, defer_sync=True)
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.bar_k.data_ptr(), num_stages=self.stages, producer_group=one_thread,
            consumer_group=consumer_warps, tx_count=self.kv_bytes, defer_sync=True)
        pipe_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.bar_v.data_ptr(), num_stages=self.stages, producer_group=one_thread,
            consumer_group=consumer_warps, tx_count=self.kv_bytes, defer_sync=True)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        sQ = st.sQ.get_tensor(sq_layout.outer, swizzle=sq_layout.inner)
        sK = st.sK.get_tensor(sk_layout.outer, swizzle=sk_layout.inner)
        sV = st.sV.get_tensor(sv_layout.outer, swizzle=sv_layout.inner)
        sP = None if self.p_in_regs else st.sP.get_tensor(sp_layout.outer, swizzle=sp_layout.inner)

        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg == 0:  # ---------------- producer warpgroup
            cute.arch.setmaxregister_decrease(self.knobs.producer_regs)
            if warp == 0:
                self.produce(tma_q, mQ, tma_k, mK, tma_v, mVt, sQ, sK, sV, pipe_q, pipe_k, pipe_v, sched)
        if wg > 0:  # ---------------- consumer warpgroups
            cute.arch.setmaxregister_increase(self.knobs.consumer_regs)
            self.consume(tidx - WARPGROUP, wg - 1, warp, tma_o, mO, mma_qk, mma_pv, sQ, sK, sV, sP,
                         pipe_q, pipe_k, pipe_v, sched)

    @cute.jit
    def tile_coords(self, tile_idx):
        """(m block, query L index, key/value L index) of a tile."""
        m_block, l_q = tile_idx[0], tile_idx[1]
        if cutlass.const_expr(self.shape.causal and not self.persistent):
            m_block = self.m_blocks - 1 - m_block  # heaviest causal blocks first
        return m_block, l_q, kv_head_index(l_q, self.shape)

    def key_blocks(self, m_block):
        return key_block_range(self.shape, self.knobs, m_block, cutlass.min)

    @cute.jit
    def produce(self, tma_q, mQ, tma_k, mK, tma_v, mVt, sQ, sK, sV, pipe_q, pipe_k, pipe_v, sched):
        bm, bn, d = self.bm, self.bn, self.d
        gQ = cute.local_tile(mQ, (bm, d), (None, None, None))  # (bm, d, M/bm, 1, L)
        gK = cute.local_tile(mK, (bn, d), (None, None, None))  # (bn, d, N/bn, 1, Lkv)
        gV = cute.local_tile(mVt, (d, bn), (None, None, None))  # (d, bn, 1, N/bn, Lkv)
        one = cute.make_layout(1)
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, one, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, one, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, one, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        loads = (tma_q, tQsQ, tQgQ, tma_k, tKsK, tKgK, tma_v, tVsV, tVgV)

        put_q = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        put = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        if cutlass.const_expr(self.persistent):
            tiles = utils.StaticPersistentTileScheduler.create(sched, cute.arch.block_idx(), cute.arch.grid_dim())
            work = tiles.initial_work_tile_info()
            while work.is_valid_tile:
                put_q, put = self.produce_tile(work.tile_idx, loads, pipe_q, pipe_k, pipe_v, put_q, put)
                tiles.advance_to_next_work()
                work = tiles.get_current_work()
        else:
            bx, by, _ = cute.arch.block_idx()
            put_q, put = self.produce_tile((bx, by, 0), loads, pipe_q, pipe_k, pipe_v, put_q, put)

    @cute.jit
    def produce_tile(self, tile_idx, loads, pipe_q, pipe_k, pipe_v, put_q, put):
        """Q once (its slot free: the previous tile's O has been stored), then K_n, V_n for n = visited-1 .. 0."""
        tma_q, tQsQ, tQgQ, tma_k, tKsK, tKgK, tma_v, tVsV, tVgV = loads
        m_block, l_q, l_kv = self.tile_coords(tile_idx)
        _, visited = self.key_blocks(m_block)
        pipe_q.producer_acquire(put_q)
        cute.copy(tma_q, tQgQ[(None, m_block, 0, l_q)], tQsQ[(None, 0)],
                  tma_bar_ptr=pipe_q.producer_get_barrier(put_q))
        put_q.advance()
        for i in range(visited):
            n = visited - 1 - i
            pipe_k.producer_acquire(put)
            cute.copy(tma_k, tKgK[(None, n, 0, l_kv)], tKsK[(None, put.index)],
                      tma_bar_ptr=pipe_k.producer_get_barrier(put))
            pipe_v.producer_acquire(put)
            cute.copy(tma_v, tVgV[(None, 0, n, l_kv)], tVsV[(None, put.index)],
                      tma_bar_ptr=pipe_v.producer_get_barrier(put))
            put.advance()
        return put_q, put

    @cute.jit
    def consume(self, ctid, cwg, warp, tma_o, mO, mma_qk, mma_pv, sQ, sK, sV, sP, pipe_q, pipe_k, pipe_v, sched):
        bm, bn, d = self.bm, self.bn, self.d
        wg_threads = cute.make_layout(self.consumers, stride=WARPGROUP)
        wg_qk = mma_qk.get_slice(wg_threads(cwg))
        wg_pv = mma_pv.get_slice(wg_threads(cwg))
        thr_qk = mma_qk.get_slice(ctid)
        thr_pv = mma_pv.get_slice(ctid)

        tSrQ = mma_qk.make_fragment_A(wg_qk.partition_A(sQ))  # (MMA, MMA_M, MMA_K, 1)
        tSrK = mma_qk.make_fragment_B(wg_qk.partition_B(sK))  # (MMA, MMA_N, MMA_K, stages)
        tOrV = mma_pv.make_fragment_B(wg_pv.partition_B(sV))  # (MMA, MMA_N, MMA_K, stages)
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((bm, bn)), cutlass.Float32)
        acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((bm, d)), cutlass.Float32)
        if cutlass.const_expr(self.p_in_regs):
            tOrP = mma_pv.make_fragment_A(wg_pv.partition_shape_A((bm, bn)))  # registers (MMA, MMA_M, MMA_K)
            p_copy = None
        else:
            tOrP = mma_pv.make_fragment_A(wg_pv.partition_A(sP))[(None, None, None, 0)]  # smem descriptors
            copy = cute.make_tiled_copy_C(
                cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.dtype), mma_qk)
            thr = copy.get_slice(ctid)
            p_copy = (copy, thr, thr.partition_D(cute.slice_(sP, (None, None, 0))))
        # where each score of this thread sits in the (bm, bn) tile
        tScS = thr_qk.partition_C(cute.make_identity_tensor((bm, bn)))
        n_rows = cute.size(rows_view(acc_s), mode=[0])
        row_max = cute.make_rmem_tensor(n_rows, cutlass.Float32)
        row_sum = cute.make_rmem_tensor(n_rows, cutlass.Float32)
        mma = (mma_qk, mma_pv, tSrQ, tSrK, tOrV, tOrP, acc_s, acc_o, row_max, row_sum, tScS, p_copy)

        o_copy = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.dtype), mma_pv)
        o_thr = o_copy.get_slice(ctid)
        tOsO = o_thr.partition_D(cute.slice_(sQ, (None, None, 0)))  # the O tile overlays the Q tile
        gO = cute.local_tile(mO, (bm, d), (None, None, None))  # (bm, d, M/bm, 1, L)
        tOsO_tma, tOgO = cpasync.tma_partition(tma_o, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                               cute.group_modes(gO, 0, 2))
        store = (o_copy, o_thr, tOsO, tma_o, tOsO_tma, tOgO, warp == 4)  # the first consumer warp stores

        if cutlass.const_expr(self.pingpong):
            if cwg == 1:  # consumer warpgroup 0 takes the first turn
                cute.arch.barrier_arrive(barrier_id=BAR_TURN, number_of_threads=2 * WARPGROUP)

        get_q = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        get = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if cutlass.const_expr(self.persistent):
            tiles = utils.StaticPersistentTileScheduler.create(sched, cute.arch.block_idx(), cute.arch.grid_dim())
            work = tiles.initial_work_tile_info()
            while work.is_valid_tile:
                get_q, get = self.consume_tile(work.tile_idx, cwg, mma, store, pipe_q, pipe_k, pipe_v, get_q, get)
                tiles.advance_to_next_work()
                work = tiles.get_current_work()
        else:
            bx, by, _ = cute.arch.block_idx()
            get_q, get = self.consume_tile((bx, by, 0), cwg, mma, store, pipe_q, pipe_k, pipe_v, get_q, get)

    @cute.jit
    def consume_tile(self, tile_idx, cwg, mma, store, pipe_q, pipe_k, pipe_v, get_q, get):
        mma_qk, mma_pv, tSrQ, tSrK, tOrV, tOrP, acc_s, acc_o, row_max, row_sum, tScS, p_copy = mma
        o_copy, o_thr, tOsO, tma_o, tOsO_tma, tOgO, store_warp = store
        m_block, l_q, _ = self.tile_coords(tile_idx)
        masked, visited = self.key_blocks(m_block)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)
        acc_o.fill(0.0)
        pipe_q.consumer_wait(get_q)
        self.turn_wait(cwg)
        # key blocks from the last visited down: first those that need a mask, then the rest
        for i in range(visited - masked):
            get = self.step(visited - 1 - i, m_block, True, get, cwg, mma, pipe_k, pipe_v)
        for i in range(masked):
            get = self.step(masked - 1 - i, m_block, False, get, cwg, mma, pipe_k, pipe_v)
        self.turn_pass(cwg)

        # epilogue: O / row sum -> dtype -> smem (over Q) -> TMA store; then the Q slot is free
        o_rows = rows_view(acc_o)
        for r in cutlass.range_constexpr(cute.size(row_sum)):
            total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)  # the quad's partial sums
            inv = cute.arch.rcp_approx(total if total != 0.0 else 1.0)
            o_rows[r, None].store(o_rows[r, None].load() * inv)
        r_o = cute.make_rmem_tensor_like(acc_o, self.dtype)
        r_o.store(acc_o.load().to(self.dtype))
        cute.copy(o_copy, o_thr.retile(r_o), tOsO)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=BAR_EPILOGUE, number_of_threads=self.consumers * WARPGROUP)
        if store_warp:
            cute.copy(tma_o, tOsO_tma[(None, 0)], tOgO[(None, m_block, 0, l_q)])
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)
            pipe_q.consumer_release(get_q)
        get_q.advance()
        return get_q, get

    @cute.jit
    def step(self, n, m_block, masked: cutlass.Constexpr, get, cwg, mma, pipe_k, pipe_v):
        """One key block: S = Q K_n^T, mask, online softmax, O += P V_n. Called on this warpgroup's turn (pingpong);
        passes the turn after issuing S and takes it back before issuing P V."""
        mma_qk, mma_pv, tSrQ, tSrK, tOrV, tOrP, acc_s, acc_o, row_max, row_sum, tScS, p_copy = mma
        s_rows = rows_view(acc_s)
        o_rows = rows_view(acc_o)
        pipe_k.consumer_wait(get)
        gemm(mma_qk, acc_s, tSrQ[(None, None, None, 0)], tSrK[(None, None, None, get.index)], True)
        self.turn_pass(cwg)
        warpgroup.wait_group(0)
        pipe_k.consumer_release(get)

        if cutlass.const_expr(masked):
            self.mask(acc_s, tScS, n, m_block)

        # online softmax: p = exp2(s * c - m * c), c = log2(e) / sqrt(head_dim)
        c = self.scale_log2
        for r in cutlass.range_constexpr(cute.size(row_max)):
            scores = s_rows[r, None].load()
            new_max = scores.reduce(cute.ReductionOp.MAX, row_max[r], 0)
            new_max = cute.arch.warp_reduction_max(new_max, threads_in_group=4)  # the quad shares the row
            safe = 0.0 if new_max == -cutlass.Float32.inf else new_max  # a row with nothing visible yet
            shift = safe * c
            rescale = cute.math.exp2(row_max[r] * c - shift, fastmath=True)
            p = cute.math.exp2(scores * c - shift, fastmath=True)
            row_sum[r] = row_sum[r] * rescale + p.reduce(cute.ReductionOp.ADD, 0.0, 0)
            row_max[r] = new_max
            s_rows[r, None].store(p)
            o_rows[r, None].store(o_rows[r, None].load() * rescale)

        # P in the input type, then O += P V
        if cutlass.const_expr(self.p_in_regs):
            as_a = cute.make_tensor(tOrP.iterator, cute.make_layout(operand_a_shape(acc_s.layout)))
            as_a.store(operand_a_view(acc_s).load().to(self.dtype))
            p_operand = tOrP
        else:
            copy, thr, tPsP = p_copy
            r_p = cute.make_rmem_tensor_like(acc_s, self.dtype)
            r_p.store(acc_s.load().to(self.dtype))
            cute.copy(copy, thr.retile(r_p), tPsP)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=BAR_P + cwg, number_of_threads=WARPGROUP)  # the warpgroup's rows
            p_operand = tOrP
        pipe_v.consumer_wait(get)
        self.turn_wait(cwg)
        gemm(mma_pv, acc_o, p_operand, tOrV[(None, None, None, get.index)], False)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(get)
        get.advance()
        return get

    @cute.jit
    def mask(self, acc_s, tScS, n, m_block):
        """-inf where the key is past ``seq`` or (causal) after the query."""
        col0 = n * self.bn
        row0 = m_block * self.bm
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            row, col = tScS[i]
            key = col0 + col
            hide = key >= self.shape.seq
            if cutlass.const_expr(self.shape.causal):
                hide = hide | (key > row0 + row)
            if hide:
                acc_s[i] = -cutlass.Float32.inf

    @cute.jit
    def turn_wait(self, cwg):
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=BAR_TURN + cwg, number_of_threads=2 * WARPGROUP)

    @cute.jit
    def turn_pass(self, cwg):
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier_arrive(barrier_id=BAR_TURN + 1 - cwg, number_of_threads=2 * WARPGROUP)


@cute.jit
def gemm(tiled_mma: cute.TiledMma, acc: cute.Tensor, a: cute.Tensor, b: cute.Tensor,
         zero_init: cutlass.Constexpr):
    """Issue one warpgroup MMA over the k blocks of ``a``/``b`` and commit it (the caller waits). A fresh atom per
    call carries the accumulate flag (first k block: overwrite when ``zero_init``)."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
        cute.gemm(atom, acc, a[(None, None, kb)], b[(None, None, kb)], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()


def rows_view(acc: cute.Tensor) -> cute.Tensor:
    """The wgmma accumulator ``((2, 2, V), MMA_M, MMA_N)`` of one thread as (its rows, its columns):
    value (c, r, v) of m-tile i and n-tile j sits at row ``8 r + 64 i`` and column ``c + 8 v + N j`` of the
    thread's pattern, so rows are modes (r, i) and columns (c, v, j)."""
    flat = cute.make_layout(acc.shape)
    (c, r, v), mi, nj = flat.stride[0], flat.stride[1], flat.stride[2]
    (cs, rs, vs), ms, ns = acc.shape[0], acc.shape[1], acc.shape[2]
    view = cute.make_layout(((rs, ms), (cs, vs, ns)), stride=((r, mi), (c, v, nj)))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, view))


def operand_a_shape(acc_layout) -> tuple:
    """The register A-operand shape ``((2, 2, 2), MMA_M, MMA_K)`` a score accumulator ``((2, 2, V), MMA_M,
    MMA_N)`` becomes when its columns are the next MMA's k: 16 columns (two 8-column groups) per k block."""
    (cs, rs, vs), ms, ns = acc_layout.shape
    return ((cs, rs, 2), ms, (vs // 2) * ns)


def operand_a_view(acc: cute.Tensor) -> cute.Tensor:
    """The accumulator seen in :func:`operand_a_shape`'s order: its 8-column groups v = 2 k + t split into
    (t, k), so k block k holds columns 16 k .. 16 k + 15."""
    flat = cute.make_layout(acc.shape)
    (c, r, v), mi, nj = flat.stride[0], flat.stride[1], flat.stride[2]
    (cs, rs, vs), ms, ns = acc.shape[0], acc.shape[1], acc.shape[2]
    view = cute.make_layout(((cs, rs, 2), ms, (vs // 2, ns)), stride=((c, r, v), mi, (2 * v, nj)))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, view))
