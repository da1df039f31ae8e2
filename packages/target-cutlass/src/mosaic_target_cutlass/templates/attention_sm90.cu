// Mosaicist attention forward for Hopper (sm_90a) in CuTe C++, generated from knobs; see
// mosaic_target_cutlass/attention.py. The kernel (templates/attention_sm90.cuh) is inlined below, then one
// configuration of it and a small C host shim (extern "C"): its compile-time facts and host-side checks (loaded with
// ctypes in a child process: a lowering never loads the library) and the device runner (mosaic_create .. mosaic_destroy,
// the GEMM shim's calls: backend.AttentionRunnable loads the library into the capture child).
{{KERNEL}}

#include <cstdio>
#include <cstring>

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

namespace {
// One problem on the device: q, k, v, o buffers (the family's layout, 16-bit words) and the kernel's parameters (the
// three TMA descriptors, encoded once by mosaic_create: a launch encodes nothing).
struct State {
  Cfg::Element *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  size_t o_bytes = 0;
  Cfg::Params* params = nullptr;
};

int fail(char* err, int errlen, const char* what, cudaError_t e) {
  if (err && errlen > 0) snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return e == cudaSuccess ? -1 : 1000 + static_cast<int>(e);
}
}  // namespace

extern "C" {

void mosaic_destroy(void* handle) {
  State* g = static_cast<State*>(handle);
  if (!g) return;
  cudaFree(g->q); cudaFree(g->k); cudaFree(g->v); cudaFree(g->o);
  delete g->params;
  delete g;
}

// Check the problem (codes 1-3, as mosaic_attention_launch) and the device (10: no usable CUDA device, 11: not sm_90),
// allocate q, k, v, o, copy q, k, v (raw 16-bit words, the family's layout), encode the TMA descriptors and allow the
// kernel its dynamic shared memory. Returns 0 and a handle in *out, or a nonzero code (1000 + a CUDA error for a
// failed CUDA call) with a message in err.
int mosaic_create(int batch, int seq, int heads, int kv_heads, const void* host_q, const void* host_k,
                  const void* host_v, void** out, char* err, int errlen) {
  *out = nullptr;
  const char* why = nullptr;
  if (int rc = mosaic_attention::check_problem(batch, seq, heads, kv_heads, &why)) {
    snprintf(err, errlen, "%s", why);
    return rc;
  }
  int count = 0, dev = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    snprintf(err, errlen, "no usable CUDA device (cudaGetDeviceCount: %s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 10;
  }
  cudaDeviceProp prop;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
    return fail(err, errlen, "cudaGetDeviceProperties", e);
  if (prop.major != 9 || prop.minor != 0) {
    snprintf(err, errlen, "device %d (%s) is sm_%d%d; this build is for sm_90a", dev, prop.name, prop.major,
             prop.minor);
    return 11;
  }
  using E = Cfg::Element;
  State* g = new State();
  size_t const q_bytes = size_t(batch) * heads * seq * Cfg::D * sizeof(E);
  size_t const kv_bytes = size_t(batch) * kv_heads * seq * Cfg::D * sizeof(E);
  g->o_bytes = q_bytes;
  int rc = 0;
  if ((e = cudaMalloc(&g->q, q_bytes)) != cudaSuccess) { rc = fail(err, errlen, "cudaMalloc q", e); goto bad; }
  if ((e = cudaMalloc(&g->k, kv_bytes)) != cudaSuccess) { rc = fail(err, errlen, "cudaMalloc k", e); goto bad; }
  if ((e = cudaMalloc(&g->v, kv_bytes)) != cudaSuccess) { rc = fail(err, errlen, "cudaMalloc v", e); goto bad; }
  if ((e = cudaMalloc(&g->o, q_bytes)) != cudaSuccess) { rc = fail(err, errlen, "cudaMalloc o", e); goto bad; }
  if ((e = cudaMemcpy(g->q, host_q, q_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) { rc = fail(err, errlen, "copy q", e); goto bad; }
  if ((e = cudaMemcpy(g->k, host_k, kv_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) { rc = fail(err, errlen, "copy k", e); goto bad; }
  if ((e = cudaMemcpy(g->v, host_v, kv_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) { rc = fail(err, errlen, "copy v", e); goto bad; }
  g->params = new Cfg::Params(mosaic_attention::make_params<Cfg>(g->q, g->k, g->v, g->o, batch, seq, heads, kv_heads));
  if ((e = cudaFuncSetAttribute(&mosaic_attention::attention_fwd_kernel<Cfg>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SmemBytes)) != cudaSuccess) {
    rc = fail(err, errlen, "cudaFuncSetAttribute (dynamic shared memory)", e); goto bad;
  }
  if ((e = cudaDeviceSynchronize()) != cudaSuccess) { rc = fail(err, errlen, "setup sync", e); goto bad; }
  *out = g;
  return 0;
bad:
  mosaic_destroy(g);
  return rc ? rc : -1;
}

// The message of a code mosaic_launch or mosaic_poison returned (1000 + a CUDA error, or a CUDA error).
const char* mosaic_error_string(int rc) {
  return cudaGetErrorString(static_cast<cudaError_t>(rc >= 1000 ? rc - 1000 : rc));
}

// The launch grid of this handle's problem (host-side plan; CUPTI reports the actual).
int mosaic_grid(void* handle, int* xyz) {
  State* g = static_cast<State*>(handle);
  return mosaic_attention_grid(g->params->batch, g->params->seq, g->params->heads, xyz);
}

// Enqueue exactly one run on the legacy default stream (mosaic_attention::launch, as the self-check runs it): no
// allocation, no synchronisation. Returns 0 or 1000 + a CUDA error.
int mosaic_launch(void* handle) {
  State* g = static_cast<State*>(handle);
  cudaError_t e = mosaic_attention::launch<Cfg>(*g->params, static_cast<cudaStream_t>(0));
  return e == cudaSuccess ? 0 : 1000 + static_cast<int>(e);
}

// Fill o with 0xFFFF words (NaN in bf16 and fp16) so an element that is never written cannot pass.
int mosaic_poison(void* handle) {
  State* g = static_cast<State*>(handle);
  return static_cast<int>(cudaMemsetAsync(g->o, 0xFF, g->o_bytes, static_cast<cudaStream_t>(0)));
}

// Wait for the device and copy o (raw 16-bit words, batch x heads x seq x head_dim) to host.
int mosaic_read(void* handle, void* host_o, char* err, int errlen) {
  State* g = static_cast<State*>(handle);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return fail(err, errlen, "kernel", e);
  if ((e = cudaMemcpy(host_o, g->o, g->o_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) return fail(err, errlen, "copy o", e);
  return 0;
}

}  // extern "C"
