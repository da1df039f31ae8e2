// one warp per row: max and sum by shuffles, expf and a divide by the sum (FAST: __expf, __fdividef).
extern "C" __global__ void __launch_bounds__(128) softmax_rows(const float* x, float* y, int cols) {
  const float* row = x + (size_t)(blockIdx.x * 4 + threadIdx.x / 32) * cols;
  float* out = y + (size_t)(blockIdx.x * 4 + threadIdx.x / 32) * cols;
  int lane = threadIdx.x & 31;
  float m = -1e30f;
  for (int c = lane; c < cols; c += 32) m = fmaxf(m, row[c]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0.f;
  for (int c = lane; c < cols; c += 32) {
#if FAST
    s += __expf(row[c] - m);
#else
    s += expf(row[c] - m);
#endif
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  for (int c = lane; c < cols; c += 32) {
#if FAST
    out[c] = __fdividef(__expf(row[c] - m), s);
#else
    out[c] = expf(row[c] - m) / s;
#endif
  }
}
