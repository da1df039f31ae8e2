// The stages kernel with every identifier renamed (kernel, parameters, locals): lifting must see no difference.
#include <cstdint>

extern "C" __global__ void __launch_bounds__(128) staged_reduce(const float4* __restrict__ input, float* __restrict__ result,
                                                                int num_tiles) {
  __shared__ alignas(16) float4 ring[STAGES][128];
  const int t = threadIdx.x;
  const float4* origin = input + (size_t)blockIdx.x * num_tiles * 128;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    uint32_t slot = static_cast<uint32_t>(__cvta_generic_to_shared(&ring[s][t]));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(slot), "l"(origin + s * 128 + t) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  float total = 0.f;
  for (int k = 0; k < num_tiles; ++k) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
    __syncthreads();
    float4 v = ring[k % STAGES][(t + 1) & 127];
    total += v.x * v.y + v.z * v.w;
    __syncthreads();
    int upcoming = k + STAGES - 1;
    if (upcoming < num_tiles) {
      uint32_t slot = static_cast<uint32_t>(__cvta_generic_to_shared(&ring[upcoming % STAGES][t]));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(slot), "l"(origin + upcoming * 128 + t) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  result[blockIdx.x * 128 + t] = total;
}
