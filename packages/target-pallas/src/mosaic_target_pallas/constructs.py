"""How Pallas Mosaic GPU writes each concept of the catalog (``mosaic.catalog``): the code construct or the
knob (``knob:``/``knobs:`` name fields of the Pallas knob classes: GemmKnobs, and RmsnormKnobs/SoftmaxKnobs for the
row-wise kernels; the ``knobs`` proposer skips a name the kernel's class lacks), and ``analogue='none'`` where
Pallas has no direct way to say it."""

from mosaic.records import Construct


def _p(concept: str, expression: str, analogue: str = "direct", notes: str = "") -> Construct:
    return Construct(concept=concept, language="pallas", expression=expression, analogue=analogue, notes=notes)


CONSTRUCTS = (
    _p("tma-load", "plgpu.copy_gmem_to_smem(src, dst, barrier) or a plgpu.BlockSpec in emit_pipeline; "
       "knobs: copy='tma', tma_cols"),
    _p("tma-store", "plgpu.copy_smem_to_gmem(smem, gmem); plgpu.wait_smem_to_gmem(n)"),
    _p("tma-multicast", "BlockSpec(collective_axes=('cluster',)); knob: cluster_dimension"),
    _p("tma-descriptor-prefetch", "(automatic: Mosaic GPU emits descriptor handling)", "partial",
       "not controllable from Pallas"),
    _p("cp-async", "", "none", "Mosaic GPU copies through TMA only; no per-thread cp.async API"),
    _p("plain-global-load", "ref[...] / plgpu.load(optimized=False) on a GMEM ref (vector load); row-wise "
       "kernels: knobs: copy='direct', vector", "partial",
       "Mosaic GPU chooses the access width from the layout (row-wise kernels: vector elements per lane)"),
    _p("ldmatrix", "(layout lowering of smem_ref[...] loads)", "partial", "chosen by layout inference"),
    _p("stmatrix", "smem_ref[...] = acc.astype(dtype) (layout lowering)", "partial",
       "chosen by layout inference"),
    _p("mbarrier-init", "plgpu.Barrier(num_arrivals=n) as a scratch / run_scoped allocation"),
    _p("mbarrier-arrive", "plgpu.barrier_arrive(barrier)"),
    _p("mbarrier-wait", "plgpu.barrier_wait(barrier)"),
    _p("mbarrier-expect-tx", "implicit in plgpu.copy_gmem_to_smem(..., barrier)", "partial"),
    _p("wgmma", "plgpu.wgmma(acc_ref, a_smem, b_smem) with plgpu.ACC accumulators"),
    _p("wgmma-fence-commit-wait", "plgpu.wgmma_wait(n); knob: delay_release (pipelined kernel)"),
    _p("tcgen05-mma", "plgpu.tcgen05_mma(acc_tmem, a_smem, b_smem) in a Mosaic GPU kernel for sm_100a", "none",
       "this plugin's kernels lower Hopper's wgmma; jax's Blackwell matmul is not one of them"),
    _p("tmem-alloc", "plgpu.TMEM scratch shapes (allocated and freed by the Mosaic GPU lowering)", "none",
       "no tensor memory in this plugin's kernels (they target sm_90a)"),
    _p("tmem-load-store", "plgpu.async_load_tmem / async_store_tmem", "none",
       "no tensor memory in this plugin's kernels (they target sm_90a)"),
    _p("tcgen05-commit", "plgpu.tcgen05_mma(..., barrier=) / plgpu.tcgen05_commit_arrive", "none",
       "no tcgen05 in this plugin's kernels (they target sm_90a)"),
    _p("cta-pair-mma", "plgpu.tcgen05_mma(..., collective_axis=) over a cluster axis", "none",
       "no tcgen05 in this plugin's kernels (they target sm_90a)"),
    _p("mma-sync", "", "none", "Mosaic GPU on Hopper emits wgmma, not mma.sync"),
    _p("fma-simt", "jnp arithmetic on register arrays (acc += a * b)", "partial",
       "no scalar-loop control; vectorised by Mosaic GPU"),
    _p("cta-tile", "jax's hopper matmul TuningConfig(tile_m=, tile_n=, tile_k=); pipelined kernel: plgpu.BlockSpec "
       "((tile_m, tile_k)) and ((tile_k, tile_n)) in emit_pipeline; row-wise kernels: block_rows full rows per "
       "step, blocks_per_cta steps per CTA (a CTA's tile is block_rows x blocks_per_cta rows); "
       "knobs: tile_m, tile_n, tile_k, block_rows, blocks_per_cta"),
    _p("warpgroup", "plgpu.CompilerParams(lowering_semantics=Warpgroup); plgpu.kernel(num_threads=, thread_name=)"),
    _p("warp-specialization", "plgpu.emit_pipeline_warp_specialized(num_compute_wgs=, memory_registers=); "
       "knob: kernel='jax-hopper' (warp-specialised) vs 'pipelined' (not)"),
    _p("setmaxnreg", "plgpu.set_max_registers(n, action=...); memory_registers= of the WS pipeline; row-wise "
       "kernels: the registers per thread grow when a block is kept in registers between passes; knob: hold"),
    _p("pipeline-stage", "emit_pipeline / emit_pipeline_warp_specialized; row-wise kernels: copy='direct' stages "
       "nothing (no ring: loads straight into registers); knobs: max_concurrent_steps, copy"),
    _p("persistent-tile-loop", "plgpu.nd_loop(..., collective_axes=<grid axis>) with grid=(sm_count,); "
       "row-wise kernels: a CTA walks blocks_per_cta row blocks; knobs: persistent, blocks_per_cta"),
    _p("tile-raster-swizzle", "plgpu.planar_snake(idx, dims, minor_dim, tile_width); knobs: grid_minor_dim, "
       "grid_tile_width"),
    _p("smem-swizzle", "transforms=(plgpu.TilingTransform((8, n)), plgpu.SwizzleTransform(bytes))"),
    _p("cluster-launch", "plgpu.kernel(cluster=(2,), cluster_names=('cluster',)); knob: cluster_dimension"),
    _p("cluster-barrier", "plgpu.ClusterBarrier(collective_axes=('cluster',))", "partial"),
    _p("named-barrier", "", "none", "no named-barrier API; warpgroup sync is implied by the lowering"),
    _p("fence-proxy-async", "plgpu.commit_smem() (a proxy fence and a warpgroup barrier); row-wise kernels: Mosaic "
       "GPU's automatic barriers around every store on or off; knob: auto_barriers"),
    _p("epilogue-tma-store", "smem[...] = acc; plgpu.commit_smem(); plgpu.copy_smem_to_gmem per sub-tile; "
       "row-wise kernels: out_slots output buffers (0: in place over the input stage); "
       "knobs: epi_tile_m, epi_tile_n, out_slots"),
    _p("epilogue-direct-store", "out_gmem[...] = acc.astype(dtype); row-wise kernels: knobs: copy='tma_in', "
       "copy='direct'"),
    _p("elect-one", "(automatic: TMA issue and barrier init are single-thread in the lowering)", "partial"),
    _p("split-k", "", "none", "no built-in split-K; would be a new kernel (grid over k + reduction)"),
    _p("approximate-exp", "jnp.exp2(x) (Mosaic GPU lowers to ex2.approx); CompilerParams(approx_math=True); "
       "knob: approx_math", "partial", "no per-op accuracy choice: approx_math is the whole kernel's; check the PTX"),
    _p("fma-contraction", "(compiler-chosen: LLVM contracts a*b+c)", "partial", "no source-level control"),
    _p("approximate-reciprocal", "1 / x, lax.rsqrt (lowering-chosen); CompilerParams(approx_math=True); "
       "knob: approx_math", "partial"),
    _p("bf16-conversion", "acc.astype(jnp.bfloat16)"),
    # attention: the project's own forward (kernels/attention.py, kernel='project'); jax's attention_mgpu
    # (kernel='jax') writes the same constructs with its TuningConfig
    _p("online-softmax-rescale", "kernels/attention.py: running m_i, l_i in registers; acc *= exp2(m_old - m_new) "
       "before each P V wgmma (pv_accumulator='carried') or added after it (knob: pv_accumulator)"),
    _p("exp2-log2e-fold", "jnp.exp2(s * (scale * log2(e)) - m): the scale and log2(e) in one multiplier; "
       "knob: approx_math"),
    _p("two-mma-pipeline", "plgpu.wgmma(S, q_smem, k_smem.T) then plgpu.wgmma(acc, p, v_smem) per step; two compute "
       "warpgroups take turns on the tensor cores (plgpu.barrier_arrive on a schedule barrier); "
       "knobs: compute_wgs, use_schedule_barrier"),
    _p("causal-block-skip", "the kv loop bound from the query block (lax.fori_loop to the diagonal), jnp.where mask "
       "on the diagonal block only; knob: causal (must agree with the problem)"),
    _p("gqa-head-mapping", "kv head = q head // (heads // kv_heads) in the BlockSpec / TMA index of k and v"),
    _p("p-operand-source", "plgpu.wgmma(acc, p_regs.astype(dtype), v_smem) vs P stored to a plgpu.SMEM scratch "
       "first; knob: p_operand"),
)
