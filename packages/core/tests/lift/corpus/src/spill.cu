// Planted difference: -maxrregcount=255 (no spills) vs -maxrregcount=32 (forced local-memory spills).
extern "C" __global__ void many_acc(const float* __restrict__ x, float* __restrict__ y, int k) {
  float acc[40];
#pragma unroll
  for (int j = 0; j < 40; ++j) acc[j] = 0.f;
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  for (int s = 0; s < k; ++s) {
    float v = x[t + s * 4096];
#pragma unroll
    for (int j = 0; j < 40; ++j) acc[j] = fmaf(acc[j], v, (float)j);
  }
  float r = 0.f;
#pragma unroll
  for (int j = 0; j < 40; ++j) r += acc[j] * acc[(j * 7) % 40];
  y[t] = r;
}
