// A shared-memory tiled GEMM in plain CUDA: c = a @ b, a (m x k) and b (k x n) row-major, float
// accumulation, each thread computing a thread_m x thread_n block of c from tiles staged in shared
// memory. No tensor cores: a small, readable starting point for a port. Written for Mosaicist's
// kernel-file contract (docs/kernel-files.md):
//
//   mosaic capture --file examples/kernels/cuda/gemm.cu --lang cutlass --family gemm \
//       --shape 4096x4096x4096 --dtype bf16 --knob tile_m=128 --knob thread_m=8 --lower-only -o gemm.bundle
//
// mosaic:entry tiled_gemm
// mosaic:inputs a[m,k] b[k,n]
// mosaic:outputs c[m,n]
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef MOSAIC_T
#define MOSAIC_T __nv_bfloat16
#endif

struct Knobs {  // frozen: static constexpr members only
  static constexpr int tile_m = 64;    // rows of c per block
  static constexpr int tile_n = 64;    // columns of c per block
  static constexpr int tile_k = 16;    // depth of one shared-memory stage
  static constexpr int thread_m = 4;   // rows of c per thread
  static constexpr int thread_n = 4;   // columns of c per thread
  static constexpr bool pad_smem = true;  // one extra column per shared row (fewer bank conflicts)
};

constexpr int kThreads = (Knobs::tile_m / Knobs::thread_m) * (Knobs::tile_n / Knobs::thread_n);
constexpr int kPad = Knobs::pad_smem ? 1 : 0;
static_assert(Knobs::tile_m % Knobs::thread_m == 0 && Knobs::tile_n % Knobs::thread_n == 0,
              "tile_m/tile_n must be multiples of thread_m/thread_n");
static_assert(kThreads >= 32 && kThreads <= 1024 && kThreads % 32 == 0,
              "(tile_m/thread_m)*(tile_n/thread_n) threads must be a multiple of 32 in [32, 1024]");

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

extern "C" __global__ void __launch_bounds__(kThreads)
tiled_gemm(const MOSAIC_T* __restrict__ a, const MOSAIC_T* __restrict__ b, MOSAIC_T* __restrict__ c,
           int m, int n, int k) {
  __shared__ float as[Knobs::tile_k][Knobs::tile_m + kPad];  // a tile, transposed: as[kk][row]
  __shared__ float bs[Knobs::tile_k][Knobs::tile_n + kPad];
  const int tid = threadIdx.x;
  const int tx = tid % (Knobs::tile_n / Knobs::thread_n);
  const int ty = tid / (Knobs::tile_n / Knobs::thread_n);
  const int row0 = blockIdx.y * Knobs::tile_m;
  const int col0 = blockIdx.x * Knobs::tile_n;
  float acc[Knobs::thread_m][Knobs::thread_n] = {};

  for (int k0 = 0; k0 < k; k0 += Knobs::tile_k) {
    for (int i = tid; i < Knobs::tile_m * Knobs::tile_k; i += kThreads) {
      const int r = i / Knobs::tile_k, kk = i % Knobs::tile_k;
      const int gr = row0 + r, gk = k0 + kk;
      as[kk][r] = (gr < m && gk < k) ? to_float(a[static_cast<size_t>(gr) * k + gk]) : 0.0f;
    }
    for (int i = tid; i < Knobs::tile_k * Knobs::tile_n; i += kThreads) {
      const int kk = i / Knobs::tile_n, cc = i % Knobs::tile_n;
      const int gk = k0 + kk, gc = col0 + cc;
      bs[kk][cc] = (gk < k && gc < n) ? to_float(b[static_cast<size_t>(gk) * n + gc]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < Knobs::tile_k; ++kk) {
      float av[Knobs::thread_m], bv[Knobs::thread_n];
#pragma unroll
      for (int i = 0; i < Knobs::thread_m; ++i) av[i] = as[kk][ty * Knobs::thread_m + i];
#pragma unroll
      for (int j = 0; j < Knobs::thread_n; ++j) bv[j] = bs[kk][tx * Knobs::thread_n + j];
#pragma unroll
      for (int i = 0; i < Knobs::thread_m; ++i)
#pragma unroll
        for (int j = 0; j < Knobs::thread_n; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < Knobs::thread_m; ++i) {
    const int r = row0 + ty * Knobs::thread_m + i;
#pragma unroll
    for (int j = 0; j < Knobs::thread_n; ++j) {
      const int cc = col0 + tx * Knobs::thread_n + j;
      if (r < m && cc < n) c[static_cast<size_t>(r) * n + cc] = from_float<MOSAIC_T>(acc[i][j]);
    }
  }
}

// The launch (dims in the family's order: m, n, k): one block per tile_m x tile_n tile of c.
void mosaic_geometry(const int* dims, unsigned grid[3], unsigned block[3], unsigned* smem_bytes) {
  grid[0] = static_cast<unsigned>((dims[1] + Knobs::tile_n - 1) / Knobs::tile_n);
  grid[1] = static_cast<unsigned>((dims[0] + Knobs::tile_m - 1) / Knobs::tile_m);
  block[0] = kThreads;
  *smem_bytes = 0;  // the tiles are static shared memory
}
