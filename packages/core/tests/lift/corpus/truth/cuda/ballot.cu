// Warp votes and a warp-synchronous compaction in a grid-stride loop: __ballot_sync, __popc, __syncwarp.
extern "C" __global__ void __launch_bounds__(256) compact(const float* x, float* out, int* count, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float v = x[i];
    bool keep = v > 0.f;
    unsigned mask = __ballot_sync(0xffffffffu, keep);
    int lane = threadIdx.x & 31;
    int base = 0;
    if (lane == 0) base = atomicAdd(count, __popc(mask));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (keep) out[base + __popc(mask & ((1u << lane) - 1))] = v;
    __syncwarp();
  }
}
