// Block-wide sum: warp shuffles, a shared-memory exchange between warps, __syncthreads, one atomic per block;
// the input is read as float4.
extern "C" __global__ void __launch_bounds__(512) block_sum(const float4* x, float* out, int n4) {
  __shared__ float partial[16];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = 0.f;
  if (i < n4) { float4 q = x[i]; v = q.x + q.y + q.z + q.w; }
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < 16 ? partial[threadIdx.x] : 0.f;
    for (int o = 8; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) atomicAdd(out, v);
  }
}
