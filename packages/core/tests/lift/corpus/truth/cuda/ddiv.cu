// double-precision divide and sqrt (IEEE, with their slow-path subroutines).
extern "C" __global__ void __launch_bounds__(128) ddiv(const double* x, const double* y, double* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = sqrt(x[i]) / y[i];
}
