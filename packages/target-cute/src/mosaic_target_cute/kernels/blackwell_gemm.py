"""The project's warp-specialised Blackwell GEMM in CuTe DSL: C[m, n] = A[m, k] @ B[k, n] (bf16/f16 in,
fp32 accumulate in tensor memory, same-type out), for sm_100a.

Roles inside a CTA of 192 threads (six warps):

* warps 0-3 are the epilogue: one thread per tensor-memory lane (warp ``w`` may only touch lanes
  ``32 w .. 32 w + 31``, hence the epilogue owns the first four warps). They wait for an accumulator
  stage to be full, read it out of tensor memory ``epi_tile[1]`` columns at a time (tcgen05.ld),
  convert, store to global memory, and hand the stage back to the MMA warp.
* warp 4 is the TMA producer: it walks the CTA's tiles and loads A and B k-blocks into a
  ``stages``-deep ring of shared-memory slots (full/empty mbarrier pairs, PipelineTmaUmma). With a
  cluster, A is multicast along the cluster's N dimension and B along its M dimension; with
  ``cta_group=2`` each CTA of an MMA pair loads its half of A and half of B and both halves complete the
  leader CTA's barrier.
* warp 5 is the MMA warp and owns tensor memory: it allocates ``acc_stages x tile_n`` columns (rounded
  to a power of two, see :func:`~mosaic_target_cute.blackwell_budget.tmem_columns`), and on the leader CTA of each pair issues tcgen05.mma from
  the swizzled slots into the accumulator stage, committing each slot back to the producer and each
  finished tile to the epilogue (tcgen05.commit arrives on the mbarriers, multicast to the pair).

``cta_group=2`` pairs two CTAs of the cluster's M dimension into one MMA of ``2 * tile_m`` rows: the
leader issues it, each CTA keeps its own 128 rows of the accumulator in its own tensor memory.
``acc_stages=2`` double-buffers the accumulator so the epilogue of one tile overlaps the MMAs of the next
(only with ``persistent=True``, where a CTA walks several tiles).

Budget rules of a configuration (shared memory, tensor-memory columns, cluster size, the pair's cluster
shape) are data in :mod:`mosaic_target_cute.blackwell_budget`; this module only builds the kernel.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100
from cutlass.cute.nvgpu import cpasync, tcgen05

from mosaic_target_cute.blackwell_budget import tmem_columns
from mosaic_target_cute.knobs import GemmKnobs

WARP = 32
EPILOGUE_WARPS = (0, 1, 2, 3)
TMA_WARP = 4
MMA_WARP = 5
THREADS = WARP * 6
ALLOC_BARRIER = 1  # named barrier: tensor-memory address published (MMA warp + epilogue warps)
TEARDOWN_BARRIER = 2  # named barrier: every epilogue warp is done reading tensor memory
SLOT_ALIGN = 1024


class BlackwellGemm:
    def __init__(self, knobs: GemmKnobs, max_active_clusters: int):
        self.knobs = knobs
        self.tile_m, self.tile_n = knobs.tile_mn
        self.tile_k = knobs.tile_k
        self.cta_group = knobs.cta_group
        self.mma_m = self.tile_m * self.cta_group
        self.cluster = tuple(knobs.cluster_mn)
        self.stages = knobs.stages
        self.acc_stages = knobs.acc_stages
        self.epi_n = knobs.epi_tile[1]
        self.threads = THREADS
        self.tmem_cols = tmem_columns(knobs)
        self.max_active_clusters = max_active_clusters
        self.smem_bytes = None  # filled at trace time: the launch's dynamic shared memory

    # -- host side ------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
        self.ab_dtype = a.element_type
        self.c_dtype = c.element_type
        self.c_layout = utils.LayoutEnum.from_tensor(c)
        group = tcgen05.CtaGroup.TWO if self.cta_group == 2 else tcgen05.CtaGroup.ONE
        tiled_mma = sm100.make_trivial_tiled_mma(
            self.ab_dtype, utils.LayoutEnum.from_tensor(a).mma_major_mode(),
            utils.LayoutEnum.from_tensor(b).mma_major_mode(), cutlass.Float32, group, (self.mma_m, self.tile_n))
        mma_tiler = (self.mma_m, self.tile_n, self.tile_k)
        self.mma_tiler = mma_tiler
        # the cluster as (pair, M pairs, N, 1): mode 0 is the CTA inside an MMA pair
        cm, cn = self.cluster
        pairs = cute.tiled_divide(cute.make_layout((cm, cn, 1)), (tiled_mma.thr_id.shape,))
        self.mcast_a = cute.size(pairs.shape[2])  # CTAs sharing an A slice: along N
        self.mcast_b = cute.size(pairs.shape[1])  # CTAs sharing a B slice: along M (in pairs)

        sa = sm100.make_smem_layout_a(tiled_mma, mma_tiler, self.ab_dtype, self.stages)
        sb = sm100.make_smem_layout_b(tiled_mma, mma_tiler, self.ab_dtype, self.stages)
        sa_one = cute.slice_(sa, (None, None, None, 0))
        sb_one = cute.slice_(sb, (None, None, None, 0))
        tma_a, ta = cute.nvgpu.make_tiled_tma_atom_A(
            sm100.cluster_shape_to_tma_atom_A((cm, cn, 1), tiled_mma.thr_id), a, sa_one, mma_tiler, tiled_mma,
            pairs.shape)
        tma_b, tb = cute.nvgpu.make_tiled_tma_atom_B(
            sm100.cluster_shape_to_tma_atom_B((cm, cn, 1), tiled_mma.thr_id), b, sb_one, mma_tiler, tiled_mma,
            pairs.shape)
        # bytes one slot receives on the leader's barrier: both CTAs of a pair land there
        self.slot_bytes = (cute.size_in_bytes(self.ab_dtype, sa_one)
                           + cute.size_in_bytes(self.ab_dtype, sb_one)) * self.cta_group

        tiles = cute.zipped_divide(c, tiler=(self.tile_m, self.tile_n))[(0, (None, None, None))].shape
        sched = utils.PersistentTileSchedulerParams(tiles, (cm, cn, 1), self.knobs.swizzle,
                                                    self.knobs.raster == "m")
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, self.max_active_clusters)

        stages, acc_stages = self.stages, self.acc_stages

        @cute.struct
        class Storage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, stages * 2]
            acc_barriers: cute.struct.MemRange[cutlass.Int64, acc_stages * 2]
            tmem_dealloc: cutlass.Int64
            tmem_addr: cutlass.Int32
            sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sa.outer)], SLOT_ALIGN]
            sB: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sb.outer)], SLOT_ALIGN]

        self.storage = Storage
        self.smem_bytes = Storage.size_in_bytes()
        self.kernel(tiled_mma, tma_a, ta, tma_b, tb, c, pairs, sa, sb, sched).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(cm, cn, 1), stream=stream)

    # -- device side ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom,
               mB: cute.Tensor, mC: cute.Tensor, pairs: cute.Layout, sa_layout: cute.ComposedLayout,
               sb_layout: cute.ComposedLayout, sched: utils.PersistentTileSchedulerParams):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        pair_size = cute.size(tiled_mma.thr_id.shape)
        two_cta = pair_size == 2
        bidx, _, _ = cute.arch.block_idx()
        in_pair = bidx % pair_size
        leader = in_pair == 0
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        where = pairs.get_flat_coord(rank)  # (in pair, M pair, N, 0)

        if warp == TMA_WARP:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)

        smem = utils.SmemAllocator()
        st = smem.allocate(self.storage)
        # slot ring: the producer warp's TMA fills, the MMA warp's tcgen05.commit empties
        ab = pipeline.PipelineTmaUmma.create(
            barrier_storage=st.ab_barriers.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.mcast_a + self.mcast_b - 1),
            tx_count=self.slot_bytes, cta_layout_vmnk=pairs, defer_sync=True)
        # accumulator ring: the MMA warp fills a TMEM stage, every epilogue thread of the pair empties it
        acc = pipeline.PipelineUmmaAsync.create(
            barrier_storage=st.acc_barriers.data_ptr(), num_stages=self.acc_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     len(EPILOGUE_WARPS) * WARP * pair_size),
            cta_layout_vmnk=pairs, defer_sync=True)
        tmem = utils.TmemAllocator(
            st.tmem_addr.ptr, allocator_warp_id=MMA_WARP, is_two_cta=two_cta,
            two_cta_tmem_dealloc_mbar_ptr=st.tmem_dealloc.ptr,
            barrier_for_retrieve=pipeline.NamedBarrier(barrier_id=ALLOC_BARRIER,
                                                       num_threads=WARP * (1 + len(EPILOGUE_WARPS))))
        pipeline.pipeline_init_arrive(cluster_shape_mn=pairs, is_relaxed=True)

        sA = st.sA.get_tensor(sa_layout.outer, swizzle=sa_layout.inner)
        sB = st.sB.get_tensor(sb_layout.outer, swizzle=sb_layout.inner)

        gA = cute.local_tile(mA, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        gC = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
        k_blocks = cute.size(gA, mode=[3])
        thr_mma = tiled_mma.get_slice(in_pair)
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        tCgC = thr_mma.partition_C(gC)
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, where[2], cute.make_layout(cute.slice_(pairs, (0, 0, None, 0)).shape),
            cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3))
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, where[1], cute.make_layout(cute.slice_(pairs, (0, None, 0, 0)).shape),
            cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3))
        fA = tiled_mma.make_fragment_A(sA)
        fB = tiled_mma.make_fragment_B(sB)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        acc_layout = tiled_mma.make_fragment_C(cute.append(acc_shape, self.acc_stages)).layout

        pipeline.pipeline_init_wait(cluster_shape_mn=pairs)

        if warp == TMA_WARP:  # ---------------- producer
            a_mask = cpasync.create_tma_multicast_mask(pairs, where, mcast_mode=2)
            b_mask = cpasync.create_tma_multicast_mask(pairs, where, mcast_mode=1)
            tiles = utils.StaticPersistentTileScheduler.create(sched, cute.arch.block_idx(), cute.arch.grid_dim())
            work = tiles.initial_work_tile_info()
            put = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            while work.is_valid_tile:
                mi, ni, li = work.tile_idx
                a_blocks = tAgA[(None, mi // pair_size, None, li)]
                b_blocks = tBgB[(None, ni, None, li)]
                for kb in cutlass.range(k_blocks, unroll=1):
                    ab.producer_acquire(put)
                    full = ab.producer_get_barrier(put)
                    cute.copy(tma_a, a_blocks[(None, kb)], tAsA[(None, put.index)], tma_bar_ptr=full,
                              mcast_mask=a_mask if self.mcast_a > 1 or two_cta else None)
                    cute.copy(tma_b, b_blocks[(None, kb)], tBsB[(None, put.index)], tma_bar_ptr=full,
                              mcast_mask=b_mask if self.mcast_b > 1 or two_cta else None)
                    put.advance()
                tiles.advance_to_next_work()
                work = tiles.get_current_work()
            ab.producer_tail(put)

        if warp == MMA_WARP:  # ---------------- tensor memory + tcgen05.mma
            tmem.allocate(self.tmem_cols)
            tmem.wait_for_alloc()
            tAcc = cute.make_tensor(tmem.retrieve_ptr(cutlass.Float32), acc_layout)
            tiles = utils.StaticPersistentTileScheduler.create(sched, cute.arch.block_idx(), cute.arch.grid_dim())
            work = tiles.initial_work_tile_info()
            get = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            fill = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.acc_stages)
            kk = cute.size(fA, mode=[2])
            while work.is_valid_tile:
                if leader:
                    acc.producer_acquire(fill)
                    stage = tAcc[(None, None, None, fill.index)]
                    tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
                    for _kb in cutlass.range(k_blocks, unroll=1):
                        ab.consumer_wait(get)
                        for j in cutlass.range(kk, unroll_full=True):
                            cute.gemm(tiled_mma, stage, fA[(None, None, j, get.index)],
                                      fB[(None, None, j, get.index)], stage)
                            tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                        ab.consumer_release(get)  # tcgen05.commit -> the slot's empty barrier
                        get.advance()
                    acc.producer_commit(fill)  # tcgen05.commit -> the stage's full barrier
                fill.advance()
                tiles.advance_to_next_work()
                work = tiles.get_current_work()
            if leader:
                acc.producer_tail(fill)
            tmem.relinquish_alloc_permit()
            pipeline.NamedBarrier(barrier_id=TEARDOWN_BARRIER,
                                  num_threads=WARP * (1 + len(EPILOGUE_WARPS))).arrive_and_wait()
            tmem.free(tAcc.iterator)

        if warp < len(EPILOGUE_WARPS):  # ---------------- epilogue: TMEM -> registers -> global
            tmem.wait_for_alloc()
            tAcc = cute.make_tensor(tmem.retrieve_ptr(cutlass.Float32), acc_layout)
            cta_tile = (self.tile_m, self.tile_n, self.tile_k)
            epi_tile = (self.tile_m, self.epi_n)
            t2r_atom = sm100.get_tmem_load_op(cta_tile, self.c_layout, self.c_dtype, cutlass.Float32, epi_tile,
                                              two_cta)
            acc_epi = cute.flat_divide(tAcc[((None, None), 0, 0, None)], epi_tile)  # (EM, EN, 1, n_epi, stage)
            t2r = tcgen05.make_tmem_copy(t2r_atom, acc_epi[(None, None, 0, 0, 0)])
            thr_t2r = t2r.get_slice(tidx)
            tTR_t = thr_t2r.partition_S(acc_epi)  # (T2R, T2R_M, T2R_N, 1, n_epi, stage)
            gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, None, None, None)], epi_tile)
            tTR_g = thr_t2r.partition_D(gC_epi)  # (T2R, T2R_M, T2R_N, 1, n_epi, M, N, L)
            r_acc = cute.make_rmem_tensor(tTR_g[(None, None, None, 0, 0, 0, 0, 0)].shape, cutlass.Float32)
            r_out = cute.make_rmem_tensor(r_acc.shape, self.c_dtype)
            store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.c_dtype)
            n_epi = self.tile_n // self.epi_n

            tiles = utils.StaticPersistentTileScheduler.create(sched, cute.arch.block_idx(), cute.arch.grid_dim())
            work = tiles.initial_work_tile_info()
            drain = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.acc_stages)
            while work.is_valid_tile:
                mi, ni, li = work.tile_idx
                out = tTR_g[(None, None, None, 0, None, mi // pair_size, ni, li)]
                acc.consumer_wait(drain)
                for e in cutlass.range(n_epi, unroll=1):
                    cute.copy(t2r, tTR_t[(None, None, None, 0, e, drain.index)], r_acc)
                    r_out.store(r_acc.load().to(self.c_dtype))
                    cute.copy(store, r_out, out[(None, None, None, e)])
                cute.arch.fence_view_async_tmem_load()
                acc.consumer_release(drain)
                drain.advance()
                tiles.advance_to_next_work()
                work = tiles.get_current_work()
            pipeline.NamedBarrier(barrier_id=TEARDOWN_BARRIER,
                                  num_threads=WARP * (1 + len(EPILOGUE_WARPS))).arrive_and_wait()


def max_active_clusters(knobs: GemmKnobs, m: int, n: int, sm_count: int) -> int:
    """Persistent: one cluster per ``cluster size`` SMs; otherwise enough clusters for every tile."""
    cm, cn = knobs.cluster_mn
    if knobs.persistent:
        return max(1, sm_count // (cm * cn))
    return math.ceil(m / (knobs.tile_mn[0] * cm)) * math.ceil(n / (knobs.tile_mn[1] * cn))
