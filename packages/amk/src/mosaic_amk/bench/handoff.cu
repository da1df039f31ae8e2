// Grid-wide stage hand-off protocols, measured alone (handoff.py, scripts/device/amk_handoff.py).
//
// Every kernel runs the same chain of `stages` dependent stages on every block of a cooperative grid (one block per
// SM): stage s reads the whole vector x_s (n floats, written by every block in stage s - 1), sums it (one block
// reduction), and writes its slice of x_{s+1}: x_{s+1}[i] = sum / n + 1. With x_0 = 1 everywhere every value is an
// exact integer (x_s = s + 1, sums below 2^24), so a stale or torn read shows up in the last sum the host checks.
// That is a decode layer's stage skeleton: an all-to-all hand-off of an activation vector between row-split stages.
// What differs is only how a block learns that x_s is complete:
//
//   handoff_counter  the VM's protocol (vm.cu): after the block's stores and a block barrier, thread 0 adds 1 to
//                    the stage's counter with red.release.gpu (a MEMBAR.GPU, then the add); the consumer's thread 0
//                    polls with ld.relaxed.gpu until the count reaches launch * blocks, then fence.acquire.gpu, then a
//                    block barrier, then every thread reads x_s.
//   handoff_ll       flag in the data (NCCL's LL protocol): each value is stored as one 64-bit word {float bits,
//                    tag} with st.relaxed.gpu.u64; a consumer thread spins on each word it needs with
//                    ld.relaxed.gpu.u64 until the word's tag is this launch's. A 64-bit naturally aligned strong
//                    access is single-copy atomic (PTX ISA memory consistency model), so the value read is the one
//                    written with the tag: no fence, no atomic, no counter, no barrier before the reads.
//   handoff_gridsync cooperative_groups grid.sync() between stages (reference: the CUDA grid barrier).
//
// A wait that takes longer than timeout_ns sets err[0] and abandons the launch (the host reports it).
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#ifndef HO_THREADS
#define HO_THREADS 512
#endif

__device__ __forceinline__ unsigned long long ho_time() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ int ho_ld_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ho_ld_relaxed64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void ho_st_relaxed64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

// the block's sum of every thread's v (two barriers; the same in every protocol)
__device__ __forceinline__ float ho_block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < HO_THREADS / 32; ++w) s += red[w];
  __syncthreads();
  return s;
}

// rows [lo, hi) of the next vector that this block writes
__device__ __forceinline__ void ho_slice(int n, int& lo, int& hi) {
  lo = (int)((long long)n * blockIdx.x / gridDim.x);
  hi = (int)((long long)n * (blockIdx.x + 1) / gridDim.x);
}

extern "C" __global__ void __launch_bounds__(HO_THREADS, 1)
handoff_counter(float* x, int* counters, int n, int stages, int launch, float* out, int* err, long long timeout_ns) {
  __shared__ float red[HO_THREADS / 32];
  __shared__ int ok;
  int lo, hi;
  ho_slice(n, lo, hi);
  float sum = 0.f;
  for (int s = 0; s < stages; ++s) {
    if (s > 0) {
      if (threadIdx.x == 0) {
        const int want = launch * (int)gridDim.x;
        const unsigned long long t0 = ho_time();
        int good = 1;
        while (ho_ld_relaxed(counters + s - 1) < want) {
          if ((long long)(ho_time() - t0) > timeout_ns) { atomicExch(err, 1); good = 0; break; }
        }
        asm volatile("fence.acquire.gpu;" ::: "memory");
        ok = good;
      }
      __syncthreads();
      if (!ok) return;
    }
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += HO_THREADS) v += x[(size_t)s * n + i];
    sum = ho_block_sum(v, red);
    const float y = sum / (float)n + 1.f;
    for (int i = lo + threadIdx.x; i < hi; i += HO_THREADS) x[(size_t)(s + 1) * n + i] = y;
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" :: "l"(counters + s) : "memory");
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sum;
}

extern "C" __global__ void __launch_bounds__(HO_THREADS, 1)
handoff_ll(unsigned long long* x, int n, int stages, unsigned tag, float* out, int* err, long long timeout_ns) {
  __shared__ float red[HO_THREADS / 32];
  int lo, hi;
  ho_slice(n, lo, hi);
  float sum = 0.f;
  const unsigned long long t0 = ho_time();
  for (int s = 0; s < stages; ++s) {
    float v = 0.f;
    int good = 1;
    // one word at a time: the next word's load waits for this one's tag (issuing every word's load first and then
    // re-polling was slower, session6/run3: 1.30 vs 1.09 us per stage at n = 576, 2.33 vs 1.46 at 2048)
    for (int i = threadIdx.x; i < n; i += HO_THREADS) {
      unsigned long long w = ho_ld_relaxed64(x + (size_t)s * n + i);
      while ((unsigned)(w >> 32) != tag) {
        if ((long long)(ho_time() - t0) > timeout_ns) { atomicExch(err, 1); good = 0; break; }
        w = ho_ld_relaxed64(x + (size_t)s * n + i);
      }
      v += __uint_as_float((unsigned)w);
    }
    if (!__syncthreads_and(good)) return;
    sum = ho_block_sum(v, red);
    const unsigned long long y = ((unsigned long long)tag << 32) | __float_as_uint(sum / (float)n + 1.f);
    for (int i = lo + threadIdx.x; i < hi; i += HO_THREADS) ho_st_relaxed64(x + (size_t)(s + 1) * n + i, y);
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sum;
}

extern "C" __global__ void __launch_bounds__(HO_THREADS, 1)
handoff_gridsync(float* x, int n, int stages, float* out) {
  __shared__ float red[HO_THREADS / 32];
  cg::grid_group grid = cg::this_grid();
  int lo, hi;
  ho_slice(n, lo, hi);
  float sum = 0.f;
  for (int s = 0; s < stages; ++s) {
    if (s > 0) grid.sync();
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += HO_THREADS) v += x[(size_t)s * n + i];
    sum = ho_block_sum(v, red);
    const float y = sum / (float)n + 1.f;
    for (int i = lo + threadIdx.x; i < hi; i += HO_THREADS) x[(size_t)(s + 1) * n + i] = y;
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sum;
}
