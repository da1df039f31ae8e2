// Planted difference: how a tile reaches shared memory. XFER=0: every thread issues a 16-byte cp.async
// (LDGSTS) and signals an mbarrier; XFER=1: one thread issues a TMA tensor load (UTMALDG) that
// completes the same mbarrier by transaction count. Everything else (tile loop, mbarrier wait, math)
// is the same.
#include <cuda.h>
#include <cstdint>

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

extern "C" __global__ void __launch_bounds__(128) tile_sum(const __grid_constant__ CUtensorMap tmap,
                                                           const float* __restrict__ src, float* __restrict__ out,
                                                           int tiles) {
  __shared__ alignas(128) float tile[128 * 4];
  __shared__ alignas(8) uint64_t bar;
  const int t = threadIdx.x;
  const uint32_t bar_a = smem_u32(&bar);
  if (t == 0) {
#if XFER == 1
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_a));
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar_a), "r"(128));
#endif
    asm volatile("fence.proxy.async.shared::cta;");
  }
  __syncthreads();
  float acc = 0.f;
  for (int k = 0; k < tiles; ++k) {
#if XFER == 1
    if (t == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_a), "r"(128 * 4 * 4) : "memory");
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
          ::"r"(smem_u32(tile)), "l"(&tmap), "r"(0), "r"(k * 4), "r"(bar_a) : "memory");
    }
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(tile + 4 * t)),
                 "l"(src + (size_t)k * 512 + 4 * t) : "memory");
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar_a) : "memory");
#endif
    bar_wait(bar_a, k & 1);
    acc += tile[t] + tile[t + 128] + tile[t + 256] + tile[t + 384];
    __syncthreads();
  }
  out[blockIdx.x * 128 + t] = acc;
}
