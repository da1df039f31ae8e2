// AMK micro-kernels: RMSNorm.
#pragma once
#include "common.cuh"

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
