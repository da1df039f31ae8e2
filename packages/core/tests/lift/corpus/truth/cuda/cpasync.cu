// cp.async double buffering of a tile into shared memory.
#include <cuda_pipeline.h>
extern "C" __global__ void __launch_bounds__(128) cp_tiles(const float4* src, float* out, int tiles) {
  __shared__ float4 buf[2][128];
  float acc = 0.f;
  __pipeline_memcpy_async(&buf[0][threadIdx.x], &src[threadIdx.x], 16);
  __pipeline_commit();
#pragma unroll 1
  for (int t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) __pipeline_memcpy_async(&buf[(t + 1) & 1][threadIdx.x], &src[(t + 1) * 128 + threadIdx.x], 16);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncthreads();
    float4 v = buf[t & 1][(threadIdx.x + 1) & 127];
    acc += v.x + v.y + v.z + v.w;
    __syncthreads();
  }
  out[blockIdx.x * 128 + threadIdx.x] = acc;
}
