// softmax numerator: expf (precise unless FAST) over a grid-stride loop.
extern "C" __global__ void __launch_bounds__(256) exp_sum(const float* x, float* out, float m, int n) {
  float acc = 0.f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
#if FAST
    acc += __expf(x[i] - m);
#else
    acc += expf(x[i] - m);
#endif
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
