// Planted difference: a cp.async multistage pipeline with STAGES = 2 or 4 buffers in flight.
#include <cstdint>

extern "C" __global__ void __launch_bounds__(128) pipelined_sum(const float4* __restrict__ src, float* __restrict__ out,
                                                                int ktiles) {
  __shared__ alignas(16) float4 buf[STAGES][128];
  const int t = threadIdx.x;
  const float4* base = src + (size_t)blockIdx.x * ktiles * 128;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&buf[s][t]));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(base + s * 128 + t) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  float acc = 0.f;
  for (int k = 0; k < ktiles; ++k) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
    __syncthreads();
    float4 v = buf[k % STAGES][(t + 1) & 127];
    acc += v.x * v.y + v.z * v.w;
    __syncthreads();
    int next = k + STAGES - 1;
    if (next < ktiles) {
      uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&buf[next % STAGES][t]));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(base + next * 128 + t) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  out[blockIdx.x * 128 + t] = acc;
}
