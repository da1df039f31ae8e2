// The AMK persistent megakernel VM: one cooperative block per SM, each walking its queue of tasks.
//
//   zero the counters, grid sync ->
//   for each decode step s of this launch (n_steps, positions position .. position + n_steps - 1):
//     for each task of this block's queue:
//       prefetch the weight tiles of the next tasks into L2 (cp.async.bulk.prefetch; prefetch_depth ahead)
//       and the NEXT task's 256-byte record into the other shared-memory slot (double-buffered)
//       wait: acquire-load every (counter, threshold + s * producers[counter]) until it holds; the watchdog
//             aborts the whole grid (sticky flag + per-block dump) when a wait exceeds timeout_ns or another
//             block aborted
//       dispatch to the micro-kernel of the op (kernels/*.cuh)
//       signal: block barrier, then ONE release add (red.release.gpu) on the task's counter
//     grid sync (every step's writes, the KV appends and the token, precede the next step's reads)
//   grid sync at exit.
// Counters are never reset between the steps of a launch: step s waits for thresholds raised by s times the
// counter's producer count, which is exactly "this step's count >= threshold" because the grid sync ends
// step s - 1 with every counter at s * producers. One step per launch is the schedule's semantics; a
// launch of n steps is n launches without the launch overhead (the grid sync stands in for the kernel
// boundary). An aborted launch still reaches the exit sync (no trap), so the context stays usable.
//
// sync_flags (launch argument; encode.SYNC_* / launcher.sync_flags; docs/amk-cuda.md "Synchronisation variants"):
//   bit 0 WAIT_RELAXED: poll with ld.relaxed.gpu, one fence.acquire.gpu after every wait of the task holds
//         (one CCTL.IVALL per task instead of one per poll); 0: ld.acquire.gpu on every poll (v0)
//   bits 1-2 SIGNAL: 0 inline (v0 loop: 3 block barriers per task, thread 0 signals after the last);
//         1 merged (2 barriers per task: thread 0 signals the previous task, then waits for this one);
//         2 side (2 barriers; lane 0 of warp 1 signals the previous task while warp 0 already waits)
//   bit 3 PREFETCH_SIDE: warp 1 issues the L2 prefetches while thread 0 waits (the current task's regions
//         from its shared record); 0: every thread, before the head barrier (v0)
//
// Trace (build define AMK_TRACE=1, launch argument trace != 0; bench/trace.py reads it): thread 0 of each block stores
// three %globaltimer stamps per queue entry q: trace[3q] at the top of the task's iteration (before the preload and
// the wait), trace[3q + 1] when its waits hold, trace[3q + 2] after the tail barrier (every output stored; the
// signal follows). Each step overwrites them: after a launch they are the last step's.
#include <cooperative_groups.h>
// the micro-kernels, one family per header (kernels/common.cuh: the shared context and helpers)
#include "kernels/common.cuh"
#include "kernels/gemv_rows.cuh"
#include "kernels/gemv_quant.cuh"
#include "kernels/embed.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/gemv.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/rope.cuh"
#include "kernels/attention.cuh"
#include "kernels/argmax.cuh"
#ifndef AMK_TRACE
#define AMK_TRACE 0
#endif

namespace cg = cooperative_groups;

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acquire_gpu() {
  // PTX 8.6+: an acquire fence (SASS: CCTL.IVALL only, no MEMBAR); with the strong reads before it in program
  // order it forms an acquire pattern on each location read (PTX ISA, memory consistency model)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // sm_80: ptxas 13.0 accepts fence.acquire for sm_80 but emits an instruction nvdisasm rejects as illegal for
  // sm_80 (the acquire-only fence is an sm_90 encoding); the acq_rel fence (sm_70+) is the stronger, valid form
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
#else
  asm volatile("fence.acquire.gpu;" ::: "memory");
#endif
}
__device__ __forceinline__ int ld_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(bytes) : "memory");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // sm_80/sm_86 have no bulk prefetch (cp.async.bulk is sm_90+): one prefetch.global.L2 per 128-byte line of the
  // region instead (CCTL in SASS), the same hint at line granularity
  const char* q = (const char*)p;
  for (unsigned o = 0; o < bytes; o += 128u) asm volatile("prefetch.global.L2 [%0];" :: "l"(q + o) : "memory");
#endif
}

#define PF_CHUNK 16384u
#define SYNC_WAIT_RELAXED 1
#define SYNC_SIGNAL_SHIFT 1
#define SYNC_SIGNAL_MASK 3
#define SIGNAL_INLINE 0
#define SIGNAL_MERGED 1
#define SIGNAL_SIDE 2
#define SYNC_PREFETCH_SIDE 8
#define SIDE_WARP (AMK_WARPS > 1 ? 1 : 0)

// issue the L2 prefetches of one task's weight regions (a whole block shares the work)
__device__ void prefetch_task(const Ctx& c, const int* tg) {
  for (int r = 0; r < AMK_MAX_PF; ++r) {
    const int b = __ldg(tg + W_PF + 3 * r);
    if (b < 0) continue;
    const unsigned long long off = (unsigned long long)__ldg(tg + W_PF + 3 * r + 1) * 16ull;
    const unsigned long long size = (unsigned long long)__ldg(tg + W_PF + 3 * r + 2) * 16ull;
    const char* base = (const char*)c.bptr[b] + off;
    const unsigned long long chunks = (size + PF_CHUNK - 1) / PF_CHUNK;
    for (unsigned long long k = threadIdx.x; k < chunks; k += AMK_THREADS) {
      const unsigned long long lo = k * PF_CHUNK;
      const unsigned long long n = size - lo < PF_CHUNK ? size - lo : PF_CHUNK;
      prefetch_l2(base + lo, (unsigned)n);
    }
  }
}

// the same regions, issued by the lanes of ONE warp from a record in shared or global memory (generic loads:
// the task table is immutable during the launch)
__device__ void prefetch_task_warp(const Ctx& c, const int* rec, int lane) {
  for (int r = 0; r < AMK_MAX_PF; ++r) {
    const int b = rec[W_PF + 3 * r];
    if (b < 0) continue;
    const unsigned long long off = (unsigned long long)rec[W_PF + 3 * r + 1] * 16ull;
    const unsigned long long size = (unsigned long long)rec[W_PF + 3 * r + 2] * 16ull;
    const char* base = (const char*)c.bptr[b] + off;
    const unsigned long long chunks = (size + PF_CHUNK - 1) / PF_CHUNK;
    for (unsigned long long k = lane; k < chunks; k += 32) {
      const unsigned long long lo = k * PF_CHUNK;
      const unsigned long long n = size - lo < PF_CHUNK ? size - lo : PF_CHUNK;
      prefetch_l2(base + lo, (unsigned)n);
    }
  }
}

__device__ void dump(int* control, int state, int task, int counter, int value, int threshold, int qpos,
                     unsigned long long t0) {
  int* d = control + AMK_CTRL_HEAD + blockIdx.x * AMK_DUMP_WORDS;
  d[0] = state; d[1] = task; d[2] = counter; d[3] = value; d[4] = threshold; d[5] = qpos;
  d[6] = (int)smid();
  d[7] = (int)((globaltimer() - t0) / 1000ull);
}

// thread 0 only. Returns false when the launch is aborted (by this block's watchdog or another's).
// relaxed: every poll is ld.relaxed.gpu and ONE fence.acquire.gpu follows the last successful poll (a strong
// read of each counter followed in program order by an acquire fence: an acquire pattern on each counter);
// otherwise every poll is ld.acquire.gpu (each one an acquire operation, each one a CCTL.IVALL in SASS).
__device__ bool wait_all(const int* t, const int* counters, const int* producers, int step, int* control,
                         long long timeout_ns, int qpos, unsigned long long t_launch, bool relaxed = false) {
  const int n = t[W_NWAIT];
  for (int i = 0; i < n; ++i) {
    const int cnt = t[W_WAIT + 2 * i];
    const int thr = t[W_WAIT + 2 * i + 1] + (step ? step * producers[cnt] : 0);
    int v = relaxed ? ld_relaxed(counters + cnt) : ld_acquire(counters + cnt);
    if (v >= thr) continue;
    const unsigned long long t0 = globaltimer();
    for (unsigned spins = 1;; ++spins) {
      v = relaxed ? ld_relaxed(counters + cnt) : ld_acquire(counters + cnt);
      if (v >= thr) break;
      if ((spins & 63u) == 0) {
        if (ld_relaxed(control + C_ABORT)) {
          dump(control, S_PEER_ABORT, t[W_ID], cnt, v, thr, qpos, t_launch);
          atomicAdd(control + C_ABORTED, 1);
          return false;
        }
        if ((long long)(globaltimer() - t0) > timeout_ns) {
          atomicExch(control + C_ABORT, 1);
          __threadfence();
          dump(control, S_TIMEOUT, t[W_ID], cnt, v, thr, qpos, t_launch);
          atomicAdd(control + C_ABORTED, 1);
          return false;
        }
      }
    }
  }
  if (relaxed) fence_acquire_gpu();
  return true;
}

__device__ void dispatch(const Ctx& c, const int* t, int op) {
  switch (op) {
    case OP_EMBED: mk_embed(c, t); break;
    case OP_RMSNORM: mk_rmsnorm(c, t); break;
    case OP_GEMV: case OP_RMSNORM_GEMV: mk_gemv(c, t, op == OP_RMSNORM_GEMV); break;
    case OP_GEMV_SILU_MUL: case OP_RMSNORM_GEMV_SILU_MUL: mk_gemv_silu_mul(c, t, op == OP_RMSNORM_GEMV_SILU_MUL); break;
    case OP_SILU_MUL: mk_silu_mul(c, t); break;
    case OP_ADD: mk_add(c, t); break;
    case OP_ROPE: mk_rope(c, t); break;
    case OP_KV_APPEND: mk_kv_append(c, t); break;
    case OP_ROPE_APPEND: mk_rope_append(c, t); break;
    case OP_ATTENTION: mk_attention(c, t); break;
    case OP_ARGMAX: case OP_ARGMAX_PARTIAL: case OP_ARGMAX_COMBINE: mk_argmax(c, t, op); break;
    case OP_GEMV_ROPE: case OP_GEMV_ROPE_APPEND: mk_gemv_rope(c, t, op == OP_GEMV_ROPE_APPEND); break;
    default: break;  // the encoder never emits another code
  }
}

__device__ __forceinline__ void signal_release(int* p) {
  // after the block barrier: a release add at gpu scope (CUTLASS's generic barrier pattern); every thread's
  // stores, ordered before it by bar.sync, are visible to a reader that acquire-loads the new value
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" :: "l"(p) : "memory");
}

extern "C" __global__ void __launch_bounds__(AMK_THREADS, 1)
amk_vm(const int* __restrict__ tasks, const int* __restrict__ qoff, const int* __restrict__ queue,
       const unsigned long long* __restrict__ bptr, const int* __restrict__ bmeta_,
       int* counters, const int* __restrict__ producers, int num_counters, int* control,
       unsigned long long token_in, unsigned long long token_out, int token_buf, int next_buf,
       const float* __restrict__ rope_table, int rope_positions,
       int position, int mode, long long timeout_ns, int prefetch_depth, int skip_ops, int smem_bytes,
       int n_steps, int token_stride, int sync_flags, int table_buffers, unsigned long long* trace) {
  extern __shared__ __align__(16) float dyn_smem[];
  __shared__ int task_s[2][AMK_TASK_WORDS];
  __shared__ float red[64];
  __shared__ int ired[32];
  __shared__ int go;
#if AMK_WSTREAM > 0
  __shared__ WsState ws_state[AMK_WARPS];
  __shared__ __align__(8) unsigned long long ws_bars[AMK_WARPS * AMK_WSTREAM];
#endif
  cg::grid_group grid = cg::this_grid();
  const unsigned long long t_launch = globaltimer();

  for (int i = blockIdx.x * AMK_THREADS + threadIdx.x; i < num_counters; i += gridDim.x * AMK_THREADS) counters[i] = 0;
  const bool aborted_before = ld_relaxed(control + C_ABORT) != 0;  // sticky abort of an earlier launch
  if (threadIdx.x == 0 && !aborted_before) dump(control, S_RUNNING, -1, -1, 0, 0, -1, t_launch);
  __threadfence();
  grid.sync();

  Ctx c;
  c.bptr = bptr; c.bmeta = bmeta_; c.token_buf = token_buf; c.next_buf = next_buf; c.mode = mode;
  c.smem_floats = smem_bytes / 4; c.rope_table = rope_table; c.rope_positions = rope_positions; c.control = control;
  c.smem = dyn_smem; c.red = red; c.ired = ired;
  // table_buffers > 0: the buffer table (pointers, metadata) and the counters' producer counts are copied into
  // shared memory after the general area and the ring (the launcher asked for the room), so buf() / bmeta() and the
  // multi-step thresholds are shared-memory reads: the fence.acquire of every wait invalidates L1, and these global
  // reads would otherwise cost every micro-kernel an L2 round trip before its first real load. They are immutable
  // during a launch.
  __shared__ const int* prod_s;  // the producer counts (global, or their shared copy): read by thread 0 per wait
  if (threadIdx.x == 0) prod_s = producers;
  if (table_buffers > 0) {
    unsigned long long* sp = (unsigned long long*)((char*)dyn_smem + smem_bytes + AMK_WARPS * AMK_WSTREAM * WS_PIECE);
    int* sm = (int*)(sp + table_buffers);
    int* spr = sm + table_buffers * AMK_BUF_META;
    for (int i = threadIdx.x; i < table_buffers; i += AMK_THREADS) sp[i] = bptr[i];
    for (int i = threadIdx.x; i < table_buffers * AMK_BUF_META; i += AMK_THREADS) sm[i] = bmeta_[i];
    for (int i = threadIdx.x; i < num_counters; i += AMK_THREADS) spr[i] = producers[i];
    if (threadIdx.x == 0) prod_s = spr;
    c.bptr = sp; c.bmeta = sm;
  }
  __syncthreads();
#if AMK_WSTREAM > 0
  // the ring follows the general area (smem_bytes); the launcher asked for smem_bytes + the ring's bytes
  c.ws = ws_state; c.bars = smem_addr(ws_bars); c.ring = smem_addr(dyn_smem) + (unsigned)smem_bytes;
  ws_init(c);
  __syncthreads();
#endif

  const int q0 = qoff[blockIdx.x], q1 = qoff[blockIdx.x + 1], qn = q1 - q0;
  bool ok = !aborted_before;
  int last = -1;
  if (n_steps < 1) n_steps = 1;
  const bool relaxed = (sync_flags & SYNC_WAIT_RELAXED) != 0;
  const int signal_mode = (sync_flags >> SYNC_SIGNAL_SHIFT) & SYNC_SIGNAL_MASK;
  const bool pf_side = (sync_flags & SYNC_PREFETCH_SIDE) != 0;
  const bool v0 = signal_mode == SIGNAL_INLINE;
  const int signaller = signal_mode == SIGNAL_SIDE ? SIDE_WARP * 32 : 0;  // the thread that sends the signals
  // One loop for every variant (one inlined copy of the micro-kernels: two copies cost 128 registers + spills).
  // v0 (signal inline): head barrier, wait, barrier, dispatch, tail barrier, thread 0 signals: 3 barriers.
  // v1 (signal merged / side): no head barrier; the signal of task q - 1 (pending, held by the signalling
  // thread, set after the tail barrier B2 of q - 1) is sent at the top of iteration q: by thread 0 right before
  // its wait (merged) or by the side warp's lane 0 while thread 0 already waits (side); always before the
  // barrier B1 of q, so an aborted wait still leaves every finished task signalled. 2 barriers per task.
  for (int step = 0; ok && step < n_steps; ++step) {
    c.position = position + step;
    c.token_in = token_in + (unsigned long long)step * (unsigned long long)token_stride;
    c.token_out = token_out + (unsigned long long)step * (unsigned long long)token_stride;
    int prefetched = q0;  // queue entries [q0, prefetched) have had their weights prefetched this step
    int pending = -1;     // v1: counter of the finished task not yet signalled (the signalling thread's copy)
    if (qn > 0 && threadIdx.x < AMK_TASK_WORDS)
      task_s[0][threadIdx.x] = __ldg(tasks + (size_t)queue[q0] * AMK_TASK_WORDS + threadIdx.x);
    // B0: record of q0 in task_s[0] (v0 without the preload, the stream and the KV staging, which read it before
    // the head barrier: the head barrier orders it)
    if (!v0 || AMK_WEIGHT_PRELOAD > 0 || AMK_WSTREAM > 0 || AMK_ATT_STAGE) __syncthreads();
    for (int q = q0; q < q1; ++q) {
      const int slot = (q - q0) & 1;
      const int* ts = task_s[slot];
#if AMK_TRACE
      if (threadIdx.x == 0 && trace) trace[3 * q] = globaltimer();  // stored at once: no register held
#endif
#if AMK_ATT_STAGE
      att_stage(c, ts, !((skip_ops >> ts[W_OP]) & 1));  // an attention task's earlier K / V rows, before the wait
#endif
#if AMK_WEIGHT_PRELOAD > 0
      // the GEMV's first weight chunks, before anything that stalls (the pending signal's membar, the L2 prefetch
      // descriptors, the wait): the record is readable here (stored before B1 of task q - 1, or before B0)
      preload_weights(c, ts, !((skip_ops >> ts[W_OP]) & 1));
#elif AMK_WSTREAM > 0
      // the same place for the weight stream: each warp's first pieces of this task in flight before the wait
      ws_begin(c, ts, !((skip_ops >> ts[W_OP]) & 1));
#endif
      if (pending >= 0) { signal_release(counters + pending); pending = -1; }  // v1, the signalling thread
      if (prefetch_depth > 0 && !pf_side) {
        const int upto = min(q1, q + prefetch_depth);
        for (; prefetched < upto; ++prefetched) prefetch_task(c, tasks + (size_t)queue[prefetched] * AMK_TASK_WORDS);
      }
      if (v0) __syncthreads();  // this task's record is in task_s[slot]; the previous task is done with the other slot
      // the next record loads while this task waits and runs (threads of the last warps: thread 0 waits); the
      // other slot was last read by task q - 1 before its tail barrier
      if (q + 1 < q1 && threadIdx.x >= AMK_THREADS - AMK_TASK_WORDS)
        task_s[slot ^ 1][threadIdx.x - (AMK_THREADS - AMK_TASK_WORDS)] =
            __ldg(tasks + (size_t)queue[q + 1] * AMK_TASK_WORDS + threadIdx.x - (AMK_THREADS - AMK_TASK_WORDS));
      int mine = 1;
      if (threadIdx.x == 0) {
        mine = wait_all(ts, counters, prod_s, step, control, timeout_ns, q - q0, t_launch, relaxed) ? 1 : 0;
#if AMK_TRACE
        if (trace) trace[3 * q + 1] = globaltimer();
#endif
        if (v0) go = mine;
      }
      if (prefetch_depth > 0 && pf_side && (int)(threadIdx.x >> 5) == SIDE_WARP) {
        // the side warp, while thread 0 waits: the current task's regions from its shared record
        const int upto = min(q1, q + prefetch_depth);
        for (; prefetched < upto; ++prefetched)
          prefetch_task_warp(c, prefetched == q ? ts : tasks + (size_t)queue[prefetched] * AMK_TASK_WORDS, threadIdx.x & 31);
      }
      if (v0) {
        __syncthreads();
        mine = go;
      } else {
        mine = __syncthreads_and(mine);  // B1: every wait held (0: the launch aborted)
      }
      if (!mine) { ok = false; break; }
      const int op = ts[W_OP];
      if (!((skip_ops >> op) & 1)) dispatch(c, ts, op);
      const int sig = ts[W_SIGNAL];
      last = ts[W_ID];
      __syncthreads();  // B2: every thread's output stores precede the signal (v1: nobody reads task_s[slot] again)
#if AMK_TRACE
      if (threadIdx.x == 0 && trace) trace[3 * q + 2] = globaltimer();
#endif
      if (threadIdx.x == signaller) {
        if (v0) signal_release(counters + sig);
        else pending = sig;
      }
    }
    if (pending >= 0) signal_release(counters + pending);  // v1: the step's last task
    if (step + 1 < n_steps) {
      __threadfence();
      grid.sync();  // step boundary: stands in for the kernel boundary between two one-step launches
      if (ld_relaxed(control + C_ABORT)) ok = false;  // every block sees the same flag after the sync
    }
  }
#if AMK_WSTREAM > 0
  ws_drain(c);  // an aborted task's pieces: no bulk copy outlives the launch
#endif
#if AMK_ATT_STAGE
  cp_async_wait_all();  // an aborted attention task's staged rows: no copy outlives the launch
#endif
  if (threadIdx.x == 0) {
    if (aborted_before) {
      // leave the dump of the launch that aborted untouched
    } else if (ok) {
      dump(control, S_DONE, last, -1, 0, 0, qn, t_launch);
    }
  }
  __threadfence();
  grid.sync();
}
