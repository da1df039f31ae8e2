// 1-D 5-point smoothing over tiles of 256 outputs: the CTA stages each tile plus a 2-element halo on either
// side in shared memory, then every thread combines five neighbours. Planted construct: ASYNC, how the tile
// reaches shared memory (0: ld.global then st.shared, 1: 4-byte cp.async with commit/wait).
#include <cuda_pipeline.h>
#ifndef ASYNC
#define ASYNC 0
#endif
#define TILE 256
#define HALO 2

__device__ __forceinline__ void stage(float* dst, const float* src) {
#if ASYNC
  __pipeline_memcpy_async(dst, src, sizeof(float));
#else
  *dst = *src;
#endif
}

// x has n + 2 * HALO elements (padded); y has n.
extern "C" __global__ void __launch_bounds__(TILE) smooth5(const float* __restrict__ x, float* __restrict__ y,
                                                           int tiles) {
  __shared__ float s[TILE + 2 * HALO];
  const int t = threadIdx.x;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const float* src = x + (size_t)tile * TILE;
    stage(&s[t], &src[t]);
    if (t < 2 * HALO) stage(&s[TILE + t], &src[TILE + t]);
#if ASYNC
    __pipeline_commit();
    __pipeline_wait_prior(0);
#endif
    __syncthreads();
    y[(size_t)tile * TILE + t] =
        0.0625f * (s[t] + s[t + 4]) + 0.25f * (s[t + 1] + s[t + 3]) + 0.375f * s[t + 2];
    __syncthreads();
  }
}
