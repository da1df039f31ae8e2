// double-precision exp and a multiply-add (FP64 math: no fp32 denormal mode, no fp32 divide).
extern "C" __global__ void __launch_bounds__(128) dexp(const double* x, double* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = exp(x[i]) * 0.5 + x[i];
}
