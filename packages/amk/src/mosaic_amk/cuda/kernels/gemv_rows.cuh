// AMK micro-kernels: the GEMV row streams (the weight rows of every GEMV-family task: body 1's register
// bursts, the short-row paths, the weight preload, the TMA weight stream, body 2's cp.async ring).
#pragma once
#include "common.cuh"

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
  if (wb.x < 0 || r >= t[W_ROW1] || bmeta(c, wb.x, B_DTYPE) != DT_BF16) return;  // quantized: gemv_quant.cuh loads
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
    const int rows = wb.x >= 0 && r < r1 && bmeta(c, wb.x, B_DTYPE) == DT_BF16  // quantized: no stream
                         ? (r1 - r + AMK_WARPS - 1) / AMK_WARPS : 0;
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
