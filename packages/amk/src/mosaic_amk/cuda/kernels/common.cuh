// AMK micro-kernels, the common part: the build defines every family reads, the per-launch context (Ctx),
// buffer access, loads, warp/block reductions, bf16 and cp.async helpers. Each micro-kernel (kernels/*.cuh,
// one family per header, all included by vm.cu) is block-cooperative (all AMK_THREADS threads enter), reads
// its task record from shared memory (t), resolves buffers through the context, and writes only the region
// ops.py says it writes (one fixed ABI: abi.h). Semantics: mosaic_amk/ops.py (float32); MODE_HF_BF16
// additionally rounds to bf16 where transformers' bf16 eager rounds (docs/amk-cuda.md, "precision contract").
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include "../abi.h"

#ifndef AMK_THREADS
#define AMK_THREADS 512
#endif
#define AMK_WARPS (AMK_THREADS / 32)

// Weight preload (build.py defines=("AMK_WEIGHT_PRELOAD=N",), ScheduleConfig.weight_preload; 0 = off, the default
// build, whose code is unchanged): before thread 0 waits for a GEMV-family task's producers, every lane issues N
// 16-byte weight loads of its warp's first row (gate and up: N/2 of each) into registers (Ctx::pre); the row loop
// consumes them first, after the wait and the x staging, in the order it would have loaded them (bit-identical
// sums). Weights are immutable during a launch, so reading them before the acquire is allowed; x is still read
// after it (docs/amk-cuda.md "Weight preload").
#ifndef AMK_WEIGHT_PRELOAD
#define AMK_WEIGHT_PRELOAD 0
#endif
#if AMK_WEIGHT_PRELOAD < 0 || AMK_WEIGHT_PRELOAD > 8 || (AMK_WEIGHT_PRELOAD & 1)
#error "AMK_WEIGHT_PRELOAD must be 0, 2, 4, 6 or 8 (16-byte loads per lane held across the wait)"
#endif

// Weight stream (build.py defines=("AMK_WSTREAM=N",), ScheduleConfig.weight_stream; 0 = off, the default build):
// each warp owns N slots of WS_PIECE bytes in a shared-memory ring after the block's general dynamic area, one
// mbarrier per slot; before a GEMV-family task's wait, lane 0 of each warp issues bulk copies (TMA,
// cp.async.bulk ... mbarrier::complete_tx) of the first N pieces of its rows (rows row_start + warp, + AMK_WARPS,
// ...; a piece is up to WS_PIECE contiguous bytes of one row; gate and up alternate piece by piece); after the
// wait and the x staging the warp consumes the pieces in order from shared memory and re-issues each freed slot
// with the piece N ahead, across row ends. Each lane adds the chunks lane, lane + 32, ... of a row in row_dot's
// order, so the sums are bit-identical to body 1. No register holds bytes in flight (docs/amk-cuda.md "Weight
// stream").
#ifndef AMK_WSTREAM
#define AMK_WSTREAM 0
#endif
#if AMK_WSTREAM < 0 || AMK_WSTREAM > 8
#error "AMK_WSTREAM must be 0..8 (ring slots per warp)"
#endif
#if AMK_WSTREAM > 0 && AMK_WEIGHT_PRELOAD > 0
#error "AMK_WSTREAM and AMK_WEIGHT_PRELOAD are exclusive (the stream issues the first loads itself)"
#endif
// piece size in KB (AMK_WS_PIECE_KB, default 2: config.WS_PIECE) and the proxy fence before a slot's re-issue
// (AMK_WS_FENCE, default 1): build variants for the GEMV A/B micro-benchmark (scripts/device/amk_gemv_micro.py)
#ifndef AMK_WS_PIECE_KB
#define AMK_WS_PIECE_KB 2
#endif
#ifndef AMK_WS_FENCE
#define AMK_WS_FENCE 1
#endif
#define WS_PIECE (AMK_WS_PIECE_KB * 1024)
#define WS_CHUNKS (WS_PIECE / 16)
#if AMK_WSTREAM > 0
// one warp's stream of the current task (shared memory: warp-uniform, written by lane 0 between __syncwarp()s)
struct WsState {
  const char* w[2];   // the matrices (w[1]: up, when nmat == 2)
  int rowbytes, ppr, nmat, r_first, total;  // bytes per row, pieces per row, matrices, the warp's first row, pieces
  int issued, consumed;                     // pieces of this task issued / consumed so far
  unsigned phase;                           // bit s: the parity of slot s's next completion
};
#endif

struct Ctx {
  const unsigned long long* bptr;
  const int* bmeta;
  unsigned long long token_in, token_out;
  int token_buf, next_buf;
  int position;
  int mode;
  int smem_floats;      // dynamic shared memory, in floats
  int* control;
  const float* rope_table;  // [rope_positions][2 * head_dim]: cos then sin (x attention_scaling), ops.rope_tables
  int rope_positions;
  float* smem;          // dynamic shared memory
  float* red;           // 64 floats of static shared memory for reductions
  int* ired;            // 32 ints of static shared memory
#if AMK_WEIGHT_PRELOAD > 0
  uint4 pre[AMK_WEIGHT_PRELOAD];  // the current GEMV task's preloaded weight chunks (preload_weights)
#endif
#if AMK_WSTREAM > 0
  WsState* ws;    // [AMK_WARPS] static shared memory
  unsigned ring;  // shared-window address of the ring: AMK_WARPS * AMK_WSTREAM slots of WS_PIECE bytes
  unsigned bars;  // shared-window address of the AMK_WARPS * AMK_WSTREAM mbarriers (8 bytes each)
#endif
};

__device__ __forceinline__ float bf16r(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float rnd(const Ctx& c, float x) { return c.mode == MODE_HF_BF16 ? bf16r(x) : x; }
__device__ __forceinline__ float fbits(int v) { return __int_as_float(v); }

__device__ __forceinline__ void* buf(const Ctx& c, int b) {
  if (b == c.token_buf) return (void*)c.token_in;
  if (b == c.next_buf) return (void*)c.token_out;
  return (void*)c.bptr[b];
}
__device__ __forceinline__ int bmeta(const Ctx& c, int b, int w) { return c.bmeta[b * AMK_BUF_META + w]; }
__device__ __forceinline__ int task_pos(const Ctx& c, const int* t) {
  return (t[W_FLAGS] & F_RUNTIME_POS) ? c.position : t[W_POS];
}

// activations are produced by other SMs in this launch: read them at L2 (never a stale L1 line)
__device__ __forceinline__ float ld_act(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float4 ld_act4(const float4* p) { return __ldcg(p); }
// weights are immutable during a launch: 16-byte loads through the non-coherent path, no L1 allocation
__device__ __forceinline__ uint4 ld_w16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ float ld_bf16(const __nv_bfloat16* p) { return __bfloat162float(p[0]); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// block-wide reductions: every thread gets the result
__device__ float block_sum(const Ctx& c, float v) {
  v = warp_sum(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) c.red[w] = v;
  __syncthreads();
  float s = l < AMK_WARPS ? c.red[l] : 0.f;
  s = warp_sum(s);
  return s;
}
__device__ float block_max(const Ctx& c, float v) {
  v = warp_max(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) c.red[w] = v;
  __syncthreads();
  float s = l < AMK_WARPS ? c.red[l] : -INFINITY;
  return warp_max(s);
}

// load n floats of an activation into shared memory
__device__ void load_act(float* dst, const float* src, int n) {
  if ((n & 3) == 0 && (((uintptr_t)src) & 15) == 0) {
    const float4* s4 = (const float4*)src;
    float4* d4 = (float4*)dst;
    for (int i = threadIdx.x; i < (n >> 2); i += AMK_THREADS) d4[i] = ld_act4(s4 + i);
  } else {
    for (int i = threadIdx.x; i < n; i += AMK_THREADS) dst[i] = ld_act(src + i);
  }
}

// threadIdx.x read by a volatile asm: values derived from it in the GEMV bodies are computed where they are used.
// With plain threadIdx.x the compiler hoists them (xpos of a thread's first elements, its ring slot) out of the
// VM's task loop, where they hold registers across every micro-kernel (32 bytes of spills in the VM).
__device__ __forceinline__ int tid_v() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// w holds 8 bf16 (element 2k in the low half of word k): bf16 -> f32 is a shift or a mask, no PRMT
__device__ __forceinline__ float bf_lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

// cp.async (LDGSTS): 16 bytes global -> shared through L2 only, no register holds the bytes in flight
__device__ __forceinline__ void cp_async16(unsigned smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem), "l"(gmem) : "memory");
}
// 16 bytes of shared memory at a shared-window address (volatile: stays after the wait_group that makes them valid)
__device__ __forceinline__ uint4 lds16(unsigned smem) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(smem));
  return r;
}
// the shared-window address of p, computed where it is used (volatile: never hoisted out of the VM's task loop,
// where it would hold a register across every micro-kernel)
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned long long a;
  asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (unsigned)a;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
