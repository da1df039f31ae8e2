// Planted difference: launch geometry recorded in the cubin. MAXT = 128 or 256 max threads per block
// (__launch_bounds__ -> .maxntid) and CLUSTER = 1 or 2 CTAs per cluster (__cluster_dims__ -> .reqnctapercluster).
extern "C" __global__ void __launch_bounds__(MAXT) __cluster_dims__(CLUSTER, 1, 1)
    bias_add(const float* __restrict__ x, const float* __restrict__ b, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + b[i & 127];
}
