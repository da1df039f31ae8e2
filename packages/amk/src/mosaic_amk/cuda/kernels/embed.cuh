// AMK micro-kernels: the embedding lookup.
#pragma once
#include "gemv_quant.cuh"

// ------------------------------------------------------------------------------------------ embed
// x = table[token[0]]
__device__ void mk_embed(const Ctx& c, const int* t) {
  const int tb = t[W_IN + 0], kb = t[W_IN + 1], yb = t[W_OUT + 0];
  const __nv_bfloat16* table = (const __nv_bfloat16*)buf(c, tb);
  const int V = bmeta(c, tb, B_D0), H = bmeta(c, tb, B_ROW);
  const int tok = __ldcg((const int*)buf(c, kb));
  float* y = (float*)buf(c, yb);
  if (tok < 0 || tok >= V) {
    if (tid_v() == 0) atomicOr(c.control + C_ERROR, E_TOKEN);
    for (int i = tid_v(); i < H; i += AMK_THREADS) y[i] = __int_as_float(0x7fc00000);
    return;
  }
  const int fmt = bmeta(c, tb, B_DTYPE);
  if (fmt != DT_BF16) {  // a quantized table (gemv_quant.cuh): the row dequantised as quant.embed_row does
#if AMK_QUANT
    for (int i = tid_v(); i < H; i += AMK_THREADS) y[i] = q_element((const unsigned char*)table, fmt, H, V, tok, i);
#else
    if (tid_v() == 0) atomicOr(c.control + C_ERROR, E_QUANT);
#endif
    return;
  }
  const __nv_bfloat16* row = table + (size_t)tok * H;
  for (int i = tid_v(); i < H; i += AMK_THREADS) y[i] = ld_bf16(row + i);
}
