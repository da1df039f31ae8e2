// SiLU over a grid-stride loop: y = x / (1 + exp(-x)). Planted construct: DIV (0 '/', 1 __fdividef).
#ifndef DIV
#define DIV 0
#endif

extern "C" __global__ void __launch_bounds__(256) silu(const float* __restrict__ x, float* __restrict__ y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float v = x[i];
    const float d = 1.f + expf(-v);
#if DIV
    y[i] = __fdividef(v, d);
#else
    y[i] = v / d;
#endif
  }
}
