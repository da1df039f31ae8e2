// Online softmax statistics, one warp per row: a single pass keeps the running max and the running sum
// rescaled by exp(old max - new max); lane 0 writes (max, 1/sum). Planted construct: FAST (0 expf, 1 __expf).
#include "common.cuh"
#ifndef FAST
#define FAST 0
#endif
#if FAST
#define EXPF __expf
#else
#define EXPF expf
#endif

extern "C" __global__ void __launch_bounds__(256) online_softmax_stats(const float* __restrict__ x,
                                                                       float2* __restrict__ stats, int rows,
                                                                       int cols) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + (size_t)row * cols;
  float m = -INFINITY, s = 0.f;
  for (int j = lane; j < cols; j += 32) {
    const float v = xr[j];
    const float mn = fmaxf(m, v);
    s = s * EXPF(m - mn) + EXPF(v - mn);
    m = mn;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, o);
    const float so = __shfl_xor_sync(0xffffffffu, s, o);
    const float mn = fmaxf(m, mo);
    s = s * EXPF(m - mn) + so * EXPF(mo - mn);
    m = mn;
  }
  if (lane == 0) stats[row] = make_float2(m, 1.f / s);
}
