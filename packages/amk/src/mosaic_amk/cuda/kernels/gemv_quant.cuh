// AMK micro-kernels: the GEMV rows and the embedding row of a quantized weight (DT_Q8_0, DT_Q4_1, DT_INT8), read
// natively and dequantised in registers. The arithmetic is mosaic_amk/quant.py's, operation for operation, with
// explicitly rounded float32 operations (__fmul_rn / __fadd_rn are never contracted into an FMA), so the result is
// the ReferenceVM's bit for bit given the same x:
//   1. w = d * q (q8_0), q (int8), __fadd_rn(d * q, m) (q4_1; d * q is exact);
//   2. p = w * x;  3. a block's 32 products summed by a pairwise tree in element order;
//   4. lane l adds the sums of blocks l, l + 32, ... from +0;  5. warp_sum's xor butterfly;  6. int8: * row scale.
// Device layout (quant.QuantizedTensor.device_bytes): the code plane (row-major; q4_1 K / 2 bytes per row, GGUF's
// nibble order: byte j of a block holds elements j (low) and j + 16 (high)), then float16 block scales [rows, K / 32]
// (int8: float32 row scales [rows]), then (q4_1) float16 block minima; each plane starts 16-byte aligned.
#pragma once
#include <cuda_fp16.h>
#include "gemv_rows.cuh"
// AMK_QUANT=1 builds the quantized paths into the VM (cuda_vm.quant_defines picks it for a model with quantized
// weights); the default bf16 build leaves them out, so their registers never weigh on the bf16 kernels, and a
// quantized weight that reaches it sets E_QUANT instead of being read as bf16.
#ifndef AMK_QUANT
#define AMK_QUANT 0
#endif

__device__ __forceinline__ size_t q_align16(size_t n) { return (n + 15) & ~(size_t)15; }
__device__ __forceinline__ float f16_at(const unsigned char* p, size_t i) {
  return __half2float(__ushort_as_half(((const unsigned short*)p)[i]));
}
__device__ __forceinline__ size_t q_code_row(int fmt, int K) { return fmt == DT_Q4_1 ? (size_t)(K >> 1) : (size_t)K; }

// step 1-3 for block b of row r with xs (the GEMV's staged x, xpos layout): the block's pairwise-tree sum, computed
// eight elements at a time (the tree's level-3 groups, then ((g0 + g1) + (g2 + g3)): the same tree, fewer live
// registers)
__device__ __forceinline__ float q_tree8(float* p) {
#pragma unroll
  for (int s = 1; s < 8; s <<= 1) {
#pragma unroll
    for (int e = 0; e < 8; e += 2 * s) p[e] = __fadd_rn(p[e], p[e + s]);
  }
  return p[0];
}
__device__ __forceinline__ float q_block_sum(const unsigned char* W, int fmt, int K, int rows, int r, int b,
                                             const float* xs) {
  const int nb = K >> 5;
  const size_t codes = q_align16((size_t)rows * q_code_row(fmt, K));
  const unsigned char* row = W + (size_t)r * q_code_row(fmt, K);
  float g[4];
  if (fmt == DT_Q4_1) {
    const uint4 v = ld_w16(row + 16 * (size_t)b);
    const float d = f16_at(W + codes, (size_t)r * nb + b);
    const float m = f16_at(W + codes + q_align16((size_t)rows * nb * 2), (size_t)r * nb + b);
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // elements 8k .. 8k + 7: low nibbles of bytes 8k .. (k < 2), else high of 8(k-2) ..
      const unsigned w0 = (k & 1) ? v.z : v.x, w1 = (k & 1) ? v.w : v.y, sh = k < 2 ? 0u : 4u;
      float p[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const unsigned q = (((j < 4 ? w0 : w1) >> (8 * (j & 3) + sh)) & 15u);
        const float w = __fadd_rn(__fmul_rn(d, (float)q), m);
        p[j] = __fmul_rn(w, xs[xpos(32 * b + 8 * k + j, K)]);
      }
      g[k] = q_tree8(p);
    }
  } else {
    const float d = fmt == DT_Q8_0 ? f16_at(W + codes, (size_t)r * nb + b) : 1.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint2 v = *(const uint2*)(row + 32 * (size_t)b + 8 * k);  // elements 8k .. 8k + 7
      float p[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float q = (float)(signed char)(((j < 4 ? v.x : v.y) >> (8 * (j & 3))) & 0xffu);
        const float w = fmt == DT_Q8_0 ? __fmul_rn(d, q) : q;
        p[j] = __fmul_rn(w, xs[xpos(32 * b + 8 * k + j, K)]);
      }
      g[k] = q_tree8(p);
    }
  }
  return __fadd_rn(__fadd_rn(g[0], g[1]), __fadd_rn(g[2], g[3]));
}

// rows [r0, r1) of W @ xs for a quantized W of `rows` rows and K columns (K % 32 == 0), one warp per row (rows
// r0 + warp, + AMK_WARPS, ...): every lane calls epi(r, dot) with the row's dot product (steps 1-6)
template <class Epi>
__device__ __forceinline__ void qgemv_rows(const unsigned char* W, int fmt, int K, int rows, int r0, int r1,
                                           const float* xs, Epi epi) {
  const int warp = tid_v() >> 5, lane = tid_v() & 31, nb = K >> 5;
  const float* sc = (const float*)(W + q_align16((size_t)rows * K));  // int8's row scales
  // two rows of the warp at a time (their loads in flight together; each row's additions as for one)
  for (int r = r0 + warp; r < r1; r += 2 * AMK_WARPS) {
    const int r2 = r + AMK_WARPS;
    const bool two = r2 < r1;  // warp-uniform
    float acc = 0.f, acc2 = 0.f;
    for (int b = lane; b < nb; b += 32) {
      const float s1 = q_block_sum(W, fmt, K, rows, r, b, xs);
      const float s2 = two ? q_block_sum(W, fmt, K, rows, r2, b, xs) : 0.f;
      acc = __fadd_rn(acc, s1);
      acc2 = __fadd_rn(acc2, s2);
    }
    acc = warp_sum(acc);
    acc2 = warp_sum(acc2);
    if (fmt == DT_INT8) {
      acc = __fmul_rn(sc[r], acc);
      if (two) acc2 = __fmul_rn(sc[r2], acc2);
    }
    epi(r, acc);
    if (two) epi(r2, acc2);
  }
}

// two matrices of one format and shape (gate and up): epi(r, dot_gate, dot_up)
template <class Epi>
__device__ __forceinline__ void qgemv_rows2(const unsigned char* Wg, const unsigned char* Wu, int fmt, int K, int rows,
                                            int r0, int r1, const float* xs, Epi epi) {
  const int warp = tid_v() >> 5, lane = tid_v() & 31, nb = K >> 5;
  for (int r = r0 + warp; r < r1; r += AMK_WARPS) {
    float ag = 0.f, au = 0.f;
    for (int b = lane; b < nb; b += 32) {
      ag = __fadd_rn(ag, q_block_sum(Wg, fmt, K, rows, r, b, xs));
      au = __fadd_rn(au, q_block_sum(Wu, fmt, K, rows, r, b, xs));
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (fmt == DT_INT8) {
      ag = __fmul_rn(((const float*)(Wg + q_align16((size_t)rows * K)))[r], ag);
      au = __fmul_rn(((const float*)(Wu + q_align16((size_t)rows * K)))[r], au);
    }
    epi(r, ag, au);
  }
}

// element i of row r dequantised (step 1; int8: times the row's scale), the embedding's lookup
__device__ __forceinline__ float q_element(const unsigned char* W, int fmt, int K, int rows, int r, int i) {
  const int nb = K >> 5, b = i >> 5, e = i & 31;
  const size_t codes = q_align16((size_t)rows * q_code_row(fmt, K));
  const unsigned char* row = W + (size_t)r * q_code_row(fmt, K);
  if (fmt == DT_Q4_1) {
    const unsigned byte = row[16 * b + (e & 15)];
    const float q = (float)(e < 16 ? (byte & 15u) : (byte >> 4));
    return __fadd_rn(__fmul_rn(f16_at(W + codes, (size_t)r * nb + b), q),
                     f16_at(W + codes + q_align16((size_t)rows * nb * 2), (size_t)r * nb + b));
  }
  const float q = (float)(signed char)row[i];
  if (fmt == DT_Q8_0) return __fmul_rn(f16_at(W + codes, (size_t)r * nb + b), q);
  return __fmul_rn(q, ((const float*)(W + codes))[r]);
}
