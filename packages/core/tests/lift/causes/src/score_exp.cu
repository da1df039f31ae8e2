// Attention-score exponentials over a grid-stride loop: p = exp(s * scale - rowmax[row]), rows of `cols`
// scores (cols a power of two, given as its log2). No division: -use_fast_math changes only exp and flushing.
extern "C" __global__ void __launch_bounds__(256) score_exp(const float* __restrict__ s,
                                                            const float* __restrict__ rowmax,
                                                            float* __restrict__ p, int n, int log2_cols,
                                                            float scale) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = expf(s[i] * scale - rowmax[i >> log2_cols]);
  }
}
