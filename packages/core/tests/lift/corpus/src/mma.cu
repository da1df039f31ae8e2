// Planted difference: the matrix-multiply instruction. MMA=0: warp-level mma.sync m16n8k16 (HMMA);
// MMA=1: warpgroup wgmma.mma_async m64n8k16 from shared-memory descriptors (HGMMA).
#include <cstdint>

extern "C" __global__ void __launch_bounds__(128) mma_loop(const uint32_t* __restrict__ a, float* __restrict__ c,
                                                           int ksteps) {
  __shared__ alignas(128) uint32_t sa[64 * 8];
  __shared__ alignas(128) uint32_t sb[8 * 8];
  const int t = threadIdx.x;
  for (int i = t; i < 64 * 8; i += 128) sa[i] = a[i];
  if (t < 64) sb[t] = a[512 + t];
  __syncthreads();
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  for (int k = 0; k < ksteps; ++k) {
#if MMA == 1
    uint64_t da = (uint64_t)((static_cast<uint32_t>(__cvta_generic_to_shared(sa)) & 0x3FFFF) >> 4) | (1ull << 62);
    uint64_t db = (uint64_t)((static_cast<uint32_t>(__cvta_generic_to_shared(sb)) & 0x3FFFF) >> 4) | (1ull << 62);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(da + k), "l"(db + k));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#else
    uint32_t a0 = sa[(t + k) & 511], a1 = sa[(t + k + 128) & 511], a2 = sa[(t + k + 256) & 511],
             a3 = sa[(t + k + 384) & 511];
    uint32_t b0 = sb[(t + k) & 63], b1 = sb[(t + k + 32) & 63];
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
  }
  float* o = c + (blockIdx.x * 128 + t) * 4;
  o[0] = d0; o[1] = d1; o[2] = d2; o[3] = d3;
}
