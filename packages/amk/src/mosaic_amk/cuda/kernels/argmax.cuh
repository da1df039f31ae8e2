// AMK micro-kernels: the argmax (argmax, argmax_partial, argmax_combine).
#pragma once
#include "common.cuh"

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
