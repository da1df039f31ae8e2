// Row softmax, one CTA per row: a max pass, an exp pass (exp written out and summed), a scale pass.
// Planted constructs: EXP_FORM (0 expf, 1 __expf, 2 exp2f with the log2(e) factor folded into the argument)
// and UNROLL, the unroll factor of the exp pass.
#include "common.cuh"
#ifndef EXP_FORM
#define EXP_FORM 0
#endif
#ifndef UNROLL
#define UNROLL 1
#endif

__device__ __forceinline__ float row_exp(float v) {
#if EXP_FORM == 1
  return __expf(v);
#elif EXP_FORM == 2
  return exp2f(v * 1.4426950408889634f);
#else
  return expf(v);
#endif
}

extern "C" __global__ void __launch_bounds__(256) softmax_rows(const float* __restrict__ x, float* __restrict__ y,
                                                               int cols) {
  __shared__ float red[32];
  const float* xr = x + (size_t)blockIdx.x * cols;
  float* yr = y + (size_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
  m = block_max(m, red);
  float s = 0.f;
  MOSAIC_UNROLL(UNROLL)
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float e = row_exp(xr[j] - m);
    yr[j] = e;
    s += e;
  }
  s = block_sum(s, red);
  const float inv = 1.f / s;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] *= inv;
}
