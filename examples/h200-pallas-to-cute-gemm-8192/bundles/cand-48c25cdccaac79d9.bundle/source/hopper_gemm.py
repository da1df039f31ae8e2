"""The project's warp-specialised Hopper GEMM in CuTe DSL: C[m, n] = A[m, k] @ B[k, n] (bf16/f16 in,
fp32 accumulate, same-type out).

Roles inside a CTA of ``128 * (1 + consumers)`` threads:

* warpgroup 0 is the producer: it gives registers back (setmaxnreg dec) and its first warp walks the
  tiles the scheduler hands it, issuing TMA loads of A and B k-blocks into a ``stages``-deep ring of
  shared-memory slots. Each slot has a full/empty mbarrier pair (PipelineTmaAsync): the producer waits
  for "empty", arms "full" with the byte count, the TMA completes it. With a cluster, A is multicast
  along the cluster's N dimension and B along its M dimension.
* warpgroups 1.. are consumers (setmaxnreg inc), each owning 64 rows of the tile: they wait for "full",
  issue wgmma from the swizzled shared-memory slots, keep one wgmma batch in flight, and release the
  previous slot. The epilogue converts the fp32 accumulators, writes ``epi_tile`` sub-tiles to shared
  memory (stmatrix), fences the async proxy, and one warp TMA-stores each sub-tile.

Epilogue groups. The register->smem copy is built from an MMA whose rows the copying threads own, so one
epilogue sub-tile must span exactly the rows of the warpgroups that write it: ``epi_tile[0] == tile_m``
makes all consumer warpgroups one group (one staging ring, one named barrier over all of them, the first
consumer warp stores), ``epi_tile[0] == 64`` with two consumer warpgroups makes each warpgroup its own
group (its own staging ring and named barrier, its first warp stores its 64-row sub-tiles). Any other
height is rejected by the knobs and again at trace time (:meth:`HopperGemm._check_epilogue`): a 64-row
sub-tile under a copy that spans 128 rows made warpgroup 2 write past the staging buffer (past the end of
dynamic shared memory for the second buffer) and read accumulator registers it does not own -- the
"illegal memory access" of every tuned config on the H200 on 2026-11-30.

Tile order comes from the static persistent tile scheduler in both modes: ``persistent=True`` launches
``sm_count`` CTAs (clusters) that loop over tiles; ``persistent=False`` launches one CTA per tile. The
scheduler's ``swizzle``/``raster`` knobs choose the walk order.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90

from mosaic_target_cute.knobs import GemmKnobs

WARPGROUP = 128
PRODUCER_REGS = 40
CONSUMER_REGS = 232
EPI_STAGES = 2
SLOT_ALIGN = 1024


class HopperGemm:
    def __init__(self, knobs: GemmKnobs, max_active_clusters: int):
        self.knobs = knobs
        self.tile_m, self.tile_n = knobs.tile_mn
        self.tile_k = knobs.tile_k
        self.cluster = tuple(knobs.cluster_mn)
        self.consumers = knobs.consumer_warpgroups
        self.threads = WARPGROUP * (1 + self.consumers)
        self.stages = knobs.stages
        self.epi_tile = tuple(knobs.epi_tile)
        # epilogue groups: 1 (all consumer warpgroups share each sub-tile) or one per consumer warpgroup
        self.epi_groups = self.tile_m // self.epi_tile[0]
        if self.epi_groups not in (1, self.consumers):
            raise ValueError(f"epi_tile[0]={self.epi_tile[0]} must be tile_m={self.tile_m} or 64 "
                             f"(one sub-tile per consumer warpgroup)")
        self.epi_group_threads = WARPGROUP * self.consumers // self.epi_groups
        self.epi_subtiles_per_group = (self.tile_m // self.epi_tile[0]) * (self.tile_n // self.epi_tile[1]) \
            // self.epi_groups
        self.max_active_clusters = max_active_clusters
        self.smem_bytes = None  # filled at trace time: the launch's dynamic shared memory

    # -- host side ------------------------------------------------------------------------------------
    def _layouts(self, a_layout, b_layout, c_layout):
        tk = self.tile_k

        def staged(layout, dtype, rows, major_is_k):
            atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
                sm90.get_smem_layout_atom(layout, dtype, tk if major_is_k else rows), dtype)
            return cute.tile_to_shape(atom, (rows, tk, self.stages), order=(0, 1, 2) if major_is_k else (1, 0, 2))

        k_major = cute.nvgpu.warpgroup.OperandMajorMode.K
        sa = staged(a_layout, self.ab_dtype, self.tile_m, a_layout.sm90_mma_major_mode() == k_major)
        sb = staged(b_layout, self.ab_dtype, self.tile_n, b_layout.sm90_mma_major_mode() == k_major)
        em, en = self.epi_tile
        c_atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90.get_smem_layout_atom(c_layout, self.c_dtype, en if c_layout.is_n_major_c() else em), self.c_dtype)
        sc = cute.tile_to_shape(c_atom, (em, en, EPI_STAGES * self.epi_groups),
                                order=(1, 0, 2) if c_layout.is_m_major_c() else (0, 1, 2))
        return sa, sb, sc

    def _mmas(self, a_layout, b_layout):
        """The mainloop's tiled MMA (consumer warpgroups stacked along M) and the MMA whose rows one epilogue
        group owns (the register->smem copy is built from it)."""
        def mma(warpgroups):
            return sm90.make_trivial_tiled_mma(
                self.ab_dtype, self.ab_dtype, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
                cutlass.Float32, (warpgroups, 1, 1), tiler_mn=(64, self.tile_n))

        tiled_mma = mma(self.consumers)
        return tiled_mma, (tiled_mma if self.epi_groups == 1 else mma(1))

    def _r2s(self, epi_mma):
        """The epilogue's register->smem tiled copy (stmatrix), over the rows of one epilogue group."""
        store_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(self.c_layout.is_m_major_c(), 4), self.c_dtype)
        return cute.make_tiled_copy_S(
            sm90.sm90_get_smem_store_op(self.c_layout, elem_ty_d=self.c_dtype, elem_ty_acc=cutlass.Float32),
            cute.make_tiled_copy_C_atom(store_atom, epi_mma))

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
        self.ab_dtype = a.element_type
        self.c_dtype = c.element_type
        a_layout = utils.LayoutEnum.from_tensor(a)
        b_layout = utils.LayoutEnum.from_tensor(b)
        c_layout = utils.LayoutEnum.from_tensor(c)
        self.c_layout = c_layout

        tiled_mma, epi_mma = self._mmas(a_layout, b_layout)
        sa, sb, sc = self._layouts(a_layout, b_layout, c_layout)

        cm, cn = self.cluster
        a_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp() if cn == 1
                else cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp())
        b_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp() if cm == 1
                else cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp())
        tma_a, ta = cute.nvgpu.cpasync.make_tiled_tma_atom(
            a_op, a, cute.slice_(sa, (None, None, 0)), (self.tile_m, self.tile_k), num_multicast=cn)
        tma_b, tb = cute.nvgpu.cpasync.make_tiled_tma_atom(
            b_op, b, cute.slice_(sb, (None, None, 0)), (self.tile_n, self.tile_k), num_multicast=cm)
        tma_c, tc = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), c, cute.slice_(sc, (None, None, 0)), self.epi_tile)

        tiles = cute.zipped_divide(c, tiler=(self.tile_m, self.tile_n))[(0, (None, None, None))].shape
        sched = utils.PersistentTileSchedulerParams(tiles, (cm, cn, 1), self.knobs.swizzle,
                                                    self.knobs.raster == "m")
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, self.max_active_clusters)

        stages = self.stages

        @cute.struct
        class Storage:
            barriers: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sa)], SLOT_ALIGN]
            sB: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sb)], SLOT_ALIGN]
            sC: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(sc)], SLOT_ALIGN]

        self.storage = Storage
        self.smem_bytes = Storage.size_in_bytes()
        self.kernel(tma_a, ta, tma_b, tb, tma_c, tc, tiled_mma, epi_mma, sa, sb, sc, sched).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(cm, cn, 1), min_blocks_per_mp=1, stream=stream)

    def _check_epilogue(self, r2s, acc_values: int, per_frag: int, n_epi: int) -> None:
        """Trace-time proof that the epilogue's register->smem copy fits its sub-tile and reads exactly the
        accumulators the thread owns (both were violated by a 64-row sub-tile under a 128-row copy)."""
        rows = cute.size(r2s.tiler_mn[0])
        if rows != self.epi_tile[0]:
            raise ValueError(f"epilogue copy spans {rows} rows but epi_tile is {self.epi_tile}: the copy would "
                             "write outside its shared-memory sub-tile")
        if n_epi * per_frag != acc_values:
            raise ValueError(f"epilogue reads {n_epi} sub-tiles x {per_frag} values but a thread holds "
                             f"{acc_values} accumulators")

    # -- device side ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_c: cute.CopyAtom, mC: cute.Tensor, tiled_mma: cute.TiledMma, epi_mma: cute.TiledMma,
               sa_layout: cute.ComposedLayout, sb_layout: cute.ComposedLayout, sc_layout: cute.ComposedLayout,
               sched: utils.PersistentTileSchedulerParams):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        cm, cn = self.cluster

        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_c)

        cta_layout = cute.make_layout((cm, cn, 1))
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        coord = cta_layout.get_flat_coord(rank)
        a_mask = cute.make_layout_image_mask(cta_layout, coord, mode=1) if cn > 1 else 0
        b_mask = cute.make_layout_image_mask(cta_layout, coord, mode=0) if cm > 1 else 0

        smem = utils.SmemAllocator()
        st = smem.allocate(self.storage)
        slot_bytes = (cute.size_in_bytes(self.ab_dtype, cute.slice_(sa_layout, (None, None, 0)))
                      + cute.size_in_bytes(self.ab_dtype, cute.slice_(sb_layout, (None, None, 0))))
        # every consumer warp of every CTA that received a multicast slot releases it
        releases = (cm + cn - 1) * self.consumers * 4
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.barriers.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, releases),
            tx_count=slot_bytes, cta_layout_vmnk=cute.make_layout((1, cm, cn, 1)), defer_sync=True)
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster, is_relaxed=True)

        sA = st.sA.get_tensor(sa_layout.outer, swizzle=sa_layout.inner)
        sB = st.sB.get_tensor(sb_layout.outer, swizzle=sb_layout.inner)
        sC = st.sC.get_tensor(sc_layout.outer, swizzle=sc_layout.inner)

        gA = cute.local_tile(mA, (self.tile_m, self.tile_k), (None, None, None))  # (bM, bK, M/bM, K/bK, L)
        gB = cute.local_tile(mB, (self.tile_n, self.tile_k), (None, None, None))  # (bN, bK, N/bN, K/bK, L)
        gC = cute.local_tile(mC, (self.tile_m, self.tile_n), (None, None, None))  # (bM, bN, M/bM, N/bN, L)
        k_blocks = cute.size(gA, mode=[3])

        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, coord[1], cute.make_layout(cn), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_b, coord[0], cute.make_layout(cm), cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster)

        if wg == 0:  # ---------------- producer warpgroup
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                tiles = utils.StaticPersistentTileScheduler.create(sched, cute.arch.block_idx(),
                                                                   cute.arch.grid_dim())
                work = tiles.initial_work_tile_info()
                put = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                while work.is_valid_tile:
                    mi, ni, li = work.tile_idx
                    a_blocks = tAgA[(None, mi, None, li)]
                    b_blocks = tBgB[(None, ni, None, li)]
                    put.reset_count()
                    for _kb in range(k_blocks):
                        pipe.producer_acquire(put)
                        full = pipe.producer_get_barrier(put)
                        cute.copy(tma_a, a_blocks[(None, put.count)], tAsA[(None, put.index)],
                                  tma_bar_ptr=full, mcast_mask=a_mask)
                        cute.copy(tma_b, b_blocks[(None, put.count)], tBsB[(None, put.index)],
                                  tma_bar_ptr=full, mcast_mask=b_mask)
                        pipe.producer_commit(put)
                        put.advance()
                    tiles.advance_to_next_work()
                    work = tiles.get_current_work()
                pipe.producer_tail(put)

        if wg > 0:  # ---------------- consumer warpgroups
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            ctid = tidx - WARPGROUP
            thr_mma = tiled_mma.get_slice(cute.make_layout(self.consumers, stride=WARPGROUP)(wg - 1))
            fA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            fB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            acc = cute.make_rmem_tensor(thr_mma.partition_C(gC).shape[:3], cutlass.Float32)
            kk = cute.size(fA, mode=[2])

            # epilogue group of this warpgroup, and this thread's index inside it
            # (static when the group is all consumers: the same code as before for that case)
            group = 0 if self.epi_groups == 1 else ctid // self.epi_group_threads
            gtid = ctid if self.epi_groups == 1 else ctid % self.epi_group_threads
            store_warp = cute.arch.make_warp_uniform(gtid // 32) == 0  # the group's first warp stores
            r2s = self._r2s(epi_mma)
            thr_r2s = r2s.get_slice(gtid)
            dst = thr_r2s.partition_D(sC)
            acc_view = r2s.retile(acc)
            frag_shape = cute.make_layout(cute.shape(thr_r2s.partition_S(sC))[:3]).shape
            frag = cute.make_rmem_tensor(frag_shape, cutlass.Float32)
            frag_out = cute.make_rmem_tensor(frag_shape, self.c_dtype)
            per_frag = cute.size(frag)
            n_epi = self.epi_subtiles_per_group
            self._check_epilogue(r2s, cute.size(acc), per_frag, n_epi)
            epi_barrier = pipeline.NamedBarrier(barrier_id=1 + group, num_threads=self.epi_group_threads)
            stores = pipeline.PipelineTmaStore.create(
                num_stages=EPI_STAGES,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.epi_group_threads))

            tiles = utils.StaticPersistentTileScheduler.create(sched, cute.arch.block_idx(), cute.arch.grid_dim())
            work = tiles.initial_work_tile_info()
            get = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            done = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            while work.is_valid_tile:
                mi, ni, li = work.tile_idx
                get.reset_count()
                done.reset_count()
                acc.fill(0.0)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.fence()
                for kb in range(k_blocks):
                    pipe.consumer_wait(get)
                    for j in cutlass.range_constexpr(kk):
                        cute.gemm(tiled_mma, acc, fA[(None, None, j, get.index)], fB[(None, None, j, get.index)],
                                  acc)
                    cute.nvgpu.warpgroup.commit_group()
                    get.advance()
                    if kb > 0:  # the batch before this one has finished reading its slot
                        cute.nvgpu.warpgroup.wait_group(1)
                        pipe.consumer_release(done)
                        done.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                pipe.consumer_release(done)
                done.advance()

                # epilogue: registers -> smem (stmatrix) -> TMA store, one epi_tile at a time
                by_epi = cute.zipped_divide(gC[(None, None, mi, ni, li)], self.epi_tile)
                src, out = cute.nvgpu.cpasync.tma_partition(tma_c, 0, cute.make_layout(1),
                                                            cute.group_modes(sC, 0, 2), by_epi)
                epi_shape = by_epi.shape[1]  # (tile_m / epi_m, tile_n / epi_n) sub-tiles, row-major walk
                epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
                before = tiles.num_tiles_executed * n_epi
                for e in cutlass.range_constexpr(n_epi):
                    for v in cutlass.range_constexpr(per_frag):
                        frag[v] = acc_view[e * per_frag + v]
                    frag_out.store(frag.load().to(self.c_dtype))
                    buf = group * EPI_STAGES + (before + e) % EPI_STAGES
                    cute.copy(r2s, frag_out, dst[(None, None, None, buf)])
                    cute.arch.fence_proxy("async.shared", space="cta")
                    epi_barrier.arrive_and_wait()
                    if store_warp:
                        if cutlass.const_expr(self.epi_groups == 1):
                            where = epi_order.get_hier_coord(e)
                        else:  # group g owns sub-tile row g (its warpgroup's 64 rows)
                            where = (group, e)
                        cute.copy(tma_c, src[(None, buf)], out[(None, where)])
                        stores.producer_commit()
                        stores.producer_acquire()
                    epi_barrier.arrive_and_wait()
                tiles.advance_to_next_work()
                work = tiles.get_current_work()
            stores.producer_tail()


def max_active_clusters(knobs: GemmKnobs, m: int, n: int, sm_count: int) -> int:
    """Persistent: one cluster per ``cluster size`` SMs; otherwise enough clusters for every tile."""
    cm, cn = knobs.cluster_mn
    if knobs.persistent:
        return max(1, sm_count // (cm * cn))
    return math.ceil(m / (knobs.tile_mn[0] * cm)) * math.ceil(n / (knobs.tile_mn[1] * cn))
