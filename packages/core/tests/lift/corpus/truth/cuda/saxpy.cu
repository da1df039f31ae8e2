// a*x + y with an explicit unroll (UNROLL) of a run-time trip count loop.
#define PRAGMA(x) _Pragma(#x)
#define UNROLL_BY(n) PRAGMA(unroll n)
extern "C" __global__ void __launch_bounds__(256) saxpy(float a, const float* x, float* y, int n) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  int stride = gridDim.x * blockDim.x;
  UNROLL_BY(UNROLL)
  for (int i = t; i < n; i += stride) y[i] = a * x[i] + y[i];
}
