// Mosaicist attention forward for Hopper (sm_90a) in CuTe C++: o = softmax(q k^T / sqrt(d) [causal]) v.
// Written for this project (see mosaic_target_cutlass/attention.py for the knobs and the rules that decide which
// combinations build). bf16 or f16 in, fp32 accumulate and softmax, same type out; head_dim 64 or 128; grouped-query
// heads; any seq (partial blocks are masked, their loads zero-filled by TMA, their stores predicated).
//
// Layout (the family's): q, o (batch, heads, seq, d) and k, v (batch, kv_heads, seq, d), row-major. CuTe sees them as
// rank-3 tensors whose last mode L runs over (batch, head): Q/O (seq, d, batch*heads) and K (seq, d, batch*kv_heads),
// both with d contiguous (K-major operands of S = Q K^T), and V seen transposed, (d, seq, batch*kv_heads), so that it is
// the MN-major B operand of O = P V (O[m, d] += P[m, j] V^T[d, j]). Query head h of batch b reads key/value head
// b * kv_heads + h / (heads / kv_heads).
//
// One CTA per (query block, head, batch): 128 * (1 + ConsumerWGs) threads.
//   warpgroup 0, the producer: one elected thread issues TMA loads, the Q tile once (an mbarrier of its own), then
//     for every key block the CTA visits, from block 0 up, a K tile and a V tile into two Stages-deep rings of
//     shared-memory slots, each slot with a "full" transaction mbarrier (TMA completes it) and an "empty" mbarrier
//     (every consumer thread arrives once it is done reading the slot).
//   warpgroups 1..ConsumerWGs, the consumers, 64 or 128 query rows each. Per key block j:
//     S = Q K_j^T by wgmma (SS: both operands in shared memory), K slot released;
//     mask only where needed (causal diagonal blocks, the seq tail block): s = -inf;
//     online softmax in registers: running row max m (reduced over the 4 threads of a quad that share an
//       accumulator row), p = exp2(s * scale_log2 - m * scale_log2) with scale_log2 = log2(e) / sqrt(d) folded into
//       one FFMA before one MUFU.EX2, running per-thread partial row sums l, O rescaled by exp2(m_old - m_new);
//     P converted to the input type and O += P V_j by a second wgmma: P read from registers (PInRegs: RS wgmma, the
//       accumulator fragment of S re-viewed as the A operand fragment) or staged through a shared-memory tile (SS
//       wgmma: each thread stores its P values, fence.proxy.async, a named barrier over its warpgroup); V slot
//       released.
//   Epilogue: l summed over the quad, O / l (a row whose sum is 0 is left as is), converted, stored to global memory
//   from registers (two adjacent columns per 32-bit store, rows past seq not stored).
// Causal (bottom-right aligned with equal query and key lengths: key j visible from query i when j <= i): with
// CausalSkip the CTA visits key blocks 0 .. ceil(min((m+1) BlockM, seq) / BlockN) - 1 only; without it every block,
// those above the diagonal masked whole. Masked blocks are those from m BlockM / BlockN up (plus the seq tail block).
// Causal CTAs are launched heaviest (last query block) first.
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/device_kernel.h"
#include "cutlass/numeric_types.h"
#include "cute/tensor.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/arch/mma_sm90.hpp"

namespace mosaic_attention {

using namespace cute;

constexpr int kWarpgroup = 128;
constexpr int kSmemAlign = 1024;  // 128-byte swizzled tiles must start on a 1 KiB boundary

// The compile-time configuration: element type, head dim and the knobs (see attention.py's AttentionKnobs).
template <class Element_, int HeadDim_, int BlockM_, int BlockN_, int Stages_, int ConsumerWGs_, bool Causal_,
          bool CausalSkip_, bool PInRegs_>
struct Config {
  using Element = Element_;
  static constexpr int D = HeadDim_;
  static constexpr int BM = BlockM_;
  static constexpr int BN = BlockN_;
  static constexpr int Stages = Stages_;
  static constexpr int ConsumerWGs = ConsumerWGs_;
  static constexpr bool Causal = Causal_;
  static constexpr bool CausalSkip = CausalSkip_;
  static constexpr bool PInRegs = PInRegs_;
  static constexpr int RowsPerWG = BM / ConsumerWGs;
  static constexpr int Threads = kWarpgroup * (1 + ConsumerWGs);
  static constexpr int ConsumerThreads = kWarpgroup * ConsumerWGs;
  // setmaxnreg split (two consumer warpgroups only: with one, the launch bound already allows 255 per thread)
  static constexpr int ProducerRegs = 24;
  static constexpr int ConsumerRegs = 240;

  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t>,
                "16-bit inputs only");
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(RowsPerWG * ConsumerWGs == BM && (RowsPerWG == 64 || RowsPerWG == 128),
                "64 or 128 query rows per consumer warpgroup");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "block_n: a multiple of 16 up to 256 (wgmma N, P V's K)");
  static_assert(PInRegs || BN % 64 == 0, "a P tile staged in shared memory is 128-byte swizzled: block_n % 64 == 0");
  static_assert(Stages >= 1 && Stages <= 8, "1 to 8 stages");

  // shared-memory tiles, 128-byte swizzled: Q (BM x D), K (BN x D) K-major; V seen as (D x BN) MN-major; P (BM x BN)
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<BM>, Int<D>>{}));
  using SmemLayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                             Shape<Int<BN>, Int<D>, Int<Stages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{},
                                             Shape<Int<D>, Int<BN>, Int<Stages>>{}));
  using SmemLayoutP = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<BM>, Int<BN>>{}));

  // the two MMAs: 64-row wgmma atoms, one per consumer warpgroup along M (a 128-row warpgroup repeats its atom)
  using WGLayout = Layout<Shape<Int<ConsumerWGs>, _1, _1>>;
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<BN>, Int<D>>>(), WGLayout{}));
  using MmaPVOp = cute::conditional_t<
      PInRegs,
      decltype(GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<D>, Int<BN>>, GMMA::Major::K,
                                    GMMA::Major::MN>()),
      decltype(GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<D>, Int<BN>>, GMMA::Major::K,
                                    GMMA::Major::MN>())>;
  using TiledMmaPV = decltype(make_tiled_mma(MmaPVOp{}, WGLayout{}));

  // global tensors as the TMA units see them
  using LayoutQK = Layout<Shape<int, Int<D>, int>, Stride<Int<D>, _1, int64_t>>;   // (seq, d, L)
  using LayoutVt = Layout<Shape<Int<D>, int, int>, Stride<_1, Int<D>, int64_t>>;   // (d, seq, L)

  static auto layout_qk(int seq, int l) {
    return LayoutQK{make_shape(seq, Int<D>{}, l), make_stride(Int<D>{}, _1{}, int64_t(seq) * D)};
  }
  static auto layout_vt(int seq, int l) {
    return LayoutVt{make_shape(Int<D>{}, seq, l), make_stride(_1{}, Int<D>{}, int64_t(seq) * D)};
  }
  static auto make_tma_q(Element const* q, int seq, int l) {
    return make_tma_atom(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(q), layout_qk(seq, l)), SmemLayoutQ{},
                         Shape<Int<BM>, Int<D>>{});
  }
  static auto make_tma_k(Element const* k, int seq, int l) {
    return make_tma_atom(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(k), layout_qk(seq, l)),
                         SmemLayoutK{}(_, _, 0), Shape<Int<BN>, Int<D>>{});
  }
  static auto make_tma_v(Element const* v, int seq, int l) {
    return make_tma_atom(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(v), layout_vt(seq, l)),
                         SmemLayoutV{}(_, _, 0), Shape<Int<D>, Int<BN>>{});
  }
  using TmaQ = decltype(make_tma_q(nullptr, 1, 1));
  using TmaK = decltype(make_tma_k(nullptr, 1, 1));
  using TmaV = decltype(make_tma_v(nullptr, 1, 1));

  static constexpr uint32_t QBytes = BM * D * sizeof(Element);
  static constexpr uint32_t KVBytes = BN * D * sizeof(Element);

  struct EmptyTile {};
  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, kSmemAlign> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, kSmemAlign> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, kSmemAlign> v;
    cute::conditional_t<PInRegs, EmptyTile, cute::array_aligned<Element, cosize_v<SmemLayoutP>, kSmemAlign>> p;
    alignas(8) uint64_t bar_q;
    uint64_t full_k[Stages], empty_k[Stages], full_v[Stages], empty_v[Stages];
  };
  // the launch's dynamic shared memory: the storage plus room to align its start to 1 KiB
  static constexpr int SmemBytes = int(sizeof(SharedStorage)) + kSmemAlign;

  struct Params {
    TmaQ tma_q;
    TmaK tma_k;
    TmaV tma_v;
    Element* o;
    int batch, seq, heads, kv_heads;
    float scale_log2;  // log2(e) / sqrt(d): the softmax scale folded into the exp2 argument
  };
};

// Key blocks a query block visits ([0, visited)) and the first of them that needs a mask ([masked, visited)): the one
// rule the kernel and the host-side checks share.
struct KeyBlocks {
  int masked, visited;
};

template <class Cfg>
CUTE_HOST_DEVICE KeyBlocks key_blocks(int m_block, int seq) {
  int total = (seq + Cfg::BN - 1) / Cfg::BN;
  if constexpr (Cfg::Causal) {
    int last_row = (m_block + 1) * Cfg::BM < seq ? (m_block + 1) * Cfg::BM : seq;  // one past the block's last query
    int visited = Cfg::CausalSkip ? (last_row + Cfg::BN - 1) / Cfg::BN : total;
    int masked = (m_block * Cfg::BM) / Cfg::BN;
    return {masked < visited ? masked : visited, visited};
  } else {
    return {seq % Cfg::BN ? total - 1 : total, total};
  }
}

// The key/value L index (batch * kv_heads + kv head) query head `head` of `batch` reads: query heads are grouped,
// heads / kv_heads consecutive ones per kv head (GQA; MQA when kv_heads == 1).
CUTE_HOST_DEVICE int kv_index(int batch, int head, int heads, int kv_heads) {
  return batch * kv_heads + head / (heads / kv_heads);
}

// A wgmma accumulator fragment ((2, 2, V), MMA_M, MMA_N) seen as (rows, cols) = ((2, MMA_M), (2, V, MMA_N)): the row
// mode is the "+8 rows" value bit and the M repeat; the column mode the adjacent-pair bit, the 8-column groups and the
// N repeat.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol(Layout const& acc) {
  static_assert(decltype(rank(acc))::value == 3, "an MMA accumulator fragment (V, M, N)");
  auto v = get<0>(acc);
  static_assert(decltype(rank(v))::value == 3, "a 64xN wgmma fp32 accumulator value mode (2, 2, N/8)");
  return make_layout(make_layout(get<1>(v), get<1>(acc)), make_layout(get<0>(v), get<2>(v), get<2>(acc)));
}

CUTE_DEVICE float ex2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

CUTE_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

CUTE_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// Two adjacent 16-bit values, converted, as one 32-bit store: to shared memory (st.shared: a swizzled CuTe smem
// pointer is computed through an integer, which would leave a generic store) or to global memory.
template <class Element>
CUTE_DEVICE uint32_t pack_pair(float lo, float hi) {
  return uint32_t(static_cast<Element>(lo).raw()) | (uint32_t(static_cast<Element>(hi).raw()) << 16);
}

template <class Element>
CUTE_DEVICE void st_shared_pair(void* ptr, float lo, float hi) {
  uint32_t const addr = cute::cast_smem_ptr_to_uint(ptr);
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pack_pair<Element>(lo, hi)) : "memory");
}

// P (the S accumulator after the softmax, fp32) into the A-operand register fragment of the P V wgmma, converted. A
// 64x16 16-bit A fragment holds, per thread, values (2, 2, 2) = (adjacent k, +8 rows, +8 k); the 64xN accumulator
// holds (2, 2, N/8) = (adjacent n, +8 rows, +8 n): the A fragment's k block kb is the accumulator's 8-column groups
// 2 kb and 2 kb + 1 (checked on the host by check_fragment_maps).
template <class TensorS, class TensorP>
CUTE_DEVICE void convert_p(TensorS const& tSrS, TensorP& tOrP) {
  using Element = typename TensorP::value_type;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOrP); ++m) {
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tOrP); ++kb) {
      CUTE_UNROLL
      for (int v2 = 0; v2 < 2; ++v2) {
        CUTE_UNROLL
        for (int v1 = 0; v1 < 2; ++v1) {
          CUTE_UNROLL
          for (int v0 = 0; v0 < 2; ++v0) {
            tOrP(make_coord(make_coord(v0, v1, v2), m, kb)) =
                static_cast<Element>(tSrS(make_coord(make_coord(v0, v1, 2 * kb + v2), m, 0)));
          }
        }
      }
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::Threads, 1) attention_fwd_kernel(CUTLASS_GRID_CONSTANT typename Cfg::Params const p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Cfg::Element;
  using SharedStorage = typename Cfg::SharedStorage;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, D = Cfg::D, Stages = Cfg::Stages;

  // align the storage to 1 KiB by an offset from the shared array itself (so the compiler still knows every access
  // through it is to shared memory: STS, not a generic ST)
  extern __shared__ char smem_raw[];
  uint32_t const pad = (kSmemAlign - cute::cast_smem_ptr_to_uint(smem_raw) % kSmemAlign) % kSmemAlign;
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw + pad);

  int const warp_idx = cutlass::canonical_warp_idx_sync();
  int const warp_group = cutlass::canonical_warp_group_idx();
  bool const elected = cute::elect_one_sync();

  int const m_blocks = (p.seq + BM - 1) / BM;
  int const m_block = Cfg::Causal ? m_blocks - 1 - int(blockIdx.x) : int(blockIdx.x);
  int const head = blockIdx.y, batch = blockIdx.z;
  int const l_q = batch * p.heads + head;
  int const l_kv = kv_index(batch, head, p.heads, p.kv_heads);
  KeyBlocks const kb = key_blocks<Cfg>(m_block, p.seq);

  using FullBar = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBar = cutlass::arch::ClusterBarrier;
  if (warp_idx == 0 && elected) {
    FullBar::init(&ss.bar_q, 1);
    CUTE_UNROLL
    for (int s = 0; s < Stages; ++s) {
      FullBar::init(&ss.full_k[s], 1);
      FullBar::init(&ss.full_v[s], 1);
      EmptyBar::init(&ss.empty_k[s], Cfg::ConsumerThreads);
      EmptyBar::init(&ss.empty_v[s], Cfg::ConsumerThreads);
    }
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});  // (BM, D)
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutK{});  // (BN, D, Stages)
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutV{});  // (D, BN, Stages)

  if (warp_group == 0) {
    // ---- producer ----
    if constexpr (Cfg::ConsumerWGs == 2) cutlass::arch::warpgroup_reg_dealloc<Cfg::ProducerRegs>();
    if (warp_idx == 0 && elected) {
      Tensor mQ = p.tma_q.get_tma_tensor(make_shape(p.seq, Int<D>{}, p.batch * p.heads));
      Tensor mK = p.tma_k.get_tma_tensor(make_shape(p.seq, Int<D>{}, p.batch * p.kv_heads));
      Tensor mV = p.tma_v.get_tma_tensor(make_shape(Int<D>{}, p.seq, p.batch * p.kv_heads));
      Tensor gQ = local_tile(mQ(_, _, l_q), Shape<Int<BM>, Int<D>>{}, make_coord(m_block, 0));  // (BM, D)
      Tensor gK = local_tile(mK(_, _, l_kv), Shape<Int<BN>, Int<D>>{}, make_coord(_, 0));       // (BN, D, n)
      Tensor gV = local_tile(mV(_, _, l_kv), Shape<Int<D>, Int<BN>>{}, make_coord(0, _));       // (D, BN, n)
      auto [tQgQ, tQsQ] = tma_partition(p.tma_q, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto [tKgK, tKsK] = tma_partition(p.tma_k, group_modes<0, 2>(sK), group_modes<0, 2>(gK));  // (TMA, n), (TMA, s)
      auto [tVgV, tVsV] = tma_partition(p.tma_v, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

      FullBar::arrive_and_expect_tx(&ss.bar_q, Cfg::QBytes);
      copy(p.tma_q.with(ss.bar_q), tQgQ, tQsQ);
      for (int j = 0; j < kb.visited; ++j) {
        int const s = j % Stages;
        uint32_t const phase = (j / Stages) & 1;
        EmptyBar::wait(&ss.empty_k[s], phase ^ 1);  // the first pass through the ring finds every slot free
        FullBar::arrive_and_expect_tx(&ss.full_k[s], Cfg::KVBytes);
        copy(p.tma_k.with(ss.full_k[s]), tKgK(_, j), tKsK(_, s));
        EmptyBar::wait(&ss.empty_v[s], phase ^ 1);
        FullBar::arrive_and_expect_tx(&ss.full_v[s], Cfg::KVBytes);
        copy(p.tma_v.with(ss.full_v[s]), tVgV(_, j), tVsV(_, s));
      }
    }
  } else {
    // ---- consumers ----
    if constexpr (Cfg::ConsumerWGs == 2) cutlass::arch::warpgroup_reg_alloc<Cfg::ConsumerRegs>();
    int const tidx = int(threadIdx.x) - kWarpgroup;
    typename Cfg::TiledMmaQK mma_qk;
    typename Cfg::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(tidx);
    auto thr_pv = mma_pv.get_thread_slice(tidx);

    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // descriptors (MMA, MMA_M, MMA_K)
    Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, Stages)
    Tensor tOrV = thr_pv.partition_fragment_B(sV);  // (MMA, MMA_N, MMA_K, Stages)
    Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<BM>, Int<BN>>{});  // fp32 (MMA, MMA_M, MMA_N)
    Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<BM>, Int<D>>{});
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));  // (row, col) in the tile
    Tensor S = make_tensor(tSrS.data(), rowcol(tSrS.layout()));
    Tensor cS = make_tensor(tScS.data(), rowcol(tScS.layout()));
    Tensor O = make_tensor(tOrO.data(), rowcol(tOrO.layout()));
    constexpr int Rows = decltype(size<0>(S))::value;
    static_assert(Rows == decltype(size<0>(O))::value, "S and O rows are the same rows");

    float row_max[Rows], row_sum[Rows];
    CUTE_UNROLL
    for (int r = 0; r < Rows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
    clear(tOrO);
    int const row0 = m_block * BM;

    FullBar::wait(&ss.bar_q, 0);
    CUTE_NO_UNROLL
    for (int j = 0; j < kb.visited; ++j) {
      int const s = j % Stages;
      uint32_t const phase = (j / Stages) & 1;

      // S = Q K_j^T
      FullBar::wait(&ss.full_k[s], phase);
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        cute::gemm(mma_qk, tSrQ(_, _, k), tSrK(_, _, k, s), tSrS);
        mma_qk.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      EmptyBar::arrive(&ss.empty_k[s]);

      // mask: keys past seq, and (causal) keys after the query
      if (j >= kb.masked) {
        int const col0 = j * BN;
        CUTE_UNROLL
        for (int r = 0; r < size<0>(S); ++r) {
          CUTE_UNROLL
          for (int c = 0; c < size<1>(S); ++c) {
            int const row = row0 + get<0>(cS(r, c));
            int const col = col0 + get<1>(cS(r, c));
            bool const hidden = col >= p.seq || (Cfg::Causal && col > row);
            if (hidden) S(r, c) = -INFINITY;
          }
        }
      }

      // online softmax: exp2 with the scale and log2(e) folded into one multiplier
      CUTE_UNROLL
      for (int r = 0; r < Rows; ++r) {
        float mx = row_max[r];
        CUTE_UNROLL
        for (int c = 0; c < size<1>(S); ++c) mx = fmaxf(mx, S(r, c));
        mx = quad_max(mx);
        float const m_scaled = mx == -INFINITY ? 0.f : mx * p.scale_log2;  // a row with no key yet stays at 0
        float const correction = ex2(row_max[r] * p.scale_log2 - m_scaled);
        row_max[r] = mx;
        float sum = 0.f;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(S); ++c) {
          float const e = ex2(__fmaf_rn(S(r, c), p.scale_log2, -m_scaled));
          S(r, c) = e;
          sum += e;
        }
        row_sum[r] = row_sum[r] * correction + sum;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(O); ++c) O(r, c) *= correction;
      }

      // O += P V_j
      if constexpr (Cfg::PInRegs) {
        Tensor tOrP = make_tensor<Element>(partition_shape_A(mma_pv, Shape<Int<BM>, Int<BN>>{}));
        convert_p(tSrS, tOrP);
        FullBar::wait(&ss.full_v[s], phase);
        warpgroup_fence_operand(tOrP);
        warpgroup_fence_operand(tOrO);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOrP); ++k) cute::gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k, s), tOrO);
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
      } else {
        Tensor sP = make_tensor(make_smem_ptr(ss.p.data()), typename Cfg::SmemLayoutP{});  // (BM, BN)
        Tensor tSsP = thr_qk.partition_C(sP);  // this thread's S elements' places in the P tile
        Tensor Ps = make_tensor(tSsP.data(), rowcol(tSsP.layout()));
        CUTE_UNROLL
        for (int r = 0; r < size<0>(S); ++r) {
          CUTE_UNROLL
          for (int c = 0; c < size<1>(S); c += 2) st_shared_pair<Element>(&Ps(r, c), S(r, c), S(r, c + 1));
        }
        cutlass::arch::fence_view_async_shared();  // the generic-proxy stores, before the wgmma (async proxy) reads
        cutlass::arch::NamedBarrier::sync(kWarpgroup, warp_group - 1);  // this warpgroup's rows are all written
        Tensor tOrP = thr_pv.partition_fragment_A(sP);  // descriptors
        FullBar::wait(&ss.full_v[s], phase);
        warpgroup_fence_operand(tOrO);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOrP); ++k) cute::gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k, s), tOrO);
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
      }
      EmptyBar::arrive(&ss.empty_v[s]);
    }

    // epilogue: O / l, converted, two adjacent columns per store; rows past seq are not stored
    Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<BM>, Int<D>>{}));
    Tensor cO = make_tensor(tOcO.data(), rowcol(tOcO.layout()));
    Element* o = p.o + int64_t(l_q) * p.seq * D;
    CUTE_UNROLL
    for (int r = 0; r < Rows; ++r) {
      float const l = quad_sum(row_sum[r]);
      float const inv = l > 0.f ? 1.f / l : 1.f;
      int const row = row0 + get<0>(cO(r, 0));
      CUTE_UNROLL
      for (int c = 0; c < size<1>(O); c += 2) {
        uint32_t const pair = pack_pair<Element>(O(r, c) * inv, O(r, c + 1) * inv);
        if (row < p.seq) *reinterpret_cast<uint32_t*>(o + int64_t(row) * D + get<1>(cO(r, c))) = pair;
      }
    }
  }
#endif
}

// Host side: the kernel parameters (TMA descriptors: needs the CUDA driver, not a GPU-less machine) and one launch.
template <class Cfg>
typename Cfg::Params make_params(typename Cfg::Element const* q, typename Cfg::Element const* k,
                                 typename Cfg::Element const* v, typename Cfg::Element* o, int batch, int seq,
                                 int heads, int kv_heads) {
  typename Cfg::Params p{Cfg::make_tma_q(q, seq, batch * heads), Cfg::make_tma_k(k, seq, batch * kv_heads),
                         Cfg::make_tma_v(v, seq, batch * kv_heads), o, batch, seq, heads, kv_heads,
                         float(1.4426950408889634 / std::sqrt(double(Cfg::D)))};
  return p;
}

template <class Cfg>
dim3 grid_shape(int batch, int seq, int heads) {
  return dim3((seq + Cfg::BM - 1) / Cfg::BM, heads, batch);
}

// Checks the problem against what the kernel takes; 0 when it fits, else a nonzero code (and a message).
inline int check_problem(int batch, int seq, int heads, int kv_heads, char const** why) {
  if (batch < 1 || seq < 1 || heads < 1 || kv_heads < 1) { *why = "every dimension must be >= 1"; return 1; }
  if (heads % kv_heads) { *why = "kv_heads must divide heads"; return 2; }
  if (heads > 65535 || batch > 65535) { *why = "heads and batch are grid dimensions: at most 65535"; return 3; }
  return 0;
}

template <class Cfg>
cudaError_t launch(typename Cfg::Params const& p, cudaStream_t stream) {
  auto kernel = &attention_fwd_kernel<Cfg>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<grid_shape<Cfg>(p.batch, p.seq, p.heads), Cfg::Threads, Cfg::SmemBytes, stream>>>(p);
  return cudaGetLastError();
}

// Host-side check of the fragment maps the kernel relies on (pure layout algebra, no GPU): for every consumer thread
// the S and O accumulator rows agree row for row, the 4 threads of a quad hold the same rows, the P conversion puts
// every value where the P V wgmma's A operand expects the same (row, key), the epilogue's pairs are adjacent columns,
// and S and O fragments cover their tiles exactly once. Returns the number of violations.
template <class Cfg>
int check_fragment_maps() {
  using namespace cute;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, D = Cfg::D;
  typename Cfg::TiledMmaQK mma_qk;
  typename Cfg::TiledMmaPV mma_pv;
  int bad = 0;
  static int seen_s[BM][BN], seen_o[BM][D];
  for (int r = 0; r < BM; ++r) {
    for (int c = 0; c < BN; ++c) seen_s[r][c] = 0;
    for (int c = 0; c < D; ++c) seen_o[r][c] = 0;
  }
  auto rows_of = [&](int t) {
    auto cS = mma_qk.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
    return make_tensor(cS.data(), rowcol(cS.layout()));
  };
  for (int t = 0; t < Cfg::ConsumerThreads; ++t) {
    auto thr_qk = mma_qk.get_thread_slice(t);
    auto thr_pv = mma_pv.get_thread_slice(t);
    auto tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
    auto tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<BM>, Int<D>>{}));
    auto cS = make_tensor(tScS.data(), rowcol(tScS.layout()));
    auto cO = make_tensor(tOcO.data(), rowcol(tOcO.layout()));
    if (size<0>(cS) != size<0>(cO)) ++bad;
    auto quad1 = rows_of(t ^ 1), quad2 = rows_of(t ^ 2);
    for (int r = 0; r < size<0>(cS); ++r) {
      int row = get<0>(cS(r, 0));
      for (int c = 0; c < size<1>(cS); ++c) {
        if (get<0>(cS(r, c)) != row) ++bad;
        seen_s[get<0>(cS(r, c))][get<1>(cS(r, c))] += 1;
      }
      for (int c = 0; c < size<1>(cO); ++c) {
        if (get<0>(cO(r, c)) != row) ++bad;
        seen_o[get<0>(cO(r, c))][get<1>(cO(r, c))] += 1;
      }
      for (int c = 0; c < size<1>(cO); c += 2) {
        if (get<1>(cO(r, c)) % 2 || get<1>(cO(r, c + 1)) != get<1>(cO(r, c)) + 1) ++bad;
      }
      for (int c = 0; c < size<1>(cS); c += 2) {  // the staged P's pairs (st_shared_pair)
        if (get<1>(cS(r, c)) % 2 || get<1>(cS(r, c + 1)) != get<1>(cS(r, c)) + 1) ++bad;
      }
      if (get<0>(quad1(r, 0)) != row || get<0>(quad2(r, 0)) != row) ++bad;
    }
    // the P conversion (P in registers): the A operand value at (v, m, kb) must hold S's value of the same (row,
    // key); staged through shared memory, P is stored by the S partition itself (tSsP) and read by descriptors
    if constexpr (Cfg::PInRegs) {
      auto tOcP = thr_pv.partition_A(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));  // (MMA, MMA_M, MMA_K)
      if (size(tOcP) != size(tScS)) ++bad;
      for (int m = 0; m < size<1>(tOcP); ++m)
        for (int kb = 0; kb < size<2>(tOcP); ++kb)
          for (int v2 = 0; v2 < 2; ++v2)
            for (int v1 = 0; v1 < 2; ++v1)
              for (int v0 = 0; v0 < 2; ++v0) {
                auto a = tOcP(make_coord(make_coord(v0, v1, v2), m, kb));
                auto s = tScS(make_coord(make_coord(v0, v1, 2 * kb + v2), m, 0));
                if (get<0>(a) != get<0>(s) || get<1>(a) != get<1>(s)) ++bad;
              }
    }
  }
  for (int r = 0; r < BM; ++r) {
    for (int c = 0; c < BN; ++c) bad += seen_s[r][c] != 1;
    for (int c = 0; c < D; ++c) bad += seen_o[r][c] != 1;
  }
  return bad;
}

}  // namespace mosaic_attention
