// Mosaicist CUTLASS 4.x GEMM for Blackwell (sm_100a), generated from knobs; see mosaic_target_cutlass/blackwell.py.
// D[M,N] = alpha * A[M,K] . B[K,N], all row-major; A, B in {{ELEMENT}}, fp32 accumulate (in tensor memory), D in
// {{ELEMENT}}. The mainloop is the Sm100 collective builder's UMMA mainloop (tcgen05.mma from shared memory into
// TMEM, TMA loads, multicast across the cluster); {{SM_COUNT}}SM: one CTA or a CTA pair issues each MMA
// (KernelTmaWarpSpecialized{{SM_COUNT}}SmSm100 with the matching TmaWarpSpecialized{{SM_COUNT}}Sm epilogue).
// TILE_* is the MMA tile of the whole 1- or 2-CTA instruction (2SM: M spans the CTA pair, cluster_m even).
// One translation unit = the kernel + the same small C host shim as the Hopper template (extern "C", ctypes).
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

using Element = {{ELEMENT}};
using ElementAccumulator = float;
using ElementCompute = float;
using LayoutA = cutlass::layout::RowMajor;  // A is M x K, K contiguous
using LayoutB = cutlass::layout::RowMajor;  // B is K x N, N contiguous (an MN-major B operand for UMMA)
using LayoutD = cutlass::layout::RowMajor;
constexpr int Alignment = 16 / sizeof(Element);

using MmaTileShape = Shape<_{{TILE_M}}, _{{TILE_N}}, _{{TILE_K}}>;
using ClusterShape = Shape<_{{CLUSTER_M}}, _{{CLUSTER_N}}, _1>;
using MainloopSchedule = {{KERNEL_SCHEDULE}};
using EpilogueSchedule = {{EPILOGUE_SCHEDULE}};
using TileScheduler = {{TILE_SCHEDULER}};

// the epilogue first: an automatic stage count carves its shared storage out of the mainloop's budget
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, MmaTileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementCompute,
    void, LayoutD, Alignment,  // no source operand C
    Element, LayoutD, Alignment, EpilogueSchedule>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, Element, LayoutA, Alignment, Element, LayoutB,
    Alignment, ElementAccumulator, MmaTileShape, ClusterShape,
    {{STAGES}},
    MainloopSchedule>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue, TileScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

namespace {
struct State {
  Gemm gemm;
  typename Gemm::Arguments args;  // kept: every launch re-initialises the workspace from them (mosaic_launch)
  Element *a = nullptr, *b = nullptr, *d = nullptr;
  void *workspace = nullptr;
  size_t workspace_bytes = 0;
  size_t d_bytes = 0;
};

int fail(char *err, int errlen, const char *what, cudaError_t e) {
  if (err && errlen > 0) snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return e == cudaSuccess ? -1 : static_cast<int>(e);
}
}  // namespace

extern "C" {

// Compile-time facts of this build (need no GPU).
int mosaic_smem_bytes() { return static_cast<int>(GemmKernel::SharedStorageSize); }
int mosaic_block_threads() { return static_cast<int>(GemmKernel::MaxThreadsPerBlock); }
int mosaic_stages() { return static_cast<int>(CollectiveMainloop::DispatchPolicy::Stages); }
int mosaic_element_bytes() { return static_cast<int>(sizeof(Element)); }

void mosaic_destroy(void *handle) {
  State *g = static_cast<State *>(handle);
  if (!g) return;
  cudaFree(g->a); cudaFree(g->b); cudaFree(g->d); cudaFree(g->workspace);
  delete g;
}

// Allocate device buffers, copy A and B (raw 16-bit words), initialise the CUTLASS kernel.
// Returns a handle in *out, 0 on success, or a nonzero code with a message in err.
int mosaic_create(int m, int n, int k, const void *host_a, const void *host_b, float alpha, int sm_count,
                  void **out, char *err, int errlen) {
  *out = nullptr;
  State *g = new State();
  size_t a_bytes = size_t(m) * k * sizeof(Element), b_bytes = size_t(k) * n * sizeof(Element);
  g->d_bytes = size_t(m) * n * sizeof(Element);
  cudaError_t e;
  int rc = 0;
  auto stride_a = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, cute::make_shape(m, k, 1));
  auto stride_b = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, cute::make_shape(n, k, 1));
  auto stride_d = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, cute::make_shape(m, n, 1));
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = sm_count;
  cutlass::Status s;
  if ((e = cudaMalloc(&g->a, a_bytes)) != cudaSuccess) { rc = fail(err, errlen, "cudaMalloc A", e); goto bad; }
  if ((e = cudaMalloc(&g->b, b_bytes)) != cudaSuccess) { rc = fail(err, errlen, "cudaMalloc B", e); goto bad; }
  if ((e = cudaMalloc(&g->d, g->d_bytes)) != cudaSuccess) { rc = fail(err, errlen, "cudaMalloc D", e); goto bad; }
  if ((e = cudaMemcpy(g->a, host_a, a_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) { rc = fail(err, errlen, "copy A", e); goto bad; }
  if ((e = cudaMemcpy(g->b, host_b, b_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) { rc = fail(err, errlen, "copy B", e); goto bad; }
  {
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, 1},
                                  {g->a, stride_a, g->b, stride_b},
                                  {{alpha, 0.0f}, nullptr, stride_d, g->d, stride_d},
                                  hw};
    s = g->gemm.can_implement(args);
    if (s != cutlass::Status::kSuccess) {
      snprintf(err, errlen, "can_implement: %s", cutlass::cutlassGetStatusString(s));
      rc = -2; goto bad;
    }
    size_t ws = Gemm::get_workspace_size(args);
    if (ws && (e = cudaMalloc(&g->workspace, ws)) != cudaSuccess) { rc = fail(err, errlen, "cudaMalloc workspace", e); goto bad; }
    g->args = args;
    g->workspace_bytes = ws;
    s = g->gemm.initialize(args, g->workspace);
    if (s != cutlass::Status::kSuccess) {
      snprintf(err, errlen, "initialize: %s", cutlass::cutlassGetStatusString(s));
      rc = -3; goto bad;
    }
  }
  if ((e = cudaDeviceSynchronize()) != cudaSuccess) { rc = fail(err, errlen, "setup sync", e); goto bad; }
  *out = g;
  return 0;
bad:
  mosaic_destroy(g);
  return rc ? rc : -1;
}

// The launch configuration CUTLASS computed for this problem (host-side plan; CUPTI reports the actual).
int mosaic_grid(void *handle, int *xyz) {
  State *g = static_cast<State *>(handle);
  dim3 grid = GemmKernel::get_grid_shape(g->gemm.params());
  xyz[0] = grid.x; xyz[1] = grid.y; xyz[2] = grid.z;
  return 0;
}

// Enqueue exactly one run on the legacy default stream: no allocation, no synchronisation.
// A workspace (the stream-K tile scheduler's reduction locks) is re-initialised before every run: CUTLASS zeroes
// the locks only in initialize_workspace (the Sm100 stream-K params' initialize_workspace ->
// zero_workspace), the kernel only increments them (fixup: arrive_inc) and waits for exact values (wait_eq on
// K_idx), and Gemm::run(stream) reuses params without touching the workspace. A second run on stale locks waits
// forever. The re-initialisation is one cudaMemsetAsync on the same stream, no synchronisation.
int mosaic_launch(void *handle) {
  State *g = static_cast<State *>(handle);
  cutlass::Status s;
  if (g->workspace_bytes) {
    s = GemmKernel::initialize_workspace(g->args, g->workspace, static_cast<cudaStream_t>(0));
    if (s != cutlass::Status::kSuccess) return 2000 + static_cast<int>(s);
  }
  s = g->gemm.run(static_cast<cudaStream_t>(0));
  return s == cutlass::Status::kSuccess ? 0 : 1000 + static_cast<int>(cudaGetLastError());
}

// Fill D with 0xFFFF words (NaN in bf16 and fp16) so an element that is never written cannot pass.
int mosaic_poison(void *handle) {
  State *g = static_cast<State *>(handle);
  return static_cast<int>(cudaMemsetAsync(g->d, 0xFF, g->d_bytes, static_cast<cudaStream_t>(0)));
}

// Wait for the device and copy D (raw 16-bit words) to host.
int mosaic_read(void *handle, void *host_d, char *err, int errlen) {
  State *g = static_cast<State *>(handle);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return fail(err, errlen, "kernel", e);
  if ((e = cudaMemcpy(host_d, g->d, g->d_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) return fail(err, errlen, "copy D", e);
  return 0;
}

}  // extern "C"
