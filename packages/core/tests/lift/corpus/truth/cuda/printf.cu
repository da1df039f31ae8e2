// A device printf: a call to the external vprintf.
#include <cstdio>
extern "C" __global__ void __launch_bounds__(64) hello(const int* x) {
  if (threadIdx.x == 0) printf("block %d sees %d\n", blockIdx.x, x[blockIdx.x]);
}
