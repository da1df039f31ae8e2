// GELU by an odd polynomial in a clamped x, over a grid-stride loop: mul+add chains that -fmad contracts
// (or not) into FFMA. y = x * (0.5 + x * (c1 + x^2 * (c3 + x^2 * c5))) with x clamped to [-3, 3].
extern "C" __global__ void __launch_bounds__(256) poly_gelu(const float* __restrict__ x, float* __restrict__ y,
                                                            int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float v = x[i];
    const float c = fminf(fmaxf(v, -3.f), 3.f);
    const float c2 = c * c;
    const float q = 0.3989422804f + c2 * (-0.0663f + c2 * 0.00425f);
    const float t = 0.5f + c * q;
    y[i] = v * fminf(fmaxf(t, 0.f), 1.f);
  }
}
