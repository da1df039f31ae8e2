// Planted difference: PERSISTENT=1 loops over output tiles with a grid stride (tile += gridDim.x);
// PERSISTENT=0 computes the one tile blockIdx.x names.
extern "C" __global__ void __launch_bounds__(128) tile_dot(const float* __restrict__ a, float* __restrict__ out,
                                                           int tiles, int k) {
#if PERSISTENT
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
#else
  {
    const int tile = blockIdx.x;
    if (tile >= tiles) return;
#endif
    const float* row = a + (size_t)tile * k * 128;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc = fmaf(row[j * 128 + threadIdx.x], 0.25f, acc);
    out[tile * 128 + threadIdx.x] = acc;
  }
}
