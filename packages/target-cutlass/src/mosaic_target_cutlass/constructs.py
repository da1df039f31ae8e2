"""How this plugin's CUTLASS C++ writes each concept of the catalog (``mosaic.catalog``).

They name this plugin's real knobs so that the ``knobs`` proposer can move them: ``knob:``/``knobs:`` name :class:`~mosaic_target_cutlass.gemm.
GemmKnobs` fields (tile_m, tile_n, tile_k, cluster_m, cluster_n, stages, kernel_schedule, epilogue_schedule,
tile_scheduler), and in the six concepts attention adds :class:`~mosaic_target_cutlass.attention.AttentionKnobs`
fields (block_m, block_n, stages, consumer_warpgroups, causal_skip, p_in; templates/attention_sm90.cuh). Where the
template has no knob for a concept the expression says so (``analogue`` partial or none). A test checks every named
knob is a field of the family's knob class.
"""

from mosaic.records import Construct

#: the concepts attention adds, as the attention template (templates/attention_sm90.cuh) writes them
_ATTENTION = "templates/attention_sm90.cuh (CuTe C++, sm_90a; lowered on the CPU, not yet run on a GPU)"


def _x(concept: str, expression: str, analogue: str = "direct", notes: str = "") -> Construct:
    return Construct(concept=concept, language="cutlass", expression=expression, analogue=analogue, notes=notes)


CONSTRUCTS = (
    _x("tma-load", "make_tma_copy(SM90_TMA_LOAD{}, ...); collective MainloopSm90TmaGmmaWarpSpecialized "
       "(every kernel schedule of the template)"),
    _x("tma-store", "SM90_TMA_STORE atom; epilogue TmaWarpSpecialized[Cooperative]; knob: epilogue_schedule"),
    _x("tma-multicast", "SM90_TMA_LOAD_MULTICAST over the cluster (ClusterShape > 1); knobs: cluster_m, cluster_n"),
    _x("tma-descriptor-prefetch", "cute::prefetch_tma_descriptor (always emitted by the collective)", "partial",
       "not a knob of the template"),
    _x("cp-async", "SM80_CP_ASYNC_CACHEGLOBAL copy atom (an sm80 mainloop)", "none",
       "the template builds the sm90 TMA mainloop only"),
    _x("plain-global-load", "AutoVectorizingCopy (epilogue source loads)", "partial", "not a knob of the template"),
    _x("ldmatrix", "SM75_U32x4_LDSM_N copy atom", "partial", "chosen by the CollectiveBuilder"),
    _x("stmatrix", "SM90_U32x4_STSM_N copy atom in the TMA epilogue; knob: epilogue_schedule"),
    _x("mbarrier-init", "cutlass::arch::ClusterTransactionBarrier::init (PipelineTmaAsync)"),
    _x("mbarrier-arrive", "PipelineTmaAsync::consumer_release; knob: stages"),
    _x("mbarrier-wait", "PipelineTmaAsync::consumer_wait; knob: stages"),
    _x("mbarrier-expect-tx", "PipelineTmaAsync::producer_acquire (arrive_and_expect_tx)"),
    _x("wgmma", "SM90 GMMA atom 64xNx16 chosen by the CollectiveBuilder from the CTA tile; knobs: tile_n, tile_m, "
       "tile_k"),
    _x("wgmma-fence-commit-wait", "warpgroup_arrive / warpgroup_commit_batch / warpgroup_wait<N> in the "
       "collective mainloop; knob: kernel_schedule"),
    _x("tcgen05-mma", "CollectiveBuilder<arch::Sm100, ...> (templates/gemm_sm100.cu): UMMA atoms "
       "SM100_MMA_F16BF16_SS; knob: kernel_schedule"),
    _x("tmem-alloc", "the sm100 kernel schedule's TMEM allocator (KernelTmaWarpSpecialized1SmSm100 / 2SmSm100)",
       "partial", "allocated by the collective; no knob sets the columns"),
    _x("tmem-load-store", "SM100_TMEM_LOAD copy atoms chosen by the TmaWarpSpecialized1Sm/2Sm epilogue", "partial",
       "chosen by the epilogue collective, not a knob"),
    _x("tcgen05-commit", "umma_arrive / umma_arrive_multicast_2x1SM inside the sm100 mainloop collective",
       "partial", "emitted by the collective"),
    _x("cta-pair-mma", "kernel_schedule='sm100-2sm' (KernelTmaWarpSpecialized2SmSm100, a cluster M of 2); knobs: "
       "kernel_schedule, cluster_m"),
    _x("mma-sync", "SM80 MMA atoms", "none", "the template builds sm90 GMMA only"),
    _x("fma-simt", "UniversalFMA MMA atom", "none", "the template builds sm90 GMMA only"),
    _x("cta-tile", "TileShape Shape<_M,_N,_K> template argument of the CollectiveBuilder (GMMA atom, smem stages "
       "and TMA boxes follow from it); knobs: tile_n, tile_m, tile_k"),
    _x("warpgroup", "128-thread warpgroups; the kernel schedule sets producer and consumer warpgroups; knobs: "
       "kernel_schedule, tile_m"),
    _x("warp-specialization", "KernelTmaWarpSpecialized / ...Cooperative / ...Pingpong; knob: kernel_schedule"),
    _x("setmaxnreg", "warpgroup_reg_alloc / warpgroup_reg_dealloc inside the warp-specialised kernels; knob: "
       "kernel_schedule"),
    _x("pipeline-stage", "StageCount<N> / StageCountAutoCarveout, PipelineTmaAsync<Stages>; knob: stages"),
    _x("persistent-tile-loop", "PersistentTileSchedulerSm90 (Cooperative/Pingpong are persistent, tma-ws is not); "
       "knobs: kernel_schedule, tile_scheduler"),
    _x("tile-raster-swizzle", "scheduler arguments raster_order / max_swizzle_size", "partial",
       "run-time scheduler arguments the template does not expose as knobs"),
    _x("smem-swizzle", "GMMA::Layout_K_SW128_Atom via ss_smem_selector", "partial", "chosen by the CollectiveBuilder"),
    _x("cluster-launch", "ClusterShape Shape<_M,_N,_1> template argument; knobs: cluster_m, cluster_n"),
    _x("cluster-barrier", "cute::cluster_arrive_relaxed / cluster_wait (clusters > 1); knobs: cluster_m, cluster_n"),
    _x("named-barrier", "cutlass::arch::NamedBarrier (consumer warpgroups); knob: kernel_schedule"),
    _x("fence-proxy-async", "cutlass::arch::fence_view_async_shared() (TMA epilogue); knob: epilogue_schedule"),
    _x("epilogue-tma-store", "epilogue TmaWarpSpecialized / TmaWarpSpecializedCooperative; knob: epilogue_schedule"),
    _x("epilogue-direct-store", "epilogue NoSmemWarpSpecialized; knob: epilogue_schedule"),
    _x("elect-one", "cute::elect_one_sync()", "partial", "emitted by the collectives"),
    _x("split-k", "StreamKScheduler on the cooperative kernel; knob: tile_scheduler"),
    _x("approximate-exp", "cutlass::fast_exp / --use_fast_math", "none", "no exponential in a GEMM epilogue here"),
    _x("fma-contraction", "nvcc -fmad=true (default)", "partial", "a compiler flag, not a knob"),
    _x("approximate-reciprocal", "cutlass::fast_divide / -prec-div=false", "none", "no division in the GEMM"),
    _x("bf16-conversion", "NumericArrayConverter<bfloat16_t, float, N, round_to_nearest> in the epilogue"),
    # attention: the attention template's expression of the concepts it adds; knobs are AttentionKnobs fields
    _x("online-softmax-rescale", "running row max and per-thread partial row sums in registers, the max reduced "
       "over the quad (__shfl_xor_sync 1, 2), O rows *= exp2(m_old * c - m_new * c), the sums reduced over the quad "
       "once in the epilogue; knobs: block_n", notes=_ATTENTION),
    _x("exp2-log2e-fold", "c = log2(e) / sqrt(head_dim) in Params::scale_log2: ex2.approx(fma(s, c, -m * c)), one "
       "FFMA + one MUFU.EX2 per score", notes=_ATTENTION),
    _x("two-mma-pipeline", "two TiledMMAs per key block: S = Q K^T (ss_op_selector 64 x block_n) then O += P V "
       "(64 x head_dim, V's smem seen MN-major), K and V in separate stages-deep mbarrier rings fed by one TMA "
       "thread of the producer warpgroup; knobs: stages, block_n, consumer_warpgroups",
       notes=_ATTENTION + "; no intra-warpgroup S/PV overlap and no ping-pong between consumer warpgroups yet"),
    _x("causal-block-skip", "key blocks visited = ceil(min((m+1) block_m, seq) / block_n), masked from "
       "m block_m / block_n (key_blocks<Cfg>); causal CTAs launched last query block first; knob: causal_skip",
       notes=_ATTENTION),
    _x("gqa-head-mapping", "kv_index(batch, head, heads, kv_heads) = batch * kv_heads + head / (heads / kv_heads) "
       "picks the K/V TMA coordinate", notes=_ATTENTION + "; no packing of a kv head's query heads into one tile"),
    _x("p-operand-source", "P as the A operand of the second wgmma: registers (rs_op_selector; the S accumulator's "
       "values re-viewed as the ((2,2,2), MMA_M, MMA_K) A fragment) or shared memory (st.shared of value pairs into "
       "a 128-byte swizzled tile, fence.proxy.async, a named barrier per warpgroup, ss_op_selector); knob: p_in",
       notes=_ATTENTION),
)
