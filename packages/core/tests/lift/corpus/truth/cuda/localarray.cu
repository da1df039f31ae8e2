// a per-thread array indexed at run time lives in local memory (a stack frame).
extern "C" __global__ void __launch_bounds__(128) local_gather(const int* idx, const float* x, float* out, int n) {
  float buf[32];
  int t = blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
  for (int k = 0; k < 32; ++k) buf[k] = x[t * 32 + k];
  float acc = 0.f;
  for (int k = 0; k < n; ++k) acc += buf[idx[k] & 31];
  out[t] = acc;
}
