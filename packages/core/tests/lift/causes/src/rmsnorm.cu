// RMSNorm, one CTA per row: a sum-of-squares pass, then y = x * rsqrt(mean + eps) * w.
// Planted construct: UNROLL, the unroll factor of the output pass (the hot loop: two loads and a store).
#include "common.cuh"
#ifndef UNROLL
#define UNROLL 1
#endif

extern "C" __global__ void __launch_bounds__(256) rmsnorm_rows(const float* __restrict__ x,
                                                               const float* __restrict__ w, float* __restrict__ y,
                                                               int cols, float eps) {
  __shared__ float red[32];
  const float* xr = x + (size_t)blockIdx.x * cols;
  float* yr = y + (size_t)blockIdx.x * cols;
  float ss = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = xr[j];
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / cols + eps);
  MOSAIC_UNROLL(UNROLL)
  for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = xr[j] * r * w[j];
}
