// IEEE divide in a block-stride loop: ptxas emits the slow path as a called subroutine.
extern "C" __global__ void __launch_bounds__(256) divide(const float* x, const float* y, float* out, int n) {
  float acc = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) acc += x[j] / y[j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
