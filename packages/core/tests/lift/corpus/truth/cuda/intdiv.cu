// Integer division and remainder by a run-time divisor (no floating-point divide in the source).
extern "C" __global__ void __launch_bounds__(256) coords(const int* idx, int* row, int* col, int width, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    int v = idx[i];
    row[i] = v / width;
    col[i] = v % width;
  }
}
