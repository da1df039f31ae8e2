// 1/sqrtf: IEEE sqrt and IEEE reciprocal, each with a slow-path subroutine (rmsnorm's tail).
extern "C" __global__ void __launch_bounds__(128) rsqrt_scale(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 1.0f / sqrtf(x[i]);
}
