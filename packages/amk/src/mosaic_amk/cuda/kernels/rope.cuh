// AMK micro-kernels: RoPE and the KV-cache appends (rope, rope_append, kv_append, gemv_rope,
// gemv_rope_append).
#pragma once
#include "gemv.cuh"

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
            nullptr, ys, r0, (K + nr + 2 * hd + 3) & ~3, [&] { x_into(c, t, xs, xb, nb, K, K + nr + 2 * hd); },
            bmeta(c, wb, B_DTYPE), bmeta(c, wb, B_D0));
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
