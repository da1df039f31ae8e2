// AMK micro-kernels: decode attention (and its KV staging).
#pragma once
#include "common.cuh"

// -------------------------------------------------------------------------------------- attention
// decode attention of heads row_start/hd .. row_end/hd over cached tokens [first, position] (GQA)
// HF eager: s = bf16(bf16(q.k) * scale); p = bf16(softmax_f32(s)); y = bf16(p @ v)
//
// The heads of one KV group are processed together (up to ATT_NB at a time), so each K and V row is read
// once for all of them. Scores: one token per thread, its K row read as float4 (hd/4 independent 16-byte
// loads in flight per thread). p @ v: thread (grp, d4) owns 4 dims of every head and the tokens
// grp, grp + groups, ... (4 V loads in flight); the groups' partial sums meet in shared memory.
//
// KV staging (build define AMK_ATT_STAGE=1, ScheduleConfig.attention_stage): for a task flagged F_KV_STAGE by the
// encoder whose heads are in one KV group and whose rows fit the general area, att_stage (vm.cu, BEFORE the
// task's wait, with the weight preload) copies the cached K and V rows of positions first .. pos - 1 into shared
// memory with cp.async (rows padded to hd + 4 floats: the score loop's float4 reads are bank-conflict free).
// Those rows were written in earlier steps (the encoder's F_KV_STAGE rule; the step boundary's grid sync or the
// kernel boundary orders them before this step); this step's row pos is read after the wait, together with q.
// Only where the values come from changes: every sum is the unstaged path's, in its order (bit-identical).
#define ATT_NB 8
#ifndef AMK_ATT_NB1  // the staged one-head instantiation (0: every task through the eight-slot code)
#define AMK_ATT_NB1 1
#endif
#ifndef AMK_ATT_STAGE
#define AMK_ATT_STAGE 0
#endif
struct AttShape {
  int hd, rep, kvd, pos, first, n, h0, h1;  // heads [h0, h1) of the task
  bool in_cache, staged;                    // in_cache: the position is inside the cache
  float *qs, *redm, *part, *sc, *ks, *vs;   // shared memory; ks / vs (staged): n rows of ld floats
  int ld, nb_fit;                           // nb_fit: heads whose scores fit sc at once
};
__device__ __forceinline__ AttShape att_shape(const Ctx& c, const int* t) {
  AttShape a;
  const int kb = t[W_IN + 1];
  a.hd = t[W_HD];
  a.rep = t[W_NH] / t[W_NKV];
  a.kvd = bmeta(c, kb, B_D0 + 2);
  a.pos = task_pos(c, t);
  const int window = t[W_WINDOW];
  a.first = window > 0 ? max(0, a.pos - window + 1) : 0;
  a.n = a.pos + 1 - a.first;
  a.h0 = t[W_ROW0] / a.hd;
  a.h1 = t[W_ROW1] / a.hd;
  a.in_cache = a.pos >= 0 && a.pos < bmeta(c, kb, B_D0) * bmeta(c, kb, B_D0 + 1);
  // shared memory: qs [ATT_NB][hd] | redm [AMK_WARPS][ATT_NB] | part [4 * AMK_THREADS] | sc [nb][n] (| ks | vs)
  a.qs = c.smem;
  a.redm = a.qs + ATT_NB * a.hd;
  a.part = a.redm + AMK_WARPS * ATT_NB;
  a.sc = a.part + 4 * AMK_THREADS;
  const int room = c.smem_floats - (int)(a.sc - c.smem);
  a.nb_fit = room / max(a.n, 1);
  a.ld = a.hd + 4;
  a.ks = a.vs = nullptr;
  a.staged = false;
#if AMK_ATT_STAGE
  const int nbt = min(a.h1 - a.h0, ATT_NB);
  const int sc_floats = (nbt * a.n + 3) & ~3;
  if (a.in_cache && (a.hd & 3) == 0 && (t[W_FLAGS] & F_KV_STAGE) && a.h1 > a.h0 && a.h0 / a.rep == (a.h1 - 1) / a.rep &&
      sc_floats + 2 * a.n * a.ld <= room) {
    a.staged = true;
    a.nb_fit = nbt;
    a.ks = a.sc + sc_floats;
    a.vs = a.ks + a.n * a.ld;
  }
#endif
  return a;
}


#if AMK_ATT_STAGE
// before the wait (vm.cu): the staged rows of positions first .. pos - 1 in flight to shared memory (one cp.async
// group per thread; the attention waits for it). The general area is free: the previous task ended with a barrier.
__device__ __forceinline__ void att_stage(const Ctx& c, const int* t, bool run) {
  if (!run || t[W_OP] != OP_ATTENTION) return;
  const AttShape a = att_shape(c, t);
  if (!a.staged) return;
  const int hd4 = a.hd >> 2, g = a.h0 / a.rep;
  const float* K = (const float*)buf(c, t[W_IN + 1]) + (size_t)a.first * a.kvd + g * a.hd;
  const float* V = (const float*)buf(c, t[W_IN + 2]) + (size_t)a.first * a.kvd + g * a.hd;
  for (int i = threadIdx.x; i < (a.n - 1) * hd4; i += AMK_THREADS) {
    const int j = i / hd4, d = 4 * (i - j * hd4);
    cp_async16(smem_addr(a.ks + j * a.ld + d), K + (size_t)j * a.kvd + d);
    cp_async16(smem_addr(a.vs + j * a.ld + d), V + (size_t)j * a.kvd + d);
  }
  cp_async_commit();
}
#endif

// one batch loop of mk_attention; STAGED: K / V rows from a.ks / a.vs (att_stage + this step's row), else global
template <bool STAGED, int NB>
__device__ __forceinline__ void attention_heads(const Ctx& c, const int* t, const AttShape& a) {
  const int hd = a.hd, kvd = a.kvd, n = a.n, rep = a.rep, first = a.first;
  const float scale = fbits(t[W_SCALE]);
  const bool hf = c.mode == MODE_HF_BF16;
  const float* q = (const float*)buf(c, t[W_IN + 0]);
  const float* K = (const float*)buf(c, t[W_IN + 1]);
  const float* V = (const float*)buf(c, t[W_IN + 2]);
  float* y = (float*)buf(c, t[W_OUT + 0]);
  float* qs = a.qs;
  float* redm = a.redm;
  float* part = a.part;
  float* sc = a.sc;
  const int hd4 = hd >> 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups = AMK_THREADS / hd4;  // token groups of the p @ v phase (>= 1: hd <= 4 * AMK_THREADS)
  // F_ROPE_BLOCK (rope_order.py): q and the K rows hold each head in blocks of 4 dims + their 4 RoPE partners; the
  // staged score loop reads their 16-byte chunks in the standard dim order (all first-half chunks, then the second
  // half's), so every sum runs in the standard order. Such a task is always staged (mk_attention refuses it
  // otherwise: remapping the global path's K reads costs that loop spills).
  const bool blk = t[W_FLAGS] & F_ROPE_BLOCK;
  const int hd8 = hd >> 3;
  const int grp = threadIdx.x / hd4, d4 = threadIdx.x - grp * hd4;
  for (int h0 = a.h0; h0 < a.h1;) {
    const int g = h0 / rep;
    int nb = min(min(a.h1, (g + 1) * rep) - h0, min(NB, a.nb_fit));  // heads of group g done together
    const float* Kg = K + (size_t)first * kvd + g * hd;
    const float* Vg = V + (size_t)first * kvd + g * hd;
    __syncthreads();  // the previous batch is done with qs / sc / part
    for (int i = threadIdx.x; i < nb * hd; i += AMK_THREADS) qs[i] = ld_act(q + h0 * hd + i);
    if (STAGED && h0 == a.h0) {
      // this step's row (written by this step's append, read after the wait), from the last threads (q: the first)
      const int i = AMK_THREADS - 1 - threadIdx.x;
      if (i < 2 * hd4) {
        const float* src = (i < hd4 ? Kg : Vg) + (size_t)(n - 1) * kvd;
        float* dst = (i < hd4 ? a.ks : a.vs) + (n - 1) * a.ld;
        const int d = 4 * (i < hd4 ? i : i - hd4);
        *(float4*)(dst + d) = ld_act4((const float4*)(src + d));
      }
      cp_async_wait_all();  // this thread's staged rows
    }
    __syncthreads();
    // scores: thread j holds token j's scores for the nb heads
    float mloc[NB];
#pragma unroll
    for (int h = 0; h < NB; ++h) mloc[h] = -INFINITY;
    for (int j = threadIdx.x; j < n; j += AMK_THREADS) {
      float s[NB];
#pragma unroll
      for (int h = 0; h < NB; ++h) s[h] = 0.f;
      // q . k of the nb heads: the dims in increasing order, 4 per float4 (both paths add alike); e: the chunk of q
      // and of the K row that holds them (rope_block: not the standard chunk)
      auto dot4 = [&](const float4& kv, int e) {
#pragma unroll
        for (int h = 0; h < NB; ++h) {
          if (h >= nb) break;
          const float4 qv = *(const float4*)(qs + h * hd + 4 * e);
          s[h] = fmaf(qv.x, kv.x, s[h]); s[h] = fmaf(qv.y, kv.y, s[h]);
          s[h] = fmaf(qv.z, kv.z, s[h]); s[h] = fmaf(qv.w, kv.w, s[h]);
        }
      };
      if (STAGED) {  // shared memory: one float4 at a time (no registers for loads in flight)
        const float4* kr = (const float4*)(a.ks + j * a.ld);
        if (blk) {  // standard chunk e is stored chunk 2e (first half) or 2(e - hd/8) + 1, in q and K alike
          for (int e = 0; e < hd8; ++e) dot4(kr[2 * e], 2 * e);
          for (int e = 0; e < hd8; ++e) dot4(kr[2 * e + 1], 2 * e + 1);
        } else {
          for (int e = 0; e < hd4; ++e) dot4(kr[e], e);
        }
      } else {
        const float4* kr = (const float4*)(Kg + (size_t)j * kvd);
        for (int e = 0; e < hd4; e += 8) {
          float4 kv[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) kv[u] = e + u < hd4 ? ld_act4(kr + e + u) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            if (e + u >= hd4) break;
            dot4(kv[u], e + u);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < NB; ++h) {
        if (h >= nb) break;
        const float v = hf ? bf16r(bf16r(s[h]) * scale) : s[h] * scale;
        sc[h * n + j] = v;
        mloc[h] = fmaxf(mloc[h], v);
      }
    }
    // block max per head
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      const float m = warp_max(mloc[h]);
      if (lane == 0) redm[warp * ATT_NB + h] = m;
    }
    __syncthreads();
    float m[NB], sum[NB];
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      float v = -INFINITY;
      for (int w = 0; w < AMK_WARPS; ++w) v = fmaxf(v, redm[w * ATT_NB + h]);
      m[h] = v;
      sum[h] = 0.f;
    }
    for (int j = threadIdx.x; j < n; j += AMK_THREADS) {
#pragma unroll
      for (int h = 0; h < NB; ++h) {
        if (h >= nb) break;
        const float e = expf(sc[h * n + j] - m[h]);
        sc[h * n + j] = e;
        sum[h] += e;
      }
    }
    __syncthreads();  // every thread has read redm (the maxima) before it is reused for the sums
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      const float v = warp_sum(sum[h]);
      if (lane == 0) redm[warp * ATT_NB + h] = v;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      float v = 0.f;
      for (int w = 0; w < AMK_WARPS; ++w) v += redm[w * ATT_NB + h];
      sum[h] = v;
    }
    for (int j = threadIdx.x; j < n; j += AMK_THREADS) {
#pragma unroll
      for (int h = 0; h < NB; ++h) {
        if (h >= nb) break;
        sc[h * n + j] = rnd(c, sc[h * n + j] / sum[h]);
      }
    }
    __syncthreads();
    // p @ v: thread (grp, d4) sums tokens grp, grp + groups, ... for dims 4*d4 .. 4*d4+3 of every head
    float4 acc[NB];
#pragma unroll
    for (int h = 0; h < NB; ++h) acc[h] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (grp < groups) {
      // tokens grp, grp + groups, ... in bursts of 4 loads in flight (the last burst guarded: a short context
      // costs one round trip, not one per token); each thread adds its tokens in increasing order
      auto pv = [&](const float4& vv, int jj) {
#pragma unroll
        for (int h = 0; h < NB; ++h) {
          if (h >= nb) break;
          const float p = sc[h * n + jj];
          acc[h].x = fmaf(p, vv.x, acc[h].x); acc[h].y = fmaf(p, vv.y, acc[h].y);
          acc[h].z = fmaf(p, vv.z, acc[h].z); acc[h].w = fmaf(p, vv.w, acc[h].w);
        }
      };
      if (STAGED) {
        for (int j = grp; j < n; j += groups) pv(*(const float4*)(a.vs + j * a.ld + 4 * d4), j);
      } else {
        const float* Vd = Vg + 4 * d4;
        for (int j = grp; j < n; j += 4 * groups) {
          float4 vv[4];
#pragma unroll
          for (int u = 0; u < 4; ++u)
            vv[u] = j + u * groups < n ? ld_act4((const float4*)(Vd + (size_t)(j + u * groups) * kvd))
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            if (j + u * groups >= n) break;
            pv(vv[u], j + u * groups);
          }
        }
      }
    }
    // the groups' partial sums meet in shared memory, one head at a time
#pragma unroll
    for (int h = 0; h < NB; ++h) {
      if (h >= nb) break;
      __syncthreads();  // part is free (previous head summed)
      if (grp < groups) *(float4*)(part + 4 * (grp * hd4 + d4)) = acc[h];
      __syncthreads();
      for (int d = threadIdx.x; d < hd; d += AMK_THREADS) {
        float s = 0.f;
        for (int k = 0; k < groups; ++k) s += part[k * hd + d];
        y[(h0 + h) * hd + d] = rnd(c, s);
      }
    }
    h0 += nb;
  }
}

__device__ void mk_attention(const Ctx& c, const int* t) {
  const AttShape a = att_shape(c, t);
  if (!a.in_cache) {
    if (threadIdx.x == 0) atomicOr(c.control + C_ERROR, E_POSITION);
    return;
  }
  if (a.nb_fit < 1 || (a.hd & 3)) {
    if (threadIdx.x == 0) atomicOr(c.control + C_ERROR, E_SCORES);
    return;
  }
#if AMK_ATT_STAGE
  if (a.staged) {  // one head (attention_q_heads_per_task = 1): one score slot, the same sums as slot 0 of eight
    if (AMK_ATT_NB1 && a.h1 - a.h0 == 1) attention_heads<true, 1>(c, t, a);
    else attention_heads<true, ATT_NB>(c, t, a);
    return;
  }
#endif
  if (t[W_FLAGS] & F_ROPE_BLOCK) {  // blocked K rows are read only through the staging (CudaVM checks the fit)
    if (threadIdx.x == 0) atomicOr(c.control + C_ERROR, E_ROPE_BLOCK);
    return;
  }
  attention_heads<false, ATT_NB>(c, t, a);
}
