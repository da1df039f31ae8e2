"""How this plugin's CUTLASS C++ writes each concept of the catalog (``mosaic.catalog``).

They name this plugin's real knobs so that the ``knobs`` proposer can move them: ``knob:``/``knobs:`` name :class:`~mosaic_target_cutlass.gemm.
GemmKnobs` fields (tile_m, tile_n, tile_k, cluster_m, cluster_n, stages, kernel_schedule, epilogue_schedule,
tile_scheduler). Where the template has no knob for a concept the expression says so (``analogue`` partial
or none). A test checks every named knob is a GemmKnobs field.
"""

from mosaic.records import Construct

#: where the attention concepts are written in CUTLASS, while this plugin has no attention template
_FMHA = "no attention template in this plugin; CUTLASS's examples/88_hopper_fmha writes it"


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
    # attention: this plugin builds no attention kernel yet (GEMM only); where CUTLASS's Hopper FMHA example writes each
    _x("online-softmax-rescale", "", "none", _FMHA + ": CollectiveSoftmax (collective/fmha_collective_softmax.hpp)"),
    _x("exp2-log2e-fold", "", "none", _FMHA + ": exp2f(scale_softmax_log2 * s - scale * max) in CollectiveSoftmax"),
    _x("two-mma-pipeline", "", "none", _FMHA + ": the warp-specialised mainloop (fmha_collective_tma_warpspecialized.hpp)"),
    _x("causal-block-skip", "", "none", _FMHA + ": the causal fusion's masks and trip counts (collective/fmha_fusion.hpp)"),
    _x("gqa-head-mapping", "", "none", _FMHA),
    _x("p-operand-source", "", "none", _FMHA),
)
