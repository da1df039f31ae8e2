// AMK micro-kernels: the elementwise ops (silu_mul, add).
#pragma once
#include "common.cuh"

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
