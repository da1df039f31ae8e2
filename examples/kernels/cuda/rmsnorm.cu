// RMSNorm in plain CUDA: y = x / sqrt(mean(x^2) + eps) * w over each row, one block per row, float
// accumulation (a warp shuffle tree, then one warp over the per-warp sums). Written for Mosaicist's
// kernel-file contract (docs/kernel-files.md):
//
//   mosaic capture --file examples/kernels/cuda/rmsnorm.cu --lang cutlass --family rmsnorm \
//       --shape 4096x8192 --dtype bf16 --knob threads=512 --lower-only -o rmsnorm.bundle
//
// mosaic:entry rmsnorm
// mosaic:inputs x[rows,cols] w[cols]
// mosaic:outputs y[rows,cols]
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef MOSAIC_T  // the build defines the element type: __nv_bfloat16, __half or float
#define MOSAIC_T __nv_bfloat16
#endif

struct Knobs {  // frozen: every member static constexpr; `--knob threads=512` replaces the literal
  static constexpr int threads = 256;  // threads per block: a multiple of 32, at most 1024
  static constexpr int unroll = 4;     // loads in flight per thread in the sum-of-squares loop
  static constexpr float eps = 1e-6f;  // mosaic's rmsnorm oracle uses 1e-6
};

static_assert(Knobs::threads % 32 == 0 && Knobs::threads >= 32 && Knobs::threads <= 1024,
              "Knobs::threads must be a multiple of 32 in [32, 1024]");
static_assert(Knobs::unroll >= 1 && Knobs::unroll <= 16, "Knobs::unroll must be in [1, 16]");

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

extern "C" __global__ void __launch_bounds__(Knobs::threads)
rmsnorm(const MOSAIC_T* __restrict__ x, const MOSAIC_T* __restrict__ w, MOSAIC_T* __restrict__ y, int rows, int cols) {
  constexpr int warps = Knobs::threads / 32;
  __shared__ float partial[warps];
  const int row = blockIdx.x;
  if (row >= rows) return;
  const MOSAIC_T* xr = x + static_cast<size_t>(row) * cols;
  MOSAIC_T* yr = y + static_cast<size_t>(row) * cols;

  float sum = 0.0f;
  int j = threadIdx.x;
  for (; j + (Knobs::unroll - 1) * Knobs::threads < cols; j += Knobs::unroll * Knobs::threads) {
    float v[Knobs::unroll];
#pragma unroll
    for (int u = 0; u < Knobs::unroll; ++u) v[u] = to_float(xr[j + u * Knobs::threads]);
#pragma unroll
    for (int u = 0; u < Knobs::unroll; ++u) sum += v[u] * v[u];
  }
  for (; j < cols; j += Knobs::threads) {
    const float v = to_float(xr[j]);
    sum += v * v;
  }
  sum = warp_sum(sum);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < warps ? partial[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    if (threadIdx.x == 0) partial[0] = s;
  }
  __syncthreads();
  const float scale = rsqrtf(partial[0] / static_cast<float>(cols) + Knobs::eps);
  for (int k = threadIdx.x; k < cols; k += Knobs::threads)
    yr[k] = from_float<MOSAIC_T>(to_float(xr[k]) * scale * to_float(w[k]));
}

// The launch for a shape (dims in the family's order: rows, cols): one block per row.
void mosaic_geometry(const int* dims, unsigned grid[3], unsigned block[3], unsigned* smem_bytes) {
  grid[0] = static_cast<unsigned>(dims[0]);
  block[0] = Knobs::threads;
  *smem_bytes = 0;
}
