// Planted difference: 32-bit scalar loads/stores (VEC=1) vs 128-bit float4 loads/stores (VEC=4).
extern "C" __global__ void __launch_bounds__(256) scale4(const float* __restrict__ x, float* __restrict__ y, int n4) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += 1 << 20) {
#if VEC == 4
    float4 v = reinterpret_cast<const float4*>(x)[i];
    v.x *= 2.f; v.y *= 2.f; v.z *= 2.f; v.w *= 2.f;
    reinterpret_cast<float4*>(y)[i] = v;
#else
#pragma unroll
    for (int e = 0; e < 4; ++e) y[4 * i + e] = x[4 * i + e] * 2.f;
#endif
  }
}
