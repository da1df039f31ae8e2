// RMSNorm in plain CUDA for the rewrite tests, written with an exact reciprocal square root:
// y = x * (1.0f / sqrtf(mean(x^2) + eps)) * w, one block per row. The mean divides through __fdividef, so
// the only IEEE division in the build is the one in "1.0f / sqrtf(...)" (which rsqrt-approx removes).
//
// mosaic:entry rmsnorm
// mosaic:inputs x[rows,cols] w[cols]
// mosaic:outputs y[rows,cols]
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef MOSAIC_T
#define MOSAIC_T float
#endif

struct Knobs {  // frozen
  static constexpr int threads = 256;
  static constexpr float eps = 1e-6f;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

extern "C" __global__ void __launch_bounds__(Knobs::threads)
rmsnorm(const MOSAIC_T* __restrict__ x, const MOSAIC_T* __restrict__ w, MOSAIC_T* __restrict__ y, int rows, int cols) {
  __shared__ float partial[Knobs::threads / 32];
  const int row = blockIdx.x;
  if (row >= rows) return;
  const MOSAIC_T* xr = x + static_cast<size_t>(row) * cols;
  MOSAIC_T* yr = y + static_cast<size_t>(row) * cols;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < cols; j += Knobs::threads) {
    const float v = to_float(xr[j]);
    sum += v * v;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < Knobs::threads / 32; ++i) total += partial[i];
  const float rstd = 1.0f / sqrtf(__fdividef(total, static_cast<float>(cols)) + Knobs::eps);
  for (int k = threadIdx.x; k < cols; k += Knobs::threads)
    yr[k] = from_float<MOSAIC_T>(to_float(xr[k]) * rstd * to_float(w[k]));
}

// The launch (dims: rows, cols): one block per row.
void mosaic_geometry(const int* dims, unsigned grid[3], unsigned block[3], unsigned* smem_bytes) {
  grid[0] = static_cast<unsigned>(dims[0]);
  block[0] = Knobs::threads;
  *smem_bytes = 0;
}
