// Planted difference: precise expf (FAST=0) vs the approximate intrinsic __expf (FAST=1).
#if FAST
#define EXP __expf
#else
#define EXP expf
#endif
extern "C" __global__ void __launch_bounds__(256) softplus_like(const float* __restrict__ x, float* __restrict__ y,
                                                                int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = EXP(x[i]) * 0.5f + 1.0f;
}
