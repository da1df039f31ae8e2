// Row log-sum-exp, one warp per row: expf and logf (precise, or the intrinsics with -DFAST=1).
#if FAST
#define EXP __expf
#define LOG __logf
#else
#define EXP expf
#define LOG logf
#endif
extern "C" __global__ void __launch_bounds__(128) lse(const float* x, float* out, int cols) {
  const float* row = x + (blockIdx.x * 4 + (threadIdx.x >> 5)) * cols;
  int lane = threadIdx.x & 31;
  float m = -INFINITY;
  for (int j = lane; j < cols; j += 32) m = fmaxf(m, row[j]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0.f;
  for (int j = lane; j < cols; j += 32) s += EXP(row[j] - m);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) out[blockIdx.x * 4 + (threadIdx.x >> 5)] = m + LOG(s);
}
