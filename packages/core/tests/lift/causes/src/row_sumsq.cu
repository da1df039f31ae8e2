// Squared L2 norm of each row, one CTA per row (cols a multiple of 4, rows 16-byte aligned).
// Planted construct: VEC, the width of the row loads (1 float, 2 float2, 4 float4); the loop only loads.
#include "common.cuh"
#ifndef VEC
#define VEC 1
#endif

extern "C" __global__ void __launch_bounds__(256) row_sumsq(const float* __restrict__ x, float* __restrict__ out,
                                                            int cols) {
  __shared__ float red[32];
  const float* xr = x + (size_t)blockIdx.x * cols;
  float ss = 0.f;
#if VEC == 4
  const float4* x4 = reinterpret_cast<const float4*>(xr);
  for (int j = threadIdx.x; j < cols / 4; j += blockDim.x) {
    const float4 v = x4[j];
    ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
  }
#elif VEC == 2
  const float2* x2 = reinterpret_cast<const float2*>(xr);
  for (int j = threadIdx.x; j < cols / 2; j += blockDim.x) {
    const float2 v = x2[j];
    ss = fmaf(v.x, v.x, fmaf(v.y, v.y, ss));
  }
#else
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = xr[j];
    ss = fmaf(v, v, ss);
  }
#endif
  ss = block_sum(ss, red);
  if (threadIdx.x == 0) out[blockIdx.x] = ss;
}
