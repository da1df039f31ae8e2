// Planted difference: compiled with -fmad=true (FFMA contraction) vs -fmad=false (FMUL + FADD).
extern "C" __global__ void __launch_bounds__(256) axpby(const float* __restrict__ a, const float* __restrict__ b,
                                                        const float* __restrict__ c, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] * b[i] + c[i] * 3.0f;
}
