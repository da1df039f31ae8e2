// Bias + leaky ReLU over float4 groups of a grid-stride loop (n4 groups of 4, 16-byte aligned).
// Planted construct: VSTORE, the width of the result stores (0: four 32-bit stores, 1: one float4 store);
// the loads are float4 on both sides.
#ifndef VSTORE
#define VSTORE 0
#endif

__device__ __forceinline__ float leaky(float v) { return v > 0.f ? v : 0.01f * v; }

extern "C" __global__ void __launch_bounds__(256) bias_leaky(const float4* __restrict__ x,
                                                             const float4* __restrict__ bias,
                                                             float* __restrict__ y, int n4, int cols4) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
    const float4 v = x[i];
    const float4 b = bias[i & (cols4 - 1)];
    const float4 r = make_float4(leaky(v.x + b.x), leaky(v.y + b.y), leaky(v.z + b.z), leaky(v.w + b.w));
#if VSTORE
    reinterpret_cast<float4*>(y)[i] = r;
#else
    y[4 * i + 0] = r.x;
    y[4 * i + 1] = r.y;
    y[4 * i + 2] = r.z;
    y[4 * i + 3] = r.w;
#endif
  }
}
