// Planted difference: WS=1 splits the block into a producer warpgroup (loads tiles, setmaxnreg.dec) and a
// consumer warpgroup (waits on an mbarrier, computes, setmaxnreg.inc); WS=0 has every warp load and compute.
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
__device__ __forceinline__ void bar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

extern "C" __global__ void __launch_bounds__(256, 1) ws_sum(const float* __restrict__ src, float* __restrict__ out,
                                                            int ktiles) {
  __shared__ alignas(16) float tile[128];
  __shared__ alignas(8) uint64_t full, empty;
  const int t = threadIdx.x;
  if (t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&full)), "r"(128));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(&empty)), "r"(128));
  }
  __syncthreads();
  const float* base = src + (size_t)blockIdx.x * ktiles * 128;
  float acc = 0.f;
#if WS
  const int warpgroup = __shfl_sync(0xffffffff, t / 128, 0);
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    for (int k = 0; k < ktiles; ++k) {
      if (k > 0) bar_wait(smem_u32(&empty), (k - 1) & 1);
      tile[t] = base[k * 128 + t];
      bar_arrive(smem_u32(&full));
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    for (int k = 0; k < ktiles; ++k) {
      bar_wait(smem_u32(&full), k & 1);
      float v = tile[t - 128];
      acc += v * v;
      bar_arrive(smem_u32(&empty));
    }
    out[blockIdx.x * 128 + t - 128] = acc;
  }
#else
  for (int k = 0; k < ktiles; ++k) {
    if (t < 128) tile[t] = base[k * 128 + t];
    __syncthreads();
    float v = tile[t & 127];
    acc += v * v;
    __syncthreads();
  }
  if (t >= 128) out[blockIdx.x * 128 + t - 128] = acc;
#endif
}
