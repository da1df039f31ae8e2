// Mosaicist attention forward for Hopper (sm_90a) in CuTe C++, generated from knobs; see
// mosaic_target_cutlass/attention.py. The kernel (templates/attention_sm90.cuh) is inlined below, then one
// configuration of it and a small C host shim (extern "C", loaded with ctypes in a child process for its facts).
{{KERNEL}}

using Cfg = mosaic_attention::Config<{{ELEMENT}}, {{HEAD_DIM}}, {{BLOCK_M}}, {{BLOCK_N}}, {{STAGES}}, {{CONSUMER_WGS}},
                                     {{CAUSAL}}, {{CAUSAL_SKIP}}, {{P_IN_REGS}}>;

extern "C" {

// Compile-time facts of this build (need no GPU).
int mosaic_smem_bytes() { return Cfg::SmemBytes; }
int mosaic_block_threads() { return Cfg::Threads; }
int mosaic_stages() { return Cfg::Stages; }
int mosaic_element_bytes() { return static_cast<int>(sizeof(Cfg::Element)); }
int mosaic_head_dim() { return Cfg::D; }

// The fragment maps the kernel relies on, checked on the host (layout algebra only): the number of violations.
int mosaic_fragment_check() { return mosaic_attention::check_fragment_maps<Cfg>(); }

// The key blocks query block m_block visits, [0, out[1]), and the first of them that is masked, out[0] (the rule the
// kernel runs; the Python mirror is attention.key_blocks).
int mosaic_key_blocks(int m_block, int seq, int* out) {
  mosaic_attention::KeyBlocks kb = mosaic_attention::key_blocks<Cfg>(m_block, seq);
  out[0] = kb.masked; out[1] = kb.visited;
  return 0;
}

// The key/value head index (batch * kv_heads + kv head) query head `head` of `batch` reads (the kernel's GQA map).
int mosaic_kv_index(int batch, int head, int heads, int kv_heads) {
  return mosaic_attention::kv_index(batch, head, heads, kv_heads);
}

// The launch grid for a problem (host-side plan).
int mosaic_attention_grid(int batch, int seq, int heads, int* xyz) {
  dim3 g = mosaic_attention::grid_shape<Cfg>(batch, seq, heads);
  xyz[0] = g.x; xyz[1] = g.y; xyz[2] = g.z;
  return 0;
}

// One launch on `stream` over device buffers q, k, v, o in the family's layout. Returns 0, a problem code (1-3) or
// 1000 + a CUDA error.
int mosaic_attention_launch(const void* q, const void* k, const void* v, void* o, int batch, int seq, int heads,
                            int kv_heads, void* stream) {
  const char* why = nullptr;
  if (int rc = mosaic_attention::check_problem(batch, seq, heads, kv_heads, &why)) return rc;
  using E = Cfg::Element;
  auto params = mosaic_attention::make_params<Cfg>(static_cast<const E*>(q), static_cast<const E*>(k),
                                                   static_cast<const E*>(v), static_cast<E*>(o), batch, seq, heads,
                                                   kv_heads);
  cudaError_t e = mosaic_attention::launch<Cfg>(params, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? 0 : 1000 + static_cast<int>(e);
}

}  // extern "C"
