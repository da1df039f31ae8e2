"""Attention forward oracle: O = softmax(scale * Q K^T [+ causal mask]) V.

q (B, H, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv) with H a multiple of Hkv (grouped-query);
optional ``scale`` (default 1/sqrt(D)) and ``causal`` (bottom-right aligned, as FlashAttention: query i
sees keys j <= i + Sk - Sq). Guard band, for a flash-style kernel (fp32 scores, fp32 softmax, P rounded to
the input format for the second matrix product, fp32 accumulation), with PV = P @ |V| in float64:

    eS_i  = max_j scale * gamma_{D+2}(2^-23) * (|q| @ |k|^T)_ij          score error
    eE_i  = max_j (1 + |z_ij|) 2^-21                                    exp error
    rel_i = 2 eS_i + 2 eE_i + 2 * 2^-p_in + gamma_{2 Sk + 2}(2^-23)     (P rounded in numerator and sum)
    eT_i  = tiny_in/2 * max_j P_ij * (sum_j |V_j| + n_i * PV_i)         P rounded into the input format's subnormals
    band  = PV * rel_i + eT_i + spacing_out/2 + 2^-126

A perturbation d of the scores changes each probability by at most 2|d| relatively, hence the factor 2.
The kernel's unnormalised P = exp(z) lies in (0, 1]; where it is below the input format's smallest normal (f16:
6.1e-5; bf16 has fp32's range) its rounding error is absolute, at most tiny_in/2 per element, in the numerator
and (n_i visible keys) in the sum, both divided by the row's sum, 1 / max_j P_ij. Without eT an f16 kernel fails on
rows whose weights are nearly one-hot (the family's ``int`` inputs): its tail probabilities are f16 subnormals.
"""

from __future__ import annotations

import numpy as np

from mosaic.errors import BadInput
from mosaic.oracle.formats import ACCUMULATOR, Format, gamma
from mosaic.oracle.verdict import Expectation

INPUTS = ("q", "k", "v")
OPTIONAL = ("scale", "causal")
OUTPUTS = ("o",)
SUMMARY = "O = softmax(scale * Q K^T [causal]) V, grouped-query heads, float64 reference"
FORMULA = ("|o-ref| <= (P@|V|)*(2eS + 2eExp + 2*2^-p_in + gamma_{2Sk+2}(2^-23)) "
           "+ tiny_in/2*max(P)*(sum|V| + n*(P@|V|)) + spacing_out/2 + 2^-126")


def reference(inputs: dict[str, np.ndarray], in_fmt: Format, out_fmt: Format) -> dict[str, Expectation]:
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise BadInput(f"attention needs 4-D q, k, v (B, H, S, D); got {q.shape}, {k.shape}, {v.shape}", "inputs")
    b, h, sq, d = q.shape
    bk, hkv, sk, dk = k.shape
    if (bk, dk) != (b, d) or v.shape[:3] != (b, hkv, sk) or hkv == 0 or h % hkv:
        raise BadInput(f"attention: inconsistent shapes q{q.shape} k{k.shape} v{v.shape}", "inputs")
    scale = float(inputs["scale"]) if "scale" in inputs else 1.0 / np.sqrt(d)
    causal = bool(inputs["causal"]) if "causal" in inputs else False
    if causal and sq > sk:
        raise BadInput(f"attention: causal with Sq={sq} > Sk={sk} leaves rows with no keys", "inputs")
    rep = h // hkv
    ref = np.empty((b, h, sq, v.shape[3]))
    err = np.empty_like(ref)
    mask = np.arange(sk)[None, :] > np.arange(sq)[:, None] + (sk - sq) if causal else None
    visible = None if mask is None else (~mask).astype(np.float64)  # None: every key
    n_visible = np.full((sq, 1), float(sk)) if visible is None else visible.sum(axis=-1)[:, None]
    heads = max(1, CHUNK_SCORES // (sq * sk))  # q heads per chunk: the float64 score tensors stay ~1 GiB each
    for bi in range(b):
        for h0 in range(0, h, heads):
            hs = slice(h0, min(h, h0 + heads))
            kv = np.arange(hs.start, hs.stop) // rep
            ref[bi, hs], err[bi, hs] = _rows(q[bi, hs], k[bi, kv], v[bi, kv], scale, mask, visible, n_visible,
                                             in_fmt, d, sk)
    band = err + 0.5 * out_fmt.spacing(np.abs(ref) + err) + 2.0**ACCUMULATOR.emin
    return {"o": Expectation(ref, band, out_fmt, FORMULA)}


#: float64 scores per chunk (2^27: 1 GiB); batch 4 x 32 heads x 4096^2 at once was ~110 GB of temporaries
CHUNK_SCORES = 1 << 27


def _rows(q, k, v, scale, mask, visible, n_visible, in_fmt: Format, d: int, sk: int):
    """Reference and error bound of some heads of one batch entry: q (H', Sq, D), k and v (H', Sk, D) repeated."""
    Q, K, V = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    s = scale * Q @ K.transpose(0, 2, 1)
    s_mag = abs(scale) * np.abs(Q) @ np.abs(K).transpose(0, 2, 1)
    if mask is not None:
        s = np.where(mask, -np.inf, s)
        s_mag = np.where(mask, 0.0, s_mag)
    e_s = (gamma(d + 2) * s_mag).max(axis=-1, keepdims=True)
    del s_mag
    z = s - s.max(axis=-1, keepdims=True)
    del s
    e_exp = np.where(np.isfinite(z), (1 + np.abs(z)) * 2.0**-21, 0.0).max(axis=-1, keepdims=True)
    p = np.exp(z, out=z)
    p /= p.sum(axis=-1, keepdims=True)
    ref = p @ V
    abs_v = np.abs(V)
    pv = p @ abs_v
    rel = 2 * e_s + 2 * e_exp + 2 * in_fmt.unit_roundoff + gamma(2 * sk + 2)
    abs_v_sum = abs_v.sum(axis=-2, keepdims=True) if visible is None else visible @ abs_v  # the visible keys' |v|
    e_tiny = 0.5 * in_fmt.tiny * p.max(axis=-1, keepdims=True) * (abs_v_sum + n_visible * pv)
    return ref, pv * rel + e_tiny
