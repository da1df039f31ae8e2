// Planted difference: the unroll factor of the reduction loop (UNROLL = 1 or 4).
extern "C" __global__ void __launch_bounds__(256) strided_sum(const float* __restrict__ x, float* __restrict__ y,
                                                              int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.f;
#if UNROLL == 4
#pragma unroll 4
#else
#pragma unroll 1
#endif
  for (int j = 0; j < k; ++j) acc = fmaf(x[i + j * n], 1.5f, acc);
  y[i] = acc;
}
