// warp-level tensor cores (wmma -> mma.sync), a k-loop of run-time length.
#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void __launch_bounds__(32) wmma_gemm(const half* a, const half* b, float* c, int k_tiles) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.f);
#pragma unroll 1
  for (int k = 0; k < k_tiles; ++k) {
    wmma::load_matrix_sync(fa, a + k * 16, 16 * k_tiles);
    wmma::load_matrix_sync(fb, b + k * 16, 16 * k_tiles);
    wmma::mma_sync(fc, fa, fb, fc);
  }
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
