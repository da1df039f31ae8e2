// A row softmax in plain CUDA for the rewrite tests: y = exp(x - max) / sum(exp(x - max)) over each row,
// one block per row, float accumulation. It is written with the exact forms the C++ rewrites edit: expf in
// the two passes, a reciprocal through a float division, and runtime-trip loops with no unroll pragma. Integer divisions (the warp index) and the text
// "expf(x) / sqrtf(y)" in this comment and in the string below must never be rewritten.
//
// mosaic:entry softmax_row
// mosaic:inputs x[rows,cols]
// mosaic:outputs y[rows,cols]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#ifndef MOSAIC_T
#define MOSAIC_T float
#endif
#define MOSAIC_NOTE "expf(1.0f / sqrtf(2.0f))"

struct Knobs {  // frozen
  static constexpr int threads = 256;
  static constexpr float scale = 1.0f;  // a (unit) temperature: exp((x - max) * scale)
};

static_assert(Knobs::threads % 32 == 0 && Knobs::threads <= 1024, "threads: a multiple of 32, at most 1024");

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = lane < Knobs::threads / 32 ? red[lane] : (is_max ? -INFINITY : 0.0f);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, s, offset);
      s = is_max ? fmaxf(s, o) : s + o;
    }
    if (threadIdx.x == 0) red[0] = s;
  }
  __syncthreads();
  const float out = red[0];
  __syncthreads();
  return out;
}

extern "C" __global__ void __launch_bounds__(Knobs::threads)
softmax_row(const MOSAIC_T* __restrict__ x, MOSAIC_T* __restrict__ y, int rows, int cols) {
  __shared__ float red[32];
  const int row = blockIdx.x;
  if (row >= rows) return;
  const MOSAIC_T* xr = x + static_cast<size_t>(row) * cols;
  MOSAIC_T* yr = y + static_cast<size_t>(row) * cols;
  const char* note = MOSAIC_NOTE " and expf(z)";  // a string: never rewritten
  (void)note;

  float m = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += Knobs::threads) m = fmaxf(m, to_float(xr[j]));
  m = block_reduce(m, red, true);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < cols; j += Knobs::threads) {
    const float e = expf((to_float(xr[j]) - m) * Knobs::scale);
    sum += e;
  }
  sum = block_reduce(sum, red, false);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < cols; j += Knobs::threads)
    yr[j] = from_float<MOSAIC_T>(expf((to_float(xr[j]) - m) * Knobs::scale) * inv);
}

// The launch (dims: rows, cols): one block per row.
void mosaic_geometry(const int* dims, unsigned grid[3], unsigned block[3], unsigned* smem_bytes) {
  grid[0] = static_cast<unsigned>(dims[0]);
  block[0] = Knobs::threads;
  *smem_bytes = 0;
}
