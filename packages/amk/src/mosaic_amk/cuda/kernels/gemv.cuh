// AMK micro-kernels: the GEMV family (gemv, gemv_silu_mul; the rmsnorm_gemv fusion's norm prologue).
#pragma once
#include "gemv_rows.cuh"
#include "gemv_quant.cuh"

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
// A quantized W (wfmt DT_Q8_0 / DT_Q4_1 / DT_INT8, wrows its rows: gemv_quant.cuh) stages x first, then runs
// qgemv_rows with the same epilogue (no ring, no preload, no weight stream, no L2 prefetch).
template <class StageX>
__device__ __forceinline__ void gemv_rows(const Ctx& c, const float* xs, const __nv_bfloat16* W, int K, int r0, int r1,
                                          const __nv_bfloat16* bias, const float* res, float* y, int y0, int ring_off,
                                          StageX stage_x, int wfmt = DT_BF16, int wrows = 0) {
  const int warp = tid_v() >> 5, lane = tid_v() & 31;
  const bool hf = c.mode == MODE_HF_BF16;
  if (wfmt != DT_BF16) {
#if AMK_QUANT
    stage_x();
    qgemv_rows((const unsigned char*)W, wfmt, K, wrows, r0, r1, xs, [&](int r, float acc) {
      if (lane == 0) {
        float v = bias ? acc + ld_bf16(bias + r) : acc;
        if (hf) v = bf16r(v);
        if (res) v = hf ? bf16r(ld_act(res + r) + v) : ld_act(res + r) + v;
        y[r - y0] = v;
      }
    });
#else
    if (tid_v() == 0) atomicOr(c.control + C_ERROR, E_QUANT);
#endif
    return;
  }
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
                                          const __nv_bfloat16* bu, float* y, int ring_off, StageX stage_x,
                                          int wfmt = DT_BF16, int wrows = 0) {
  const int warp = tid_v() >> 5, lane = tid_v() & 31;
  const bool hf = c.mode == MODE_HF_BF16;
  if (wfmt != DT_BF16) {  // quantized gate and up (one format, the encoder checked): gemv_quant.cuh
#if AMK_QUANT
    stage_x();
    qgemv_rows2((const unsigned char*)Wg, (const unsigned char*)Wu, wfmt, K, wrows, r0, r1, xs,
                [&](int r, float ga, float ua) {
      if (lane == 0) {
        float g = bg ? ga + ld_bf16(bg + r) : ga;
        float u = bu ? ua + ld_bf16(bu + r) : ua;
        y[r] = hf ? bf16r(bf16r(silu(bf16r(g))) * bf16r(u)) : silu(g) * u;
      }
    });
#else
    if (tid_v() == 0) atomicOr(c.control + C_ERROR, E_QUANT);
#endif
    return;
  }
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
            (float*)buf(c, yb), 0, (K + 3) & ~3, [&] { x_into(c, t, xs, xb, nb, K, K); }, bmeta(c, wb, B_DTYPE),
            bmeta(c, wb, B_D0));
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
            [&] { x_into(c, t, xs, xb, nb, K, K); }, bmeta(c, gb, B_DTYPE), bmeta(c, gb, B_D0));
}
