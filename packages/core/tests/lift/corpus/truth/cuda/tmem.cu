// sm_100a: tensor memory allocated by warp 0 (tcgen05.alloc: a UTCATOMSWS retry with NANOSLEEP), read in a
// loop of run-time length (tcgen05.ld -> LDTM), freed; sm_100 spells uniform branches BRA.U !UP0, target.
#include <cstdint>
extern "C" __global__ void __launch_bounds__(128) tmem_roundtrip(float* out, int n) {
  __shared__ uint32_t slot;
  int warp = threadIdx.x / 32;
  if (warp == 0) asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], 32;" :: "r"((uint32_t)__cvta_generic_to_shared(&slot)));
  __syncthreads();
  uint32_t taddr = slot;
  float acc = 0.f;
  for (int k = 0; k < n; ++k) {
    uint32_t v;
    asm volatile("tcgen05.ld.sync.aligned.32x32b.x1.b32 {%0}, [%1];" : "=r"(v) : "r"(taddr));
    asm volatile("tcgen05.wait::ld.sync.aligned;");
    acc += __uint_as_float(v);
  }
  out[blockIdx.x * 128 + threadIdx.x] = acc;
  __syncthreads();
  if (warp == 0) {
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;");
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, 32;" :: "r"(taddr));
  }
}
