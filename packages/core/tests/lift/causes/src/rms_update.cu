// RMSprop-style parameter update over a grid-stride loop: v = b*v + (1-b)*g*g; p -= lr * g / sqrt(v + eps).
// Planted construct: RSQRT (0: 1.0f / sqrtf(v + eps), 1: rsqrtf(v + eps)). The -ftz pair compiles RSQRT=1 twice.
#ifndef RSQRT
#define RSQRT 0
#endif

extern "C" __global__ void __launch_bounds__(256) rms_update(float* __restrict__ p, float* __restrict__ v,
                                                             const float* __restrict__ g, int n, float lr,
                                                             float beta, float eps) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float gi = g[i];
    const float vi = fmaf(beta, v[i], (1.f - beta) * gi * gi);
    v[i] = vi;
#if RSQRT
    const float inv = rsqrtf(vi + eps);
#else
    const float inv = 1.0f / sqrtf(vi + eps);
#endif
    p[i] -= lr * gi * inv;
  }
}
