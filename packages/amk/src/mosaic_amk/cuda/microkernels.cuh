// AMK micro-kernels: one fixed ABI. Each is block-cooperative (all AMK_THREADS threads enter), reads its
// task record from shared memory (t), resolves buffers through the context, and writes only the region
// ops.py says it writes. Semantics: mosaic_amk/ops.py (float32); MODE_HF_BF16 additionally rounds to bf16
// where transformers' bf16 eager rounds (docs/amk-cuda.md, "precision contract").
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include "abi.h"

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

// ------------------------------------------------------------------------------------- GEMV row streams
// Two bodies, chosen at build time (build.py defines=): AMK_GEMV_IMPL 1 (default) is the first body (one row at a
// time per warp, bursts of 8 register loads, x staged first); AMK_GEMV_IMPL 2 streams every row of a warp through
// a cp.async shared-memory ring of AMK_GEMV_DEPTH 16-byte items per lane (re-issued as soon as consumed, across
// row ends; the first items in flight before x is staged; x in a bank-conflict-free layout). Both sum each
// lane's chunks in the same order and reduce with the same butterfly, so their outputs are bit-identical. Body 2
// is not the default yet: inside the whole VM (attention is the register peak) it costs 32 bytes of spills of
// the task loop's scalars (ptxas, sm_90a, nvcc 13.0); issue8.py --quick times both.
#ifndef AMK_GEMV_IMPL
#define AMK_GEMV_IMPL 1
#endif
#ifndef AMK_GEMV_DEPTH
#define AMK_GEMV_DEPTH 8
#endif
#if AMK_GEMV_IMPL != 1 && AMK_GEMV_IMPL != 2
#error "AMK_GEMV_IMPL must be 1 or 2"
#endif
#if AMK_GEMV_DEPTH < 2 || AMK_GEMV_DEPTH > 16
#error "AMK_GEMV_DEPTH must be in 2..16 (16-byte items in flight per lane; gate+up streams take half as many)"
#endif
#if AMK_WEIGHT_PRELOAD > 0 && AMK_GEMV_IMPL != 1
#error "AMK_WEIGHT_PRELOAD needs GEMV body 1 (body 2 issues its own first items)"
#endif

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
// sum of w[e] * x[e], e = 0..7, in element order (a = x[0..3], b = x[4..7])
__device__ __forceinline__ float dot8v(uint4 w, float4 a, float4 b) {
  float s = bf_lo(w.x) * a.x;
  s = fmaf(bf_hi(w.x), a.y, s); s = fmaf(bf_lo(w.y), a.z, s); s = fmaf(bf_hi(w.y), a.w, s);
  s = fmaf(bf_lo(w.z), b.x, s); s = fmaf(bf_hi(w.z), b.y, s); s = fmaf(bf_lo(w.w), b.z, s); s = fmaf(bf_hi(w.w), b.w, s);
  return s;
}

// Where x[i] lives in the GEMV's shared-memory copy of x (K floats, K % 8 == 0). Body 2: the first halves of the
// 8-element chunks (x[8c .. 8c+3]) at float4 c, the second halves at float4 K/8 + c, so the 32 lanes of a warp
// reading chunks c = lane + 32j load 512 contiguous bytes per LDS.128 (no bank conflict; the plain layout has a
// 32-byte stride per lane: two-way conflicts). Body 1: plain.
__device__ __forceinline__ int xpos(int i, int K) {
#if AMK_GEMV_IMPL == 2
  return ((i >> 3) << 2) + (i & 3) + ((i & 4) ? (K >> 1) : 0);
#else
  (void)K;
  return i;
#endif
}

// x (K floats of an activation) into shared memory in the xpos layout
__device__ void load_x(float* xs, const float* x, int K) {
#if AMK_GEMV_IMPL == 2
  if ((K & 7) == 0 && (((uintptr_t)x) & 15) == 0) {
    const float4* s4 = (const float4*)x;
    float4* d4 = (float4*)xs;
    const int nch = K >> 3;
    for (int q = tid_v(); q < (K >> 2); q += AMK_THREADS) d4[(q & 1) * nch + (q >> 1)] = ld_act4(s4 + q);
  } else {
    for (int i = tid_v(); i < K; i += AMK_THREADS) xs[xpos(i, K)] = ld_act(x + i);
  }
#else
  load_act(xs, x, K);
#endif
}

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

// The first body: one warp per row, bursts of GEMV_UNROLL 16-byte loads into registers (x read in the xpos
// layout). Body 2 falls back to it when its shared-memory ring does not fit next to x.
__device__ __forceinline__ float dot8x(uint4 w, const float* xs, int ch, int K) {
#if AMK_GEMV_IMPL == 2
  const float4* x4 = (const float4*)xs;
  return dot8v(w, x4[ch], x4[(K >> 3) + ch]);
#else
  (void)K;
  return dot8v(w, *(const float4*)(xs + 8 * ch), *(const float4*)(xs + 8 * ch + 4));
#endif
}
#define GEMV_UNROLL 8
#ifndef AMK_GEMV_PP
#define AMK_GEMV_PP 0
#endif
#define GEMV_HALF (GEMV_UNROLL / 2)
// acc0 / ch0 (the preload): start from the sum acc0 of this lane's chunks below ch0 (a multiple of 32).
// AMK_GEMV_PP (config gemv_pingpong): the lane's chunks ch, ch + 32, ... go in groups of GEMV_HALF, double-buffered
// in the registers one burst of GEMV_UNROLL takes: group g + 1 is in flight while group g is added, and g + 2 is
// issued as soon as g is consumed (a burst of 8 has none in flight while its chunks are added). Either way the
// chunks are added one by one in increasing order, then the tail: the same sums.
__device__ __forceinline__ float row_dot(const __nv_bfloat16* row, const float* xs, int K, float acc0 = 0.f,
                                         int ch0 = 0) {
  const int lane = tid_v() & 31;
  const int nch = K >> 3;
  const uint4* r = (const uint4*)row;
  float acc = acc0;
  int ch = lane + ch0;
#if AMK_GEMV_PP
  uint4 a[GEMV_HALF], b[GEMV_HALF];
  auto full = [&](int c0) { return c0 + 32 * (GEMV_HALF - 1) < nch; };
  auto load = [&](uint4* w, int c0) {
#pragma unroll
    for (int u = 0; u < GEMV_HALF; ++u) w[u] = ld_w16(r + c0 + 32 * u);
  };
  auto add = [&](const uint4* w, int c0) {
#pragma unroll
    for (int u = 0; u < GEMV_HALF; ++u) acc += dot8x(w[u], xs, c0 + 32 * u, K);
  };
  bool ha = full(ch);
  if (ha) load(a, ch);
  while (ha) {
    const int cb = ch + 32 * GEMV_HALF;
    const bool hb = full(cb);
    if (hb) load(b, cb);
    add(a, ch);
    ch = cb;
    if (!hb) break;
    const int ca = ch + 32 * GEMV_HALF;
    ha = full(ca);
    if (ha) load(a, ca);
    add(b, ch);
    ch = ca;
  }
#else
  for (; ch + 32 * (GEMV_UNROLL - 1) < nch; ch += 32 * GEMV_UNROLL) {
    uint4 w[GEMV_UNROLL];
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) w[u] = ld_w16(r + ch + 32 * u);
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) acc += dot8x(w[u], xs, ch + 32 * u, K);
  }
#endif
  for (; ch < nch; ch += 32) acc += dot8x(ld_w16(r + ch), xs, ch, K);
  return warp_sum(acc);
}
// two rows at once (gate and up): twice the loads in flight
__device__ __forceinline__ float2 row_dot2(const __nv_bfloat16* ra, const __nv_bfloat16* rb, const float* xs, int K,
                                          float2 acc0 = make_float2(0.f, 0.f), int ch0 = 0) {
  const int lane = tid_v() & 31;
  const int nch = K >> 3;
  const uint4* a = (const uint4*)ra;
  const uint4* b = (const uint4*)rb;
  float sa = acc0.x, sb = acc0.y;
  int ch = lane + ch0;
  for (; ch + 32 * 3 < nch; ch += 32 * 4) {
    uint4 wa[4], wb[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) { wa[u] = ld_w16(a + ch + 32 * u); wb[u] = ld_w16(b + ch + 32 * u); }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      sa += dot8x(wa[u], xs, ch + 32 * u, K);
      sb += dot8x(wb[u], xs, ch + 32 * u, K);
    }
  }
  for (; ch < nch; ch += 32) { sa += dot8x(ld_w16(a + ch), xs, ch, K); sb += dot8x(ld_w16(b + ch), xs, ch, K); }
  return make_float2(warp_sum(sa), warp_sum(sb));
}

// Short rows (at most SHORT_CH chunks of 8: K <= 1024): each lane holds at most 4 chunks of a row, so two rows fit the
// registers of one burst of 8. row_dot_short2 puts every chunk of both rows in flight at once and sums each row as
// row_dot does (from 0, the lane's chunks lane, lane + 32, ... in increasing order, then the butterfly): one round
// trip for two rows, the same sums. AMK_SHORT_ROWS=0 (a build define for the GPU tests) turns the short-row paths off
// (here and in the preload): one row per round trip, as before them.
#define SHORT_CH 128
#ifndef AMK_SHORT_ROWS
#define AMK_SHORT_ROWS 1
#endif
__device__ __forceinline__ float2 row_dot_short2(const __nv_bfloat16* ra, const __nv_bfloat16* rb, const float* xs,
                                                int K) {
  const int lane = tid_v() & 31, nch = K >> 3;
  const uint4* a = (const uint4*)ra;
  const uint4* b = (const uint4*)rb;
  uint4 wa[4], wb[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const bool in = lane + 32 * u < nch;
    wa[u] = in ? ld_w16(a + lane + 32 * u) : make_uint4(0u, 0u, 0u, 0u);
    wb[u] = in ? ld_w16(b + lane + 32 * u) : make_uint4(0u, 0u, 0u, 0u);
  }
  float sa = 0.f, sb = 0.f;
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (lane + 32 * u < nch) { sa += dot8x(wa[u], xs, lane + 32 * u, K); sb += dot8x(wb[u], xs, lane + 32 * u, K); }
  return make_float2(warp_sum(sa), warp_sum(sb));
}

#if AMK_WEIGHT_PRELOAD > 0 || AMK_WSTREAM > 0
// The weight matrices a GEMV-family task streams: the inputs mk_gemv, mk_gemv_silu_mul and gemv_rope_into read as
// w (gate, up); (-1, -1) for every other op
__device__ __forceinline__ int2 gemv_weights(const int* t, int op) {
  switch (op) {
    case OP_GEMV: return make_int2(t[W_IN + 1], -1);
    case OP_RMSNORM_GEMV: return make_int2(t[W_IN + 2], -1);
    case OP_GEMV_SILU_MUL: return make_int2(t[W_IN + 1], t[W_IN + 2]);
    case OP_RMSNORM_GEMV_SILU_MUL: return make_int2(t[W_IN + 2], t[W_IN + 3]);
    case OP_GEMV_ROPE: case OP_GEMV_ROPE_APPEND: return make_int2(t[W_IN + 1], -1);
    default: return make_int2(-1, -1);
  }
}
#endif

#if AMK_WEIGHT_PRELOAD > 0
#define PRE_N AMK_WEIGHT_PRELOAD
// short rows (K <= 256 PRE_N / 2 bf16): preload_weights loads the warp's first two rows whole, PRE_N / 2 chunks each
__device__ __forceinline__ bool pre_short(int K) { return AMK_SHORT_ROWS && (K >> 3) <= 32 * (PRE_N / 2); }
// Issued by every thread BEFORE the task's wait (vm.cu): lane l of warp w loads chunks l, l + 32, ... (PRE_N of
// them; gate and up: PRE_N / 2 of each) of row row_start + w, the first chunks row_dot / row_dot2 would load for
// the warp's first row; chunks past the row end (K < 256 * PRE_N bf16) are not loaded (and not consumed). Only
// weights are read (immutable for the whole launch; encode.py refuses a task that writes a weight, and only
// weights are bf16 on the device); the addresses are inside the task's rows, which the encoder checked. Nothing
// waits for these loads here: their registers are first read by pre_dot / pre_dot2 after the wait.
// Short rows (pre_short): all chunks of the warp's first two rows instead, PRE_N / 2 registers each (gemv_rows
// consumes them with pre_dot_short).
// Every register of c.pre is (re)defined on every call, zero where nothing is loaded: the VM calls it once per task,
// so no preloaded value is live across a task that does not consume it (else the registers stay live around the
// whole task loop, attention included: 128 registers and spills).
__device__ __forceinline__ void preload_weights(Ctx& c, const int* t, bool run) {
#pragma unroll
  for (int u = 0; u < PRE_N; ++u) c.pre[u] = make_uint4(0u, 0u, 0u, 0u);
  const int2 wb = run ? gemv_weights(t, t[W_OP]) : make_int2(-1, -1);
  const int r = t[W_ROW0] + (tid_v() >> 5);
  if (wb.x < 0 || r >= t[W_ROW1]) return;
  const int lane = tid_v() & 31;
  const int nch = bmeta(c, wb.x, B_ROW) >> 3;
  const uint4* a = (const uint4*)buf(c, wb.x) + (size_t)r * nch;
  if (wb.y < 0 && pre_short(bmeta(c, wb.x, B_ROW))) {
    // short rows (pre_short): all chunks of the warp's first two rows, PRE_N / 2 registers each
    const bool second = r + AMK_WARPS < t[W_ROW1];
#pragma unroll
    for (int u = 0; u < PRE_N / 2; ++u)
      if (lane + 32 * u < nch) {
        c.pre[u] = ld_w16(a + lane + 32 * u);
        if (second) c.pre[PRE_N / 2 + u] = ld_w16(a + (size_t)AMK_WARPS * nch + lane + 32 * u);
      }
  } else if (wb.y < 0) {
#pragma unroll
    for (int u = 0; u < PRE_N; ++u)
      if (lane + 32 * u < nch) c.pre[u] = ld_w16(a + lane + 32 * u);
  } else {
    const uint4* b = (const uint4*)buf(c, wb.y) + (size_t)r * nch;
#pragma unroll
    for (int u = 0; u < PRE_N / 2; ++u)
      if (lane + 32 * u < nch) {
        c.pre[u] = ld_w16(a + lane + 32 * u);
        c.pre[PRE_N / 2 + u] = ld_w16(b + lane + 32 * u);
      }
  }
}
// row k (0 or 1) of a short-row preload: its whole sum, in row_dot's order
__device__ __forceinline__ float pre_dot_short(const Ctx& c, const float* xs, int K, int k) {
  const int lane = tid_v() & 31, nch = K >> 3;
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < PRE_N / 2; ++u)
    if (lane + 32 * u < nch) acc += dot8x(c.pre[k * (PRE_N / 2) + u], xs, lane + 32 * u, K);
  return warp_sum(acc);
}
// this lane's sum over the preloaded chunks of the warp's first row, in row_dot's order (row_dot goes on from chunk
// lane + 32 PRE_N with it: the same additions in the same order as without the preload)
__device__ __forceinline__ float pre_dot(const Ctx& c, const float* xs, int K) {
  const int lane = tid_v() & 31, nch = K >> 3;
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < PRE_N; ++u)
    if (lane + 32 * u < nch) acc += dot8x(c.pre[u], xs, lane + 32 * u, K);
  return acc;
}
__device__ __forceinline__ float2 pre_dot2(const Ctx& c, const float* xs, int K) {
  const int lane = tid_v() & 31, nch = K >> 3;
  float sa = 0.f, sb = 0.f;
#pragma unroll
  for (int u = 0; u < PRE_N / 2; ++u)
    if (lane + 32 * u < nch) {
      sa += dot8x(c.pre[u], xs, lane + 32 * u, K);
      sb += dot8x(c.pre[PRE_N / 2 + u], xs, lane + 32 * u, K);
    }
  return make_float2(sa, sb);
}
#endif

#if AMK_WSTREAM > 0
__device__ __forceinline__ unsigned ws_slot(const Ctx& c, int warp, int s) {
  return c.ring + (unsigned)((warp * AMK_WSTREAM + s) * WS_PIECE);
}
__device__ __forceinline__ unsigned ws_bar(const Ctx& c, int warp, int s) {
  return c.bars + (unsigned)((warp * AMK_WSTREAM + s) * 8);
}
__device__ __forceinline__ bool mbar_try(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
               : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok != 0;
}
// every lane: until piece q's slot holds it (the slot's phase of parity bit s completed); returns the new phase bits
__device__ __forceinline__ unsigned ws_wait(const Ctx& c, int warp, int q, unsigned phase) {
  const int s = q % AMK_WSTREAM;
  const unsigned bar = ws_bar(c, warp, s);
  while (!mbar_try(bar, (phase >> s) & 1u)) {
  }
  return phase ^ (1u << s);
}
// lane 0: piece q of the warp's sequence into its slot (generic reads of the slot by this warp precede it: the
// caller's __syncwarp; the proxy fence orders them before the async-proxy write)
__device__ __forceinline__ void ws_issue(const Ctx& c, const WsState& st, int warp, int q) {
  const int s = q % AMK_WSTREAM;
  const int m = q % st.nmat, idx = q / st.nmat, k = idx / st.ppr, p = idx - k * st.ppr;
  const char* src = st.w[m] + (size_t)(st.r_first + k * AMK_WARPS) * st.rowbytes + (size_t)p * WS_PIECE;
  const unsigned bytes = (unsigned)min(WS_PIECE, st.rowbytes - p * WS_PIECE);
  const unsigned bar = ws_bar(c, warp, s);
#if AMK_WS_FENCE
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(ws_slot(c, warp, s)), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// every thread, at launch: lane 0 of each warp initialises its slots' barriers (count 1: its own arrive) and
// state; the caller's block barrier (the grid sync) publishes them
__device__ void ws_init(const Ctx& c) {
  const int warp = tid_v() >> 5;
  if ((tid_v() & 31) == 0) {
    for (int s = 0; s < AMK_WSTREAM; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(ws_bar(c, warp, s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    WsState& st = c.ws[warp];
    st.total = st.issued = st.consumed = 0;
    st.phase = 0u;
  }
}
// every lane of a warp: wait for every issued piece the warp did not consume (a task that returned early, E_SMEM,
// or whose wait aborted), so no bulk copy is in flight into a slot that is reused or outlives the launch
__device__ void ws_drain(const Ctx& c) {
  const int warp = tid_v() >> 5;
  WsState& st = c.ws[warp];
  const int n = st.issued;
  unsigned phase = st.phase;
  for (int q = st.consumed; q < n; ++q) phase = ws_wait(c, warp, q, phase);
  __syncwarp();
  if ((tid_v() & 31) == 0) {
    st.consumed = n;
    st.phase = phase;
  }
  __syncwarp();
}
// every thread, BEFORE the task's wait (vm.cu): a GEMV-family task's first AMK_WSTREAM pieces per warp in flight.
// Only weights are read (immutable during the launch; the same argument as the preload's, docs/amk-cuda.md).
__device__ void ws_begin(const Ctx& c, const int* t, bool run) {
  ws_drain(c);
  const int warp = tid_v() >> 5;
  const int2 wb = run ? gemv_weights(t, t[W_OP]) : make_int2(-1, -1);
  WsState& st = c.ws[warp];
  if ((tid_v() & 31) == 0) {
    const int r = t[W_ROW0] + warp, r1 = t[W_ROW1];
    const int rows = wb.x >= 0 && r < r1 ? (r1 - r + AMK_WARPS - 1) / AMK_WARPS : 0;
    st.rowbytes = rows ? bmeta(c, wb.x, B_ROW) * 2 : 0;
    st.ppr = rows ? (st.rowbytes + WS_PIECE - 1) / WS_PIECE : 0;
    st.nmat = wb.y >= 0 ? 2 : 1;
    st.w[0] = rows ? (const char*)buf(c, wb.x) : nullptr;
    st.w[1] = rows && wb.y >= 0 ? (const char*)buf(c, wb.y) : nullptr;
    st.r_first = r;
    st.total = rows * st.ppr * st.nmat;
    st.consumed = 0;
    st.issued = min(st.total, AMK_WSTREAM);
    for (int q = 0; q < st.issued; ++q) ws_issue(c, st, warp, q);
  }
  __syncwarp();
}
// rows [r0, r1) of NM matrices (the task's, as ws_begin set them up), one warp per row as body 1; every lane calls
// epi(r, sums) with the warp sums of row r (sums[m] for matrix m)
template <int NM, class Epi>
__device__ __forceinline__ void ws_rows(const Ctx& c, const float* xs, int K, int r0, int r1, Epi epi) {
  const int warp = tid_v() >> 5, lane = tid_v() & 31, nch = K >> 3;
  WsState& st = c.ws[warp];
  const int ppr = st.ppr, total = st.total;
  int issued = st.issued, q = st.consumed;
  unsigned phase = st.phase;
  for (int r = r0 + warp; r < r1; r += AMK_WARPS) {
    float acc[NM];
#pragma unroll
    for (int m = 0; m < NM; ++m) acc[m] = 0.f;
    for (int p = 0; p < ppr; ++p) {
      const int c0 = p * WS_CHUNKS, n = min(WS_CHUNKS, nch - c0);
#pragma unroll
      for (int m = 0; m < NM; ++m, ++q) {
        phase = ws_wait(c, warp, q, phase);
        const unsigned base = ws_slot(c, warp, q % AMK_WSTREAM);
        for (int j = lane; j < n; j += 32) acc[m] += dot8x(lds16(base + 16u * j), xs, c0 + j, K);
        __syncwarp();  // every lane has read the slot
        if (issued < total) {
          if (lane == 0) ws_issue(c, st, warp, issued);
          ++issued;
        }
      }
    }
    float sums[NM];
#pragma unroll
    for (int m = 0; m < NM; ++m) sums[m] = warp_sum(acc[m]);
    epi(r, sums);
  }
  __syncwarp();
  if (lane == 0) {
    st.issued = issued;
    st.consumed = q;
    st.phase = phase;
  }
  __syncwarp();
}
#endif

#if AMK_GEMV_IMPL == 2
// Body 2. The rows r0 + warp, r0 + warp + AMK_WARPS, ... of NW bf16 matrices (NW = 1: gemv; 2: gate and up), K
// columns (K % 8 == 0, rows 16-byte aligned). Item (k, j) of a warp is chunk c = lane + 32 j (16 bytes, 8 columns)
// of its k-th row in every matrix; a warp's items run row-major. Each lane keeps D items in flight with cp.async
// into its own 16-byte slots of a shared-memory ring (one commit group per item): begin() issues items 0..D-1
// (before x is staged), run() waits for item f (wait_group D-1), reads it back, adds it, and re-issues its slot
// with item f + D, so loads cross row ends without a bubble and cost no registers (D * NW * 16 bytes per lane:
// 64 KB per block at the default depth). Each lane adds its chunks of a row in order j = 0, 1, ...
// (acc += dot8, as row_dot), then one butterfly per row (warp_sum) and epi(k, row, sums) on every lane.
// A lane only reads slots it filled itself, after its own wait_group; a slot is refilled only after the FMAs
// that consumed its bytes (in-order issue: the read has returned before the refill is issued).
__device__ __forceinline__ int ring_floats(int nw, int d) { return d * nw * AMK_THREADS * 4; }

template <int NW, int D>
struct RowStream {
  static constexpr unsigned SLOT = 16u * NW * AMK_THREADS;  // bytes of one ring slot (all lanes, all matrices)
  const uint4* base[NW];
  unsigned ring0;       // shared address of this lane's 16 bytes in slot 0 (matrix w at + 16 w AMK_THREADS)
  unsigned row_ch;      // 16-byte chunk index of this lane's chunk 0 in the row being loaded (< 2^32: 64 GB)
  int nch, cpl, left, lj;  // chunks per row, per lane (ceil), items of this warp not yet consumed, chunk loaded next

  // the next item into the slot at shared address s (item f + D goes where item f was), one commit group
  __device__ __forceinline__ void issue(unsigned s) {
    if ((tid_v() & 31) + 32 * lj < nch) {
#pragma unroll
      for (int w = 0; w < NW; ++w) cp_async16(s + 16u * w * AMK_THREADS, base[w] + (row_ch + 32u * lj));
    }
    cp_async_commit();
    if (++lj == cpl) { lj = 0; row_ch += (unsigned)(AMK_WARPS * nch); }
  }

  __device__ __forceinline__ void begin(const __nv_bfloat16* const* W, int K, int r0, int r1, float* ring) {
    const int warp = tid_v() >> 5, lane = tid_v() & 31;
#pragma unroll
    for (int w = 0; w < NW; ++w) base[w] = (const uint4*)W[w];
    ring0 = smem_addr(ring) + 16u * tid_v();
    nch = K >> 3;
    cpl = (nch + 31) >> 5;
    const int nrw = r0 + warp < r1 ? (r1 - r0 - warp + AMK_WARPS - 1) / AMK_WARPS : 0;
    left = nrw * cpl;
    row_ch = (unsigned)(r0 + warp) * (unsigned)nch + lane;
    lj = 0;
#pragma unroll
    for (int u = 0; u < D; ++u) {  // empty groups past the end keep "item f is group f" for the waits
      if (u < left) issue(ring0 + u * SLOT);
      else cp_async_commit();
    }
  }

  template <class Epi>
  __device__ __forceinline__ void run(const float* xs, int r0, Epi epi) {
    const int lane = tid_v() & 31;
    const float4* xa = (const float4*)xs;
    float acc[NW];
#pragma unroll
    for (int w = 0; w < NW; ++w) acc[w] = 0.f;
    int k = 0, cj = 0;
    unsigned cs = ring0;  // the slot of the item being consumed
    for (; left > 0; --left) {
      cp_async_wait<D - 1>();  // this item's copies (this lane's) have landed
      const int ch = lane + 32 * cj;
      if (ch < nch) {
        const float4 a = xa[ch], b = xa[nch + ch];
#pragma unroll
        for (int w = 0; w < NW; ++w) acc[w] += dot8v(lds16(cs + 16u * w * AMK_THREADS), a, b);
      }
      if (left > D) issue(cs);
      else cp_async_commit();
      cs = cs == ring0 + (D - 1) * SLOT ? ring0 : cs + SLOT;
      if (++cj == cpl) {  // warp-uniform
        float s[NW];
#pragma unroll
        for (int w = 0; w < NW; ++w) { s[w] = warp_sum(acc[w]); acc[w] = 0.f; }
        epi(k, r0 + (tid_v() >> 5) + AMK_WARPS * k, s);
        ++k;
        cj = 0;
      }
    }
    cp_async_wait_all();  // nothing of this task is left in flight into the ring
  }
};

// per-row operands (bias, residual) of a warp's rows, loaded ahead: lane l holds row k = 32 b + l's value for
// the batch b of rows being finished; batch 0 is loaded with the first weight items, later ones (more than 32
// rows per warp) when their first row ends
struct RowOperand {
  float v;
  __device__ __forceinline__ void fetch_bf16(const __nv_bfloat16* p, int r0, int r1, int k0) {
    const int r = r0 + (tid_v() >> 5) + AMK_WARPS * (k0 + (tid_v() & 31));
    v = (p && r < r1) ? ld_bf16(p + r) : 0.f;
  }
  __device__ __forceinline__ void fetch_act(const float* p, int r0, int r1, int k0) {
    const int r = r0 + (tid_v() >> 5) + AMK_WARPS * (k0 + (tid_v() & 31));
    v = (p && r < r1) ? ld_act(p + r) : 0.f;
  }
  __device__ __forceinline__ float at(int k) const { return __shfl_sync(0xffffffffu, v, k & 31); }
};
#endif

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// ------------------------------------------------------------------------------------------ embed
// x = table[token[0]]
__device__ void mk_embed(const Ctx& c, const int* t) {
  const int tb = t[W_IN + 0], kb = t[W_IN + 1], yb = t[W_OUT + 0];
  const __nv_bfloat16* table = (const __nv_bfloat16*)buf(c, tb);
  const int V = bmeta(c, tb, B_D0), H = bmeta(c, tb, B_ROW);
  const int tok = __ldcg((const int*)buf(c, kb));
  float* y = (float*)buf(c, yb);
  if (tok < 0 || tok >= V) {
    if (tid_v() == 0) atomicOr(c.control + C_ERROR, E_TOKEN);
    for (int i = tid_v(); i < H; i += AMK_THREADS) y[i] = __int_as_float(0x7fc00000);
    return;
  }
  const __nv_bfloat16* row = table + (size_t)tok * H;
  for (int i = tid_v(); i < H; i += AMK_THREADS) y[i] = ld_bf16(row + i);
}

// ---------------------------------------------------------------------------------------- rmsnorm
// y = weight * (x * rsqrt(mean(x^2) + eps)); HF: y = bf16(w * bf16(x * rsqrt(var + eps)))
__device__ void mk_rmsnorm(const Ctx& c, const int* t) {
  const int xb = t[W_IN + 0], wb = t[W_IN + 1], yb = t[W_OUT + 0];
  const int n = bmeta(c, xb, B_D0);
  const float* x = (const float*)buf(c, xb);
  const __nv_bfloat16* w = (const __nv_bfloat16*)buf(c, wb);
  float* y = (float*)buf(c, yb);
  float* xs = c.smem;
  load_act(xs, x, n);
  __syncthreads();
  float ss = 0.f;
  for (int i = tid_v(); i < n; i += AMK_THREADS) ss = fmaf(xs[i], xs[i], ss);
  ss = block_sum(c, ss);
  const float var = ss / (float)n;
  const float eps = fbits(t[W_EPS]);
  const bool hf = c.mode == MODE_HF_BF16;
  const float inv = hf ? rsqrtf(var + eps) : 1.0f / sqrtf(var + eps);
  for (int i = tid_v(); i < n; i += AMK_THREADS) {
    const float wi = ld_bf16(w + i);
    y[i] = hf ? bf16r(wi * bf16r(xs[i] * inv)) : wi * (xs[i] * inv);
  }
}

// ------------------------------------------------------------------------------------------- gemv
#if AMK_GEMV_IMPL == 2
// body 2 at the deepest ring that fits: begin (the first items in flight), fetch(0) (the first rows' operands),
// stage_x() (x into shared memory, ends with a barrier), run; false when not even the shallow ring fits
template <int NW, int D, class StageX, class Fetch, class Epi>
__device__ __forceinline__ void stream_rows(const __nv_bfloat16* const* W, int K, int r0, int r1, float* ring,
                                            const float* xs, StageX& stage_x, Fetch& fetch, Epi& epi) {
  RowStream<NW, D> rs;
  rs.begin(W, K, r0, r1, ring);
  fetch(0);
  stage_x();
  rs.run(xs, r0, epi);
}
template <int NW, class StageX, class Fetch, class Epi>
__device__ __forceinline__ bool stream_rows_fit(const __nv_bfloat16* const* W, int K, int r0, int r1, float* ring,
                                                int room, const float* xs, StageX& stage_x, Fetch& fetch, Epi& epi) {
  constexpr int D1 = AMK_GEMV_DEPTH / NW, D2 = AMK_GEMV_DEPTH / NW / 2 > 0 ? AMK_GEMV_DEPTH / NW / 2 : 1;
  if (room >= ring_floats(NW, D1)) {
    stream_rows<NW, D1>(W, K, r0, r1, ring, xs, stage_x, fetch, epi);
    return true;
  }
  if (room >= ring_floats(NW, D2)) {
    stream_rows<NW, D2>(W, K, r0, r1, ring, xs, stage_x, fetch, epi);
    return true;
  }
  return false;
}
#endif

// rows [r0, r1) of y = res + (W @ xs + b), one warp per row (rows warp, warp + AMK_WARPS, ...), xs (K floats in
// the xpos layout) in shared memory, put there by stage_x() (which ends with a block barrier). Body 2 streams the
// weights through a ring at smem[ring_off ..) (floats, a multiple of 4) and calls stage_x() once the first items
// are in flight, so staging x (and a fused task's norm) overlaps their latency; without room for the ring it
// runs the first body. HF rounds the linear output (bias added first) and the residual sum. Row r is stored at
// y[r - y0]. Shared by gemv, rmsnorm_gemv and (into shared memory, no residual) gemv_rope / gemv_rope_append, so
// they round alike.
template <class StageX>
__device__ __forceinline__ void gemv_rows(const Ctx& c, const float* xs, const __nv_bfloat16* W, int K, int r0, int r1,
                                          const __nv_bfloat16* bias, const float* res, float* y, int y0, int ring_off,
                                          StageX stage_x) {
  const int warp = tid_v() >> 5, lane = tid_v() & 31;
  const bool hf = c.mode == MODE_HF_BF16;
#if AMK_GEMV_IMPL == 2
  RowOperand ob, orr;
  auto fetch = [&](int k0) {
    ob.fetch_bf16(bias, r0, r1, k0);
    orr.fetch_act(res, r0, r1, k0);
  };
  auto epi = [&](int k, int r, const float* s) {
    if (k > 0 && (k & 31) == 0) fetch(k);  // the next 32 rows' operands (warp-uniform)
    const float bv = ob.at(k), rv = orr.at(k);
    if (lane == 0) {
      float v = bias ? s[0] + bv : s[0];
      if (hf) v = bf16r(v);
      if (res) v = hf ? bf16r(rv + v) : rv + v;
      y[r - y0] = v;
    }
  };
  if (stream_rows_fit<1>(&W, K, r0, r1, c.smem + ring_off, c.smem_floats - ring_off, xs, stage_x, fetch, epi)) return;
#else
  (void)ring_off;
#endif
  stage_x();
#if AMK_WSTREAM > 0
  ws_rows<1>(c, xs, K, r0, r1, [&](int r, const float* s) {
    if (lane == 0) {
      float v = bias ? s[0] + ld_bf16(bias + r) : s[0];
      if (hf) v = bf16r(v);
      if (res) v = hf ? bf16r(ld_act(res + r) + v) : ld_act(res + r) + v;
      y[r - y0] = v;
    }
  });
  return;
#endif
  // the rows' bias and residual are loaded before their weights, so their round trips overlap the dot product
  // instead of following it (the residual is an activation: read after the wait, like x)
  auto operands = [&](int r) {
    return make_float2(bias && lane == 0 ? ld_bf16(bias + r) : 0.f, res && lane == 0 ? ld_act(res + r) : 0.f);
  };
  auto store = [&](int r, float acc, float2 o) {
    if (lane == 0) {
      float v = bias ? acc + o.x : acc;
      if (hf) v = bf16r(v);
      if (res) v = hf ? bf16r(o.y + v) : o.y + v;
      y[r - y0] = v;
    }
  };
  const bool short_rows = AMK_SHORT_ROWS && (K >> 3) <= SHORT_CH;  // two rows per round trip (row_dot_short2)
  int r = r0 + warp;
#if AMK_WEIGHT_PRELOAD > 0
  // the warp's first row (short rows: its first two rows) had its first chunks preloaded before the wait
  if (r < r1 && pre_short(K)) {
    for (int k = 0; k < 2 && r < r1; ++k, r += AMK_WARPS) {
      const float2 o = operands(r);
      store(r, pre_dot_short(c, xs, K, k), o);
    }
  } else if (r < r1) {
    const float2 o = operands(r);
    store(r, row_dot(W + (size_t)r * K, xs, K, pre_dot(c, xs, K), 32 * PRE_N), o);
    r += AMK_WARPS;
  }
#endif
  for (; short_rows && r + AMK_WARPS < r1; r += 2 * AMK_WARPS) {
    // (the operands after the pair: loaded before it, they cost a spill in the preload 6 build; the pairs serve
    // the q/k/v and LM-head rows, which have no residual)
    const float2 s = row_dot_short2(W + (size_t)r * K, W + (size_t)(r + AMK_WARPS) * K, xs, K);
    store(r, s.x, operands(r));
    store(r + AMK_WARPS, s.y, operands(r + AMK_WARPS));
  }
  for (; r < r1; r += AMK_WARPS) {
    const float2 o = operands(r);
    store(r, row_dot(W + (size_t)r * K, xs, K), o);
  }
}

// rows [r0, r1) of y = silu(Wg @ xs + bg) * (Wu @ xs + bu); HF: bf16(bf16(silu(bf16(g))) * bf16(u)); x staged by
// stage_x() and the ring at smem[ring_off ..) as in gemv_rows (gate and up chunks of one output row stream together
// and share each x chunk)
template <class StageX>
__device__ __forceinline__ void silu_rows(const Ctx& c, const float* xs, const __nv_bfloat16* Wg,
                                          const __nv_bfloat16* Wu, int K, int r0, int r1, const __nv_bfloat16* bg,
                                          const __nv_bfloat16* bu, float* y, int ring_off, StageX stage_x) {
  const int warp = tid_v() >> 5, lane = tid_v() & 31;
  const bool hf = c.mode == MODE_HF_BF16;
#if AMK_GEMV_IMPL == 2
  RowOperand og, ou;
  auto fetch = [&](int k0) {
    og.fetch_bf16(bg, r0, r1, k0);
    ou.fetch_bf16(bu, r0, r1, k0);
  };
  auto epi = [&](int k, int r, const float* s) {
    if (k > 0 && (k & 31) == 0) fetch(k);
    const float gv = og.at(k), uv = ou.at(k);
    if (lane == 0) {
      float g = bg ? s[0] + gv : s[0];
      float u = bu ? s[1] + uv : s[1];
      y[r] = hf ? bf16r(bf16r(silu(bf16r(g))) * bf16r(u)) : silu(g) * u;
    }
  };
  const __nv_bfloat16* W[2] = {Wg, Wu};
  if (stream_rows_fit<2>(W, K, r0, r1, c.smem + ring_off, c.smem_floats - ring_off, xs, stage_x, fetch, epi)) return;
#else
  (void)ring_off;
#endif
  stage_x();
#if AMK_WSTREAM > 0
  ws_rows<2>(c, xs, K, r0, r1, [&](int r, const float* s) {
    if (lane == 0) {
      float g = bg ? s[0] + ld_bf16(bg + r) : s[0];
      float u = bu ? s[1] + ld_bf16(bu + r) : s[1];
      y[r] = hf ? bf16r(bf16r(silu(bf16r(g))) * bf16r(u)) : silu(g) * u;
    }
  });
  return;
#endif
  for (int r = r0 + warp; r < r1; r += AMK_WARPS) {
#if AMK_WEIGHT_PRELOAD > 0
    const bool first = r == r0 + warp;  // as in gemv_rows: PRE_N / 2 chunks of each of gate and up preloaded
    float2 gu = row_dot2(Wg + (size_t)r * K, Wu + (size_t)r * K, xs, K,
                         first ? pre_dot2(c, xs, K) : make_float2(0.f, 0.f), first ? 16 * PRE_N : 0);
#else
    float2 gu = row_dot2(Wg + (size_t)r * K, Wu + (size_t)r * K, xs, K);
#endif
    if (lane == 0) {
      float g = bg ? gu.x + ld_bf16(bg + r) : gu.x;
      float u = bu ? gu.y + ld_bf16(bu + r) : gu.y;
      y[r] = hf ? bf16r(bf16r(silu(bf16r(g))) * bf16r(u)) : silu(g) * u;
    }
  }
}

// ------------------------------------------------------------------------------ fused GEMVs (norm prologue)
// false (and the E_SMEM error bit) when `floats` do not fit the block's dynamic shared memory; uniform over
// the block, so every thread returns together
__device__ __forceinline__ bool smem_fits(const Ctx& c, int floats) {
  if (floats >= 0 && floats <= c.smem_floats) return true;
  if (tid_v() == 0) atomicOr(c.control + C_ERROR, E_SMEM);
  return false;
}

// xs = rmsnorm(x, w, eps) in the xpos layout (n % 8 == 0), computed exactly as mk_rmsnorm computes its output (same reduction order,
// same rounding in both modes), so a fused task's normalised x is bit-identical to the unfused rmsnorm's
// The norm weight is staged into shared memory with cp.async (no register holds it) BEFORE x is read: its round
// trip overlaps x's and the sum of squares' instead of following them. It goes to the top of the general area, above
// `used` floats (the caller's layout), when there is room, w is 16-byte aligned and n % 8 == 0; otherwise (and in
// GEMV body 2, whose ring owns the area above x) each element is read from global memory where it is used, as
// before. Either way the same bf16 values meet the same arithmetic (bit-identical).
__device__ void norm_into(const Ctx& c, float* xs, const float* x, const __nv_bfloat16* w, int n, float eps, int used) {
  const int at = (c.smem_floats - n / 2) & ~3;  // floats; 16-byte aligned
#if AMK_GEMV_IMPL == 2
  const __nv_bfloat16* wsm = nullptr;
  (void)used; (void)at;
#else
  const __nv_bfloat16* wsm = (n & 7) == 0 && (((uintptr_t)w) & 15) == 0 && at >= ((used + 3) & ~3)
                                 ? (const __nv_bfloat16*)(c.smem + at) : nullptr;
  if (wsm) {
    for (int q = tid_v(); q < (n >> 3); q += AMK_THREADS) cp_async16(smem_addr(wsm + 8 * q), w + 8 * q);
    cp_async_commit();
  }
#endif
  load_x(xs, x, n);
#if AMK_GEMV_IMPL != 2
  if (wsm) cp_async_wait_all();  // this thread's pieces of w landed; the barrier below shows everyone's
#endif
  __syncthreads();
  float ss = 0.f;
  for (int i = tid_v(); i < n; i += AMK_THREADS) {  // x[i] in mk_rmsnorm's order: the same sum
    const float xi = xs[xpos(i, n)];
    ss = fmaf(xi, xi, ss);
  }
  ss = block_sum(c, ss);
  const float var = ss / (float)n;
  const bool hf = c.mode == MODE_HF_BF16;
  const float inv = hf ? rsqrtf(var + eps) : 1.0f / sqrtf(var + eps);
  for (int i = tid_v(); i < n; i += AMK_THREADS) {  // each thread rewrites only the elements it read
    const float wi = wsm ? __bfloat162float(wsm[i]) : ld_bf16(w + i);
    float* p = xs + xpos(i, n);
    *p = hf ? bf16r(wi * bf16r(*p * inv)) : wi * (*p * inv);
  }
  __syncthreads();
}

// x into shared memory (the xpos layout): normalised (norm_into) when nb >= 0, else as it is; ends with a barrier
// (`used`: the floats of shared memory the caller's layout occupies from xs on, for norm_into's staging)
__device__ __forceinline__ void x_into(const Ctx& c, const int* t, float* xs, int xb, int nb, int K, int used) {
  const float* x = (const float*)buf(c, xb);
  if (nb >= 0) {
    norm_into(c, xs, x, (const __nv_bfloat16*)buf(c, nb), K, fbits(t[W_EPS]), used);
  } else {
    load_x(xs, x, K);
    __syncthreads();
  }
}

// gemv:         y[r] = res[r] + (w[r] @ x + b[r]) for r in [row_start, row_end); inputs x, w, [b], [res]
// rmsnorm_gemv: the same with x = rmsnorm(x, nw, eps) computed by the task; inputs x, nw, w, [b], [res]
// (one body, so the micro-kernel is inlined once and both round alike)
__device__ void mk_gemv(const Ctx& c, const int* t, bool norm) {
  const int flags = t[W_FLAGS];
  int k = norm ? 3 : 2;
  const int xb = t[W_IN + 0], nb = norm ? t[W_IN + 1] : -1, wb = t[W_IN + k - 1], yb = t[W_OUT + 0];
  const int bb = (flags & F_BIAS) ? t[W_IN + k++] : -1;
  const int rb = (flags & F_RESID) ? t[W_IN + k++] : -1;
  const int K = bmeta(c, wb, B_ROW);
  if (!smem_fits(c, K)) return;
  float* xs = c.smem;
  gemv_rows(c, xs, (const __nv_bfloat16*)buf(c, wb), K, t[W_ROW0], t[W_ROW1],
            bb >= 0 ? (const __nv_bfloat16*)buf(c, bb) : nullptr, rb >= 0 ? (const float*)buf(c, rb) : nullptr,
            (float*)buf(c, yb), 0, (K + 3) & ~3, [&] { x_into(c, t, xs, xb, nb, K, K); });
}

// gemv_silu_mul:         y[r] = silu(w_gate[r] @ x + b_gate[r]) * (w_up[r] @ x + b_up[r]); inputs x, w_gate, w_up,
//                        [b_gate, b_up]
// rmsnorm_gemv_silu_mul: the same with x = rmsnorm(x, nw, eps); inputs x, nw, w_gate, w_up, [b_gate, b_up]
__device__ void mk_gemv_silu_mul(const Ctx& c, const int* t, bool norm) {
  const int k = norm ? 2 : 1;
  const int xb = t[W_IN + 0], nb = norm ? t[W_IN + 1] : -1, gb = t[W_IN + k], ub = t[W_IN + k + 1], yb = t[W_OUT + 0];
  const bool has_bias = t[W_FLAGS] & F_BIAS;
  const int K = bmeta(c, gb, B_ROW);
  if (!smem_fits(c, K)) return;
  float* xs = c.smem;
  silu_rows(c, xs, (const __nv_bfloat16*)buf(c, gb), (const __nv_bfloat16*)buf(c, ub), K, t[W_ROW0], t[W_ROW1],
            has_bias ? (const __nv_bfloat16*)buf(c, t[W_IN + k + 2]) : nullptr,
            has_bias ? (const __nv_bfloat16*)buf(c, t[W_IN + k + 3]) : nullptr, (float*)buf(c, yb), (K + 3) & ~3,
            [&] { x_into(c, t, xs, xb, nb, K, K); });
}

// ---------------------------------------------------------------------------- silu_mul / add
__device__ void mk_silu_mul(const Ctx& c, const int* t) {
  const int gb = t[W_IN + 0], ub = t[W_IN + 1], yb = t[W_OUT + 0];
  const int n = bmeta(c, yb, B_D0) * bmeta(c, yb, B_ROW);
  const float* g = (const float*)buf(c, gb);
  const float* u = (const float*)buf(c, ub);
  float* y = (float*)buf(c, yb);
  const bool hf = c.mode == MODE_HF_BF16;
  for (int i = threadIdx.x; i < n; i += AMK_THREADS) {
    const float gi = ld_act(g + i), ui = ld_act(u + i);
    y[i] = hf ? bf16r(bf16r(silu(gi)) * ui) : silu(gi) * ui;
  }
}

__device__ void mk_add(const Ctx& c, const int* t) {
  const int ab = t[W_IN + 0], bb = t[W_IN + 1], yb = t[W_OUT + 0];
  const int n = bmeta(c, yb, B_D0) * bmeta(c, yb, B_ROW);
  const float* a = (const float*)buf(c, ab);
  const float* b = (const float*)buf(c, bb);
  float* y = (float*)buf(c, yb);
  for (int i = threadIdx.x; i < n; i += AMK_THREADS) y[i] = rnd(c, ld_act(a + i) + ld_act(b + i));
}

// ------------------------------------------------------------------------------------------- rope
// x * cos + rot * sin as ops.py computes it: two float32 products and one float32 sum, never contracted into an
// FMA (nvcc may contract `a * b + c * d` differently in two builds of the VM: the f32 bits then differ); HF bf16:
// each product and the sum rounded to bf16
__device__ __forceinline__ float rope_mix(bool hf, float x, float co, float rot, float si) {
  const float a = __fmul_rn(x, co), b = __fmul_rn(rot, si);
  return hf ? bf16r(bf16r(a) + bf16r(b)) : __fadd_rn(a, b);
}
// rotate-half RoPE of each head of x at `position`; cos/sin as ops.rope_tables (HF: rounded to bf16)
__device__ void rope_into(const Ctx& c, const int* t, float* y) {
  const int xb = t[W_IN + 0];
  const int nh = t[W_NH], hd = t[W_HD], half = hd >> 1;
  const float* x = (const float*)buf(c, xb);
  const int pos = task_pos(c, t);
  const bool hf = c.mode == MODE_HF_BF16;
  float* cs = c.smem;        // [hd] cos
  float* sn = c.smem + hd;   // [hd] sin
  // cos/sin come from the host-built table (ops.rope_tables: float64 trig rounded to float32, times
  // attention_scaling); the table was built from this task's inv_freq buffer (encode.py checks that)
  const bool in_range = pos >= 0 && pos < c.rope_positions;
  if (!in_range && threadIdx.x == 0) atomicOr(c.control + C_ERROR, E_POSITION);
  const float* row = c.rope_table + (size_t)(in_range ? pos : 0) * 2 * hd;
  for (int i = threadIdx.x; i < hd; i += AMK_THREADS) {
    const float co = __ldg(row + i), si = __ldg(row + hd + i);
    cs[i] = hf ? bf16r(co) : co;
    sn[i] = hf ? bf16r(si) : si;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nh * hd; e += AMK_THREADS) {
    const int h = e / hd, j = e - h * hd;
    const float xv = ld_act(x + e);
    const float rot = j < half ? -ld_act(x + h * hd + j + half) : ld_act(x + h * hd + j - half);
    y[e] = rope_mix(hf, xv, cs[j], rot, sn[j]);
  }
}

__device__ void mk_rope(const Ctx& c, const int* t) { rope_into(c, t, (float*)buf(c, t[W_OUT + 0])); }

__device__ float* kv_slot(const Ctx& c, const int* t, int cache_b) {
  const int pos = task_pos(c, t);
  const int capacity = bmeta(c, cache_b, B_D0) * bmeta(c, cache_b, B_D0 + 1);
  const int kvd = bmeta(c, cache_b, B_D0 + 2);
  if (pos < 0 || pos >= capacity) {
    if (threadIdx.x == 0) atomicOr(c.control + C_ERROR, E_POSITION);
    return nullptr;
  }
  return (float*)buf(c, cache_b) + (size_t)pos * kvd;
}

__device__ void mk_rope_append(const Ctx& c, const int* t) {
  float* slot = kv_slot(c, t, t[W_OUT + 0]);
  if (slot) rope_into(c, t, slot);
}

__device__ void mk_kv_append(const Ctx& c, const int* t) {
  const int cb = t[W_OUT + 0];
  float* slot = kv_slot(c, t, cb);
  if (!slot) return;
  const float* x = (const float*)buf(c, t[W_IN + 0]);
  const int kvd = bmeta(c, cb, B_D0 + 2);
  for (int i = threadIdx.x; i < kvd; i += AMK_THREADS) slot[i] = ld_act(x + i);
}

// ------------------------------------------------------------------------- gemv_rope / gemv_rope_append
// rows [r0, r1) of W @ xn (+ b) (xn = rmsnorm(x, nw, eps) when F_NORM, else x) into shared memory with the
// GEMV's rounding, then (rope) rotate-half RoPE of each whole head of those rows with the host cos/sin table
// (rounded as rope_into rounds), stored at dst[r0 ..]. Optional inputs from index k: nw (F_NORM), b (F_BIAS).
// Shared memory: x [K] | the rows [r1 - r0] | cos [hd] | sin [hd].
__device__ void gemv_rope_into(const Ctx& c, const int* t, bool rope, int k, float* dst) {
  const int flags = t[W_FLAGS];
  const int xb = t[W_IN + 0], wb = t[W_IN + 1];
  const int nb = (flags & F_NORM) ? t[W_IN + k++] : -1;
  const int bb = (flags & F_BIAS) ? t[W_IN + k++] : -1;
  const int K = bmeta(c, wb, B_ROW);
  const int r0 = t[W_ROW0], r1 = t[W_ROW1], nr = r1 - r0, hd = t[W_HD], half = hd >> 1;
  if (!smem_fits(c, K + nr + 2 * hd)) return;
  float* xs = c.smem;
  float* ys = xs + K;
  float* cs = ys + nr;
  float* sn = cs + hd;
  gemv_rows(c, xs, (const __nv_bfloat16*)buf(c, wb), K, r0, r1, bb >= 0 ? (const __nv_bfloat16*)buf(c, bb) : nullptr,
            nullptr, ys, r0, (K + nr + 2 * hd + 3) & ~3, [&] { x_into(c, t, xs, xb, nb, K, K + nr + 2 * hd); });
  const bool hf = c.mode == MODE_HF_BF16;
  if (rope) {  // cos/sin of this position, as rope_into loads them
    const int pos = task_pos(c, t);
    const bool in_range = pos >= 0 && pos < c.rope_positions;
    if (!in_range && threadIdx.x == 0) atomicOr(c.control + C_ERROR, E_POSITION);
    const float* row = c.rope_table + (size_t)(in_range ? pos : 0) * 2 * hd;
    for (int i = threadIdx.x; i < hd; i += AMK_THREADS) {
      const float co = __ldg(row + i), si = __ldg(row + hd + i);
      cs[i] = hf ? bf16r(co) : co;
      sn[i] = hf ? bf16r(si) : si;
    }
  }
  __syncthreads();  // the rows (and cos/sin) are in shared memory
  const bool blocked = flags & F_ROPE_BLOCK;
  for (int e = threadIdx.x; e < nr; e += AMK_THREADS) {
    float v = ys[e];
    if (rope) {
      int j;
      float rot;
      if (blocked) {  // rope_order.py: r0, r1 multiples of 8 (the encoder checks); stored row e pairs with e ^ 4
        const int s = (r0 + e) % hd, w = s & 7;
        j = (w < 4 ? 0 : half) + 4 * (s >> 3) + (w & 3);  // its standard dim
        rot = w < 4 ? -ys[e ^ 4] : ys[e ^ 4];
      } else {  // r0 and r1 are multiples of hd (the encoder checks): e's head starts at e - j
        j = e % hd;
        const int hb = e - j;
        rot = j < half ? -ys[hb + j + half] : ys[hb + j - half];
      }
      v = rope_mix(hf, v, cs[j], rot, sn[j]);
    }
    dst[r0 + e] = v;
  }
}

// gemv_rope:        y[r] = rope(w[r] @ xn + b[r]) for the whole heads in [row_start, row_end); inputs x, w,
//                   inv_freq, [nw], [b]
// gemv_rope_append: cache[slot(position)][r] = (rope when F_ROPE)(w[r] @ xn + b[r]); inputs x, w, [inv_freq],
//                   [nw], [b]
__device__ void mk_gemv_rope(const Ctx& c, const int* t, bool append) {
  const bool rope = !append || (t[W_FLAGS] & F_ROPE);
  float* dst = append ? kv_slot(c, t, t[W_OUT + 0]) : (float*)buf(c, t[W_OUT + 0]);
  if (dst) gemv_rope_into(c, t, rope, rope ? 3 : 2, dst);
}

// -------------------------------------------------------------------------------------- attention
// decode attention of heads row_start/hd .. row_end/hd over cached tokens [first, position] (GQA)
// HF eager: s = bf16(bf16(q.k) * scale); p = bf16(softmax_f32(s)); y = bf16(p @ v)
//
// The heads of one KV group are processed together (up to ATT_NB at a time), so each K and V row is read
// once for all of them. Scores: one token per thread, its K row read as float4 (hd/4 independent 16-byte
// loads in flight per thread). p @ v: thread (grp, d4) owns 4 dims of every head and the tokens
// grp, grp + groups, ... (4 V loads in flight); the groups' partial sums meet in shared memory.
//
// KV staging (build define AMK_ATT_STAGE=1, ScheduleConfig.attention_stage): for a task flagged F_KV_STAGE by the
// encoder whose heads are in one KV group and whose rows fit the general area, att_stage (vm.cu, BEFORE the
// task's wait, with the weight preload) copies the cached K and V rows of positions first .. pos - 1 into shared
// memory with cp.async (rows padded to hd + 4 floats: the score loop's float4 reads are bank-conflict free).
// Those rows were written in earlier steps (the encoder's F_KV_STAGE rule; the step boundary's grid sync or the
// kernel boundary orders them before this step); this step's row pos is read after the wait, together with q.
// Only where the values come from changes: every sum is the unstaged path's, in its order (bit-identical).
#define ATT_NB 8
#ifndef AMK_ATT_NB1  // the staged one-head instantiation (0: every task through the eight-slot code)
#define AMK_ATT_NB1 1
#endif
#ifndef AMK_ATT_STAGE
#define AMK_ATT_STAGE 0
#endif
struct AttShape {
  int hd, rep, kvd, pos, first, n, h0, h1;  // heads [h0, h1) of the task
  bool in_cache, staged;                    // in_cache: the position is inside the cache
  float *qs, *redm, *part, *sc, *ks, *vs;   // shared memory; ks / vs (staged): n rows of ld floats
  int ld, nb_fit;                           // nb_fit: heads whose scores fit sc at once
};
__device__ __forceinline__ AttShape att_shape(const Ctx& c, const int* t) {
  AttShape a;
  const int kb = t[W_IN + 1];
  a.hd = t[W_HD];
  a.rep = t[W_NH] / t[W_NKV];
  a.kvd = bmeta(c, kb, B_D0 + 2);
  a.pos = task_pos(c, t);
  const int window = t[W_WINDOW];
  a.first = window > 0 ? max(0, a.pos - window + 1) : 0;
  a.n = a.pos + 1 - a.first;
  a.h0 = t[W_ROW0] / a.hd;
  a.h1 = t[W_ROW1] / a.hd;
  a.in_cache = a.pos >= 0 && a.pos < bmeta(c, kb, B_D0) * bmeta(c, kb, B_D0 + 1);
  // shared memory: qs [ATT_NB][hd] | redm [AMK_WARPS][ATT_NB] | part [4 * AMK_THREADS] | sc [nb][n] (| ks | vs)
  a.qs = c.smem;
  a.redm = a.qs + ATT_NB * a.hd;
  a.part = a.redm + AMK_WARPS * ATT_NB;
  a.sc = a.part + 4 * AMK_THREADS;
  const int room = c.smem_floats - (int)(a.sc - c.smem);
  a.nb_fit = room / max(a.n, 1);
  a.ld = a.hd + 4;
  a.ks = a.vs = nullptr;
  a.staged = false;
#if AMK_ATT_STAGE
  const int nbt = min(a.h1 - a.h0, ATT_NB);
  const int sc_floats = (nbt * a.n + 3) & ~3;
  if (a.in_cache && (a.hd & 3) == 0 && (t[W_FLAGS] & F_KV_STAGE) && a.h1 > a.h0 && a.h0 / a.rep == (a.h1 - 1) / a.rep &&
      sc_floats + 2 * a.n * a.ld <= room) {
    a.staged = true;
    a.nb_fit = nbt;
    a.ks = a.sc + sc_floats;
    a.vs = a.ks + a.n * a.ld;
  }
#endif
  return a;
}


#if AMK_ATT_STAGE
// before the wait (vm.cu): the staged rows of positions first .. pos - 1 in flight to shared memory (one cp.async
// group per thread; the attention waits for it). The general area is free: the previous task ended with a barrier.
__device__ __forceinline__ void att_stage(const Ctx& c, const int* t, bool run) {
  if (!run || t[W_OP] != OP_ATTENTION) return;
  const AttShape a = att_shape(c, t);
  if (!a.staged) return;
  const int hd4 = a.hd >> 2, g = a.h0 / a.rep;
  const float* K = (const float*)buf(c, t[W_IN + 1]) + (size_t)a.first * a.kvd + g * a.hd;
  const float* V = (const float*)buf(c, t[W_IN + 2]) + (size_t)a.first * a.kvd + g * a.hd;
  for (int i = threadIdx.x; i < (a.n - 1) * hd4; i += AMK_THREADS) {
    const int j = i / hd4, d = 4 * (i - j * hd4);
    cp_async16(smem_addr(a.ks + j * a.ld + d), K + (size_t)j * a.kvd + d);
    cp_async16(smem_addr(a.vs + j * a.ld + d), V + (size_t)j * a.kvd + d);
  }
  cp_async_commit();
}
#endif

// one batch loop of mk_attention; STAGED: K / V rows from a.ks / a.vs (att_stage + this step's row), else global
template <bool STAGED, int NB>
__device__ __forceinline__ void attention_heads(const Ctx& c, const int* t, const AttShape& a) {
  const int hd = a.hd, kvd = a.kvd, n = a.n, rep = a.rep, first = a.first;
  const float scale = fbits(t[W_SCALE]);
  const bool hf = c.mode == MODE_HF_BF16;
  const float* q = (const float*)buf(c, t[W_IN + 0]);
  const float* K = (const float*)buf(c, t[W_IN + 1]);
  const float* V = (const float*)buf(c, t[W_IN + 2]);
  float* y = (float*)buf(c, t[W_OUT + 0]);
  float* qs = a.qs;
  float* redm = a.redm;
  float* part = a.part;
  float* sc = a.sc;
  const int hd4 = hd >> 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups = AMK_THREADS / hd4;  // token groups of the p @ v phase (>= 1: hd <= 4 * AMK_THREADS)
  // F_ROPE_BLOCK (rope_order.py): q and the K rows hold each head in blocks of 4 dims + their 4 RoPE partners; the
  // staged score loop reads their 16-byte chunks in the standard dim order (all first-half chunks, then the second
  // half's), so every sum runs in the standard order. Such a task is always staged (mk_attention refuses it
  // otherwise: remapping the global path's K reads costs that loop spills).
  const bool blk = t[W_FLAGS] & F_ROPE_BLOCK;
  const int hd8 = hd >> 3;
  const int grp = threadIdx.x / hd4, d4 = threadIdx.x - grp * hd4;
  for (int h0 = a.h0; h0 < a.h1;) {
    const int g = h0 / rep;
    int nb = min(min(a.h1, (g + 1) * rep) - h0, min(NB, a.nb_fit));  // heads of group g done together
    const float* Kg = K + (size_t)first * kvd + g * hd;
    const float* Vg = V + (size_t)first * kvd + g * hd;
    __syncthreads();  // the previous batch is done with qs / sc / part
    for (int i = threadIdx.x; i < nb * hd; i += AMK_THREADS) qs[i] = ld_act(q + h0 * hd + i);
    if (STAGED && h0 == a.h0) {
      // this step's row (written by this step's append, read after the wait), from the last threads (q: the first)
      const int i = AMK_THREADS - 1 - threadIdx.x;
      if (i < 2 * hd4) {
        const float* src = (i < hd4 ? Kg : Vg) + (size_t)(n - 1) * kvd;
        float* dst = (i < hd4 ? a.ks : a.vs) + (n - 1) * a.ld;
        const int d = 4 * (i < hd4 ? i : i - hd4);
        *(float4*)(dst + d) = ld_act4((const float4*)(src + d));
      }
      cp_async_wait_all();  // this thread's staged rows
    }
    __syncthreads();
    // scores: thread j holds token j's scores for the nb heads
    float mloc[NB];
#pragma unroll
    for (int h = 0; h < NB; ++h) mloc[h] = -INFINITY;
    for (int j = threadIdx.x; j < n; j += AMK_THREADS) {
      float s[NB];
#pragma unroll
      for (int h = 0; h < NB; ++h) s[h] = 0.f;
      // q . k of the nb heads: the dims in increasing order, 4 per float4 (both paths add alike); e: the chunk of q
      // and of the K row that holds them (rope_block: not the standard chunk)
      auto dot4 = [&](const float4& kv, int e) {
#pragma unroll
        for (int h = 0; h < NB; ++h) {
          if (h >= nb) break;
          const float4 qv = *(const float4*)(qs + h * hd + 4 * e);
          s[h] = fmaf(qv.x, kv.x, s[h]); s[h] = fmaf(qv.y, kv.y, s[h]);
          s[h] = fmaf(qv.z, kv.z, s[h]); s[h] = fmaf(qv.w, kv.w, s[h]);
        }
      };
      if (STAGED) {  // shared memory: one float4 at a time (no registers for loads in flight)
        const float4* kr = (const float4*)(a.ks + j * a.ld);
        if (blk) {  // standard chunk e is stored chunk 2e (first half) or 2(e - hd/8) + 1, in q and K alike
          for (int e = 0; e < hd8; ++e) dot4(kr[2 * e], 2 * e);
          for (int e = 0; e < hd8; ++e) dot4(kr[2 * e + 1], 2 * e + 1);
        } else {
          for (int e = 0; e < hd4; ++e) dot4(kr[e], e);
        }
      } else {
        const float4* kr = (const float4*)(Kg + (size_t)j * kvd);
        for (int e = 0; e < hd4; e += 8) {
          float4 kv[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) kv[u] = e + u < hd4 ? ld_act4(kr + e + u) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            if (e + u >= hd4) break;
            dot4(kv[u], e + u);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < NB; ++h) {
        if (h >= nb) break;
        const float v = hf ? bf16r(bf16r(s[h]) * scale) : s[h] * scale;
        sc[h * n + j] = v;
        mloc[h] = fmaxf(mloc[h], v);
      }
    }
    // block max per head
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      const float m = warp_max(mloc[h]);
      if (lane == 0) redm[warp * ATT_NB + h] = m;
    }
    __syncthreads();
    float m[NB], sum[NB];
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      float v = -INFINITY;
      for (int w = 0; w < AMK_WARPS; ++w) v = fmaxf(v, redm[w * ATT_NB + h]);
      m[h] = v;
      sum[h] = 0.f;
    }
    for (int j = threadIdx.x; j < n; j += AMK_THREADS) {
#pragma unroll
      for (int h = 0; h < NB; ++h) {
        if (h >= nb) break;
        const float e = expf(sc[h * n + j] - m[h]);
        sc[h * n + j] = e;
        sum[h] += e;
      }
    }
    __syncthreads();  // every thread has read redm (the maxima) before it is reused for the sums
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      const float v = warp_sum(sum[h]);
      if (lane == 0) redm[warp * ATT_NB + h] = v;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      float v = 0.f;
      for (int w = 0; w < AMK_WARPS; ++w) v += redm[w * ATT_NB + h];
      sum[h] = v;
    }
    for (int j = threadIdx.x; j < n; j += AMK_THREADS) {
#pragma unroll
      for (int h = 0; h < NB; ++h) {
        if (h >= nb) break;
        sc[h * n + j] = rnd(c, sc[h * n + j] / sum[h]);
      }
    }
    __syncthreads();
    // p @ v: thread (grp, d4) sums tokens grp, grp + groups, ... for dims 4*d4 .. 4*d4+3 of every head
    float4 acc[NB];
#pragma unroll
    for (int h = 0; h < NB; ++h) acc[h] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (grp < groups) {
      // tokens grp, grp + groups, ... in bursts of 4 loads in flight (the last burst guarded: a short context
      // costs one round trip, not one per token); each thread adds its tokens in increasing order
      auto pv = [&](const float4& vv, int jj) {
#pragma unroll
        for (int h = 0; h < NB; ++h) {
          if (h >= nb) break;
          const float p = sc[h * n + jj];
          acc[h].x = fmaf(p, vv.x, acc[h].x); acc[h].y = fmaf(p, vv.y, acc[h].y);
          acc[h].z = fmaf(p, vv.z, acc[h].z); acc[h].w = fmaf(p, vv.w, acc[h].w);
        }
      };
      if (STAGED) {
        for (int j = grp; j < n; j += groups) pv(*(const float4*)(a.vs + j * a.ld + 4 * d4), j);
      } else {
        const float* Vd = Vg + 4 * d4;
        for (int j = grp; j < n; j += 4 * groups) {
          float4 vv[4];
#pragma unroll
          for (int u = 0; u < 4; ++u)
            vv[u] = j + u * groups < n ? ld_act4((const float4*)(Vd + (size_t)(j + u * groups) * kvd))
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            if (j + u * groups >= n) break;
            pv(vv[u], j + u * groups);
          }
        }
      }
    }
    // the groups' partial sums meet in shared memory, one head at a time
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      if (h >= nb) break;
      __syncthreads();  // part is free (previous head summed)
      if (grp < groups) *(float4*)(part + 4 * (grp * hd4 + d4)) = acc[h];
      __syncthreads();
      for (int d = threadIdx.x; d < hd; d += AMK_THREADS) {
        float s = 0.f;
        for (int k = 0; k < groups; ++k) s += part[k * hd + d];
        y[(h0 + h) * hd + d] = rnd(c, s);
      }
    }
    h0 += nb;
  }
}

__device__ void mk_attention(const Ctx& c, const int* t) {
  const AttShape a = att_shape(c, t);
  if (!a.in_cache) {
    if (threadIdx.x == 0) atomicOr(c.control + C_ERROR, E_POSITION);
    return;
  }
  if (a.nb_fit < 1 || (a.hd & 3)) {
    if (threadIdx.x == 0) atomicOr(c.control + C_ERROR, E_SCORES);
    return;
  }
#if AMK_ATT_STAGE
  if (a.staged) {  // one head (attention_q_heads_per_task = 1): one score slot, the same sums as slot 0 of eight
    if (AMK_ATT_NB1 && a.h1 - a.h0 == 1) attention_heads<true, 1>(c, t, a);
    else attention_heads<true, ATT_NB>(c, t, a);
    return;
  }
#endif
  if (t[W_FLAGS] & F_ROPE_BLOCK) {  // blocked K rows are read only through the staging (CudaVM checks the fit)
    if (threadIdx.x == 0) atomicOr(c.control + C_ERROR, E_ROPE_BLOCK);
    return;
  }
  attention_heads<false, ATT_NB>(c, t, a);
}

// ----------------------------------------------------------------------------------------- argmax
// NaN counts as the maximum, as numpy and torch do
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (isnan(v)) return !isnan(bv) || i < bi;
  if (isnan(bv)) return false;
  return v > bv || (v == bv && i < bi);
}
// the first index of the maximum of l[0, n) (NaN counts as the maximum) as (value, base + index), for thread 0
// (index 0x7fffffff when n == 0); float4 loads, 8 in flight per thread, when l is 16-byte aligned
__device__ __forceinline__ void block_argmax(const Ctx& c, const float* l, int n, int base, float& best_v, int& best_i) {
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  int i0 = 0;
  if ((((uintptr_t)l) & 15) == 0) {
    const float4* l4 = (const float4*)l;
    const int n4 = n >> 2;
    int k = threadIdx.x;
    for (; k + 7 * AMK_THREADS < n4; k += 8 * AMK_THREADS) {
      float4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = ld_act4(l4 + k + u * AMK_THREADS);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = 4 * (k + u * AMK_THREADS);
        if (better(v[u].x, i, bv, bi)) { bv = v[u].x; bi = i; }
        if (better(v[u].y, i + 1, bv, bi)) { bv = v[u].y; bi = i + 1; }
        if (better(v[u].z, i + 2, bv, bi)) { bv = v[u].z; bi = i + 2; }
        if (better(v[u].w, i + 3, bv, bi)) { bv = v[u].w; bi = i + 3; }
      }
    }
    for (; k < n4; k += AMK_THREADS) {
      const float4 v = ld_act4(l4 + k);
      const int i = 4 * k;
      if (better(v.x, i, bv, bi)) { bv = v.x; bi = i; }
      if (better(v.y, i + 1, bv, bi)) { bv = v.y; bi = i + 1; }
      if (better(v.z, i + 2, bv, bi)) { bv = v.z; bi = i + 2; }
      if (better(v.w, i + 3, bv, bi)) { bv = v.w; bi = i + 3; }
    }
    i0 = n4 << 2;
  }
  for (int i = i0 + threadIdx.x; i < n; i += AMK_THREADS) {
    const float v = ld_act(l + i);
    if (better(v, i, bv, bi)) { bv = v; bi = i; }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
  }
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) { c.red[w] = bv; c.ired[w] = bi; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < AMK_WARPS; ++k)
      if (better(c.red[k], c.ired[k], bv, bi)) { bv = c.red[k]; bi = c.ired[k]; }
    best_v = bv;
    best_i = bi == 0x7fffffff ? bi : base + bi;
  }
}

// the three argmax ops share one inlined block_argmax (three copies cost registers: 8 B of spills with preload 6):
//   argmax:         token[0] = first index of max(logits)
//   argmax_partial: val[part], idx[part] = max and first index of max of logits[row_start, row_end)
//   argmax_combine: token[0] = idx[first k of max(val)] (parts in row order: the first index of the global max)
__device__ void mk_argmax(const Ctx& c, const int* t, int op) {
  const int lb = t[W_IN + 0];
  const bool part = op == OP_ARGMAX_PARTIAL;
  const int r0 = part ? t[W_ROW0] : 0;
  const int n = part ? t[W_ROW1] - r0 : bmeta(c, lb, B_D0);
  float bv;
  int bi;
  block_argmax(c, (const float*)buf(c, lb) + r0, n, r0, bv, bi);
  if (threadIdx.x != 0) return;
  if (part) {
    ((float*)buf(c, t[W_OUT + 0]))[t[W_PART]] = bv;
    ((int*)buf(c, t[W_OUT + 1]))[t[W_PART]] = bi == 0x7fffffff ? r0 : bi;
  } else if (op == OP_ARGMAX_COMBINE) {
    *(int*)buf(c, t[W_OUT + 0]) = bi == 0x7fffffff ? 0 : __ldcg((const int*)buf(c, t[W_IN + 1]) + bi);
  } else {
    *(int*)buf(c, t[W_OUT + 0]) = bi == 0x7fffffff ? 0 : bi;
  }
}
