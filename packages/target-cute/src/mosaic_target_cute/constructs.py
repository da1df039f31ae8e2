"""How CuTe DSL (cutlass.cute, Python) writes each concept of the catalog (``mosaic.catalog``); ``knob:``
names a field of this plugin's knob classes (GemmKnobs, AttentionKnobs).

:data:`ATTENTION_CONSTRUCTS` are the concepts the attention forward adds (kernels/hopper_attention.py). Core's
catalog does not name them yet, so :func:`registered` leaves each out until its concept exists there (a construct
naming an unknown concept is a ``catalog-unknown-concept`` problem); the concept names proposed for core are
these entries' ``concept`` fields."""

from mosaic.records import Construct


def _q(concept: str, expression: str, analogue: str = "direct", notes: str = "") -> Construct:
    return Construct(concept=concept, language="cute", expression=expression, analogue=analogue, notes=notes)


CONSTRUCTS = (
    _q("tma-load", "cute.nvgpu.cpasync.make_tiled_tma_atom(CopyBulkTensorTileG2SOp(), ...); "
       "cute.copy(atom, g, s, tma_bar_ptr=...)"),
    _q("tma-store", "make_tiled_tma_atom(CopyBulkTensorTileS2GOp(), ...); cute.copy(atom, s, g)"),
    _q("tma-multicast", "CopyBulkTensorTileG2SMulticastOp + cute.copy(..., mcast_mask=...); knob: cluster_mn"),
    _q("tma-descriptor-prefetch", "cute.nvgpu.cpasync.prefetch_descriptor(tma_atom)"),
    _q("cp-async", "cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), dtype, num_bits_per_copy=128)"),
    _q("plain-global-load", "tensor[i] / tensor.load() on a gmem tensor; knob: kernel='naive'"),
    _q("ldmatrix", "cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(...), dtype)"),
    _q("stmatrix", "cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(...), dtype) in the epilogue"),
    _q("mbarrier-init", "cute.arch.mbarrier_init(ptr, count) / pipeline.PipelineTmaAsync.create(...)"),
    _q("mbarrier-arrive", "cute.arch.mbarrier_arrive(ptr) / pipeline.consumer_release(state)"),
    _q("mbarrier-wait", "cute.arch.mbarrier_wait(ptr, phase) / pipeline.consumer_wait(state)"),
    _q("mbarrier-expect-tx", "PipelineTmaAsync.create(tx_count=bytes) + producer_acquire(state)"),
    _q("wgmma", "sm90_utils.make_trivial_tiled_mma(...) (MmaF16BF16Op); cute.gemm(tiled_mma, acc, a, b, acc)"),
    _q("wgmma-fence-commit-wait", "cute.nvgpu.warpgroup.fence(); commit_group(); wait_group(n)"),
    _q("tcgen05-mma", "sm100 helpers' make_trivial_tiled_mma(..., tcgen05.CtaGroup.ONE|TWO, (M, N)); "
       "cute.gemm(tiled_mma, tmem_acc, a, b, tmem_acc) from the MMA warp; knob: kernel='blackwell'"),
    _q("tmem-alloc", "cutlass.utils.TmemAllocator(...).allocate(cols) / wait_for_alloc() / retrieve_ptr() / "
       "relinquish_alloc_permit() / free(ptr); knobs: tile_mn[1] x acc_stages columns"),
    _q("tmem-load-store", "tcgen05.make_tmem_copy(get_tmem_load_op(...), tmem_tile) + cute.copy in the epilogue "
       "warps; knob: epi_tile[1] (columns per tcgen05.ld)"),
    _q("tcgen05-commit", "pipeline.PipelineTmaUmma.consumer_release / PipelineUmmaAsync.producer_commit "
       "(tcgen05.commit on the slot's / accumulator's mbarrier)"),
    _q("cta-pair-mma", "tcgen05.CtaGroup.TWO with a cluster M of 2; knobs: cta_group=2, cluster_mn"),
    _q("mma-sync", "cute.nvgpu.warp.MmaF16BF16Op(ab_dtype, acc_dtype, (16, 8, 16))"),
    _q("fma-simt", "a Python loop over k of acc += a[i, k] * b[j, k] on scalars; knob: kernel='naive'"),
    _q("cta-tile", "the CTA tile (bM, bN, bK): tiled MMA over tile_mn[0] // 64 consumer warpgroups, TMA boxes and "
       "smem stage layouts of (bM, bK) and (bN, bK); knobs: tile_mn, tile_k"),
    _q("warpgroup", "tiled MMA atom layout over warpgroups (128 threads each)"),
    _q("warp-specialization", "branch on the warpgroup index: producer warp issues TMA, consumer warpgroups "
       "wgmma (this plugin's hopper gemm)"),
    _q("setmaxnreg", "cute.arch.setmaxregister_decrease(n) / setmaxregister_increase(n)"),
    _q("pipeline-stage", "pipeline.PipelineTmaAsync(num_stages=...); knob: stages"),
    _q("persistent-tile-loop", "cutlass.utils.StaticPersistentTileScheduler; knob: persistent"),
    _q("tile-raster-swizzle", "utils.PersistentTileSchedulerParams(swizzle_size, raster_along_m); knobs: "
       "raster, swizzle"),
    _q("smem-swizzle", "cute.nvgpu.warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(...))"),
    _q("cluster-launch", "kernel.launch(cluster=(cm, cn, 1)); knob: cluster_mn"),
    _q("cluster-barrier", "cute.arch.cluster_arrive(); cute.arch.cluster_wait()"),
    _q("named-barrier", "pipeline.NamedBarrier(barrier_id=, num_threads=).arrive_and_wait()"),
    _q("fence-proxy-async", "cute.arch.fence_proxy('async.shared', space='cta')"),
    _q("epilogue-tma-store", "registers -> smem (StMatrix) -> TMA store per epilogue tile; knob: epi_tile"),
    _q("epilogue-direct-store", "gmem_tensor[i, j] = value (naive kernel)"),
    _q("elect-one", "cute.arch.elect_one()"),
    _q("split-k", "", "none", "no split-K in this plugin's kernels; would be a rewrite (grid over k + fix-up)"),
    _q("approximate-exp", "cute.math.exp2(x, fastmath=True)"),
    _q("fma-contraction", "fastmath flags on arithmetic / explicit cute.arch.fma", "partial"),
    _q("approximate-reciprocal", "cute.arch.rcp_approx(x)"),
    _q("bf16-conversion", "acc_vec.to(cutlass.BFloat16) on a TensorSSA"),
)


#: what the attention forward adds; ``knob(s):`` name AttentionKnobs fields
ATTENTION_CONSTRUCTS = (
    _q("online-softmax-rescale", "running row max/sum in registers: new_max = scores.reduce(MAX, row_max) + "
       "cute.arch.warp_reduction_max(threads_in_group=4); O rows *= cute.math.exp2((m_old - m_new) * c), row sums "
       "partial per thread, summed over the quad once in the epilogue; knobs: block_n",
       notes="kernels/hopper_attention.py HopperAttention.step; the naive kernel does the same per row with exp"),
    _q("exp2-log2e-fold", "c = log2(e) / sqrt(head_dim) folded at trace time: cute.math.exp2(s * c - m * c, "
       "fastmath=True) (FFMA + MUFU.EX2 per score; the naive kernel uses cute.math.exp)"),
    _q("two-mma-pipeline", "two tiled MMAs per key block: S = Q K^T (SS wgmma, tiler (64, block_n)) then O += P V "
       "(tiler (64, head_dim), V's smem seen MN-major); K and V in separate PipelineTmaAsync rings; knobs: "
       "stages, block_n, pingpong", notes="pingpong: named barriers pass the tensor cores between two consumer "
       "warpgroups; no intra-warpgroup S/PV overlap yet"),
    _q("causal-block-skip", "key blocks visited = ceil(min((m+1) block_m, seq) / block_n); masked loop over "
       "[m block_m // block_n, visited), unmasked below; causal CTAs launched in reverse m order; knob: "
       "causal_skip"),
    _q("gqa-head-mapping", "L = batch*heads: kv index (l // heads) * kv_heads + (l % heads) // (heads // kv_heads) "
       "picks the K/V TMA coordinate (kv_head_index)", notes="no packing of a kv head's query heads into one tile"),
    _q("p-operand-source", "P as the A operand of the second wgmma: registers (OperandSource.RMEM, the accumulator "
       "re-viewed as ((2,2,2), MMA_M, MMA_K)) or shared memory (StMatrix + fence_proxy + named barrier, "
       "OperandSource.SMEM); knob: p_in"),
)
