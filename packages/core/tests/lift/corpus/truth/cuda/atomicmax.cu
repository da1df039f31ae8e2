// float atomic max by a compare-and-swap retry loop.
extern "C" __global__ void __launch_bounds__(128) atomic_max(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  int* addr = reinterpret_cast<int*>(out);
  int old = *addr;
  while (__int_as_float(old) < v) {
    int prev = atomicCAS(addr, old, __float_as_int(v));
    if (prev == old) break;
    old = prev;
  }
}
