"""Attention forward (``o = softmax(scale * q k^T [causal]) v``): dimensions, seeded inputs, work and the
yardsticks (torch SDPA as torch picks its backend, SDPA pinned to its flash backend, cuDNN through SDPA,
flash-attn-4). The float64 oracle is
:mod:`mosaic.oracle.attention`.

Shape: ``batch x seq x heads x head_dim`` (``--shape`` order), plus ``kv_heads`` (grouped-query attention:
``heads`` must be a multiple; default ``heads``) and ``causal=1`` (bottom-right aligned, as
FlashAttention; default 0, non-causal). Arrays are in the oracle's layout: ``q`` (batch, heads, seq,
head_dim), ``k`` and ``v`` (batch, kv_heads, seq, head_dim), ``o`` like ``q`` -- torch SDPA's layout; a
kernel that takes (batch, seq, heads, head_dim), as jax's and flash-attn's do, transposes in its backend.
A causal problem's inputs carry ``causal`` (a 0-d boolean array) for the oracle. The scale is
1/sqrt(head_dim) everywhere (the oracle's, SDPA's and flash-attn's default).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mosaic.families import inputs as dist
from mosaic.families.torch_call import TorchCall
from mosaic.records import Family, Yardstick

DIMS = ("batch", "seq", "heads", "head_dim")
OPTIONAL = {"kv_heads": "key/value heads for grouped-query attention; heads must be a multiple (default heads)",
            "causal": "1: causal mask, bottom-right aligned (default 0: none)"}
DTYPES = ("bf16", "f16", "f32")
DISTRIBUTIONS = ("normal", "int", "large", "equal-rows", "denormal")
FLOOR = ("max(4*batch*heads*seq^2*head_dim [x (seq+1)/(2 seq) causal] / peak, "
         "e*2*batch*seq*head_dim*(heads + kv_heads) / bandwidth)")
#: the shared score component of the ``large`` inputs (q[..., 0] = +-LARGE_Q, k[..., 0] = LARGE_Q)
LARGE_Q = 64.0


def canonical(shape: Mapping[str, int]) -> dict[str, int]:
    """Check ``kv_heads`` and ``causal``; drop them where they hold their default."""
    out = dict(shape)
    heads = out["heads"]
    kv = out.get("kv_heads", heads)
    if kv < 1 or heads % kv:
        raise ValueError(f"attention kv_heads={kv} must be a positive divisor of heads={heads}")
    if out.get("causal", 0) not in (0, 1):
        raise ValueError(f"attention causal={out['causal']} must be 0 or 1")
    if kv == heads:
        out.pop("kv_heads", None)
    if out.get("causal") == 0:
        del out["causal"]
    return out


def work(shape: Mapping[str, int], e: float) -> tuple[float, float]:
    """(FLOPs, bytes): QK^T and PV, 2 * 2 * b * h * s^2 * d (a causal mask keeps s(s+1)/2 of the s^2 scores);
    q and k, v (kv_heads of them) read once and o written once."""
    b, s, h, d = shape["batch"], shape["seq"], shape["heads"], shape["head_dim"]
    kv = shape.get("kv_heads", h)
    pairs = s * (s + 1) / 2 if shape.get("causal", 0) else float(s) * s
    return 4.0 * b * h * pairs * d, e * 2.0 * b * s * d * (h + kv)


def make_inputs(shape: Mapping[str, int], dtype: str, seed: int, values: str) -> dict:
    """Seeded ``q``, ``k``, ``v`` (and ``causal`` for a causal problem) representable in ``dtype``.

    ``large``: every score carries an offset of +-64*64/sqrt(head_dim) (512 at head_dim 64; one sign per
    query row, through a shared first component of q and k) -- beyond exp's fp32 range, so a kernel that
    does not subtract the running maximum overflows -- while the spread of a row stays normal; ``v`` has
    magnitude up to 2^(e+1) with seq such values below a quarter of fp32's range and inside the output
    format (e = 113 for bf16 at seq 4096, 13 for f16).
    ``equal-rows``: all keys of a head equal, so every query's weights are exactly uniform and ``o`` is the
    mean of the visible values.
    ``denormal``: ``v`` subnormal (q, k normal): for f16 the outputs are then f16 subnormals far above the
    oracle's absolute floor of 2^-126, so a kernel that flushes ``v`` fails; for bf16 and f32 every
    subnormal is below that floor and the case checks only that no NaN or inf appears.
    """
    import numpy as np

    from mosaic.oracle.formats import ACCUMULATOR, fmt

    b, s, h, d = shape["batch"], shape["seq"], shape["heads"], shape["head_dim"]
    kv = shape.get("kv_heads", h)
    rng = np.random.default_rng(seed)
    f = fmt(dtype)
    qs, ks = (b, h, s, d), (b, kv, s, d)
    if values == "int":
        q, k, v = dist.small_ints(rng, qs), dist.small_ints(rng, ks), dist.small_ints(rng, ks)
    elif values == "large":
        q, k = dist.normal(rng, qs, f), dist.normal(rng, ks, f)
        q[..., 0] = np.where(rng.random((b, h, s)) < 0.5, -LARGE_Q, LARGE_Q)
        k[..., 0] = LARGE_Q
        e = dist.large_exponent(f, (ACCUMULATOR.emax, math.log2(s), 1), (f.emax, 0, 1))
        v = dist.magnitude(rng, ks, f, e)
    elif values == "equal-rows":
        q = dist.normal(rng, qs, f)
        k = np.ascontiguousarray(np.broadcast_to(dist.normal(rng, (b, kv, 1, d), f), ks))
        v = dist.normal(rng, ks, f)
    elif values == "denormal":
        q, k, v = dist.normal(rng, qs, f), dist.normal(rng, ks, f), dist.subnormal(rng, ks, f)
    else:
        q, k, v = dist.normal(rng, qs, f), dist.normal(rng, ks, f), dist.normal(rng, ks, f)
    out = {"q": q, "k": k, "v": v}
    if shape.get("causal", 0):
        out["causal"] = np.array(True)
    return out


def _causal(inputs: Mapping[str, Any]) -> bool:
    return bool(inputs["causal"]) if "causal" in inputs else False


def torch_sdpa(inputs: Mapping[str, Any], dtype: str, device: str = "cuda", backend: str | None = None) -> TorchCall:
    """``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=, enable_gqa=)``; ``backend``
    (``"cudnn"``, ``"flash"``, ``"efficient"``, ``"math"``) pins one of torch's implementations."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    causal = _causal(inputs)
    gqa = "q" in inputs and "k" in inputs and inputs["q"].shape[1] != inputs["k"].shape[1]
    pinned = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    if backend is not None and backend not in pinned:
        raise ValueError(f"SDPA backend {backend!r}; known: {', '.join(pinned)}")

    def call(q, k, v):
        if backend is None:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        with sdpa_kernel([pinned[backend]]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return TorchCall(call, inputs, ("q", "k", "v"), dtype, "o", device, what="torch SDPA yardstick")


def cudnn_sdpa(inputs: Mapping[str, Any], dtype: str, device: str = "cuda") -> TorchCall:
    """torch SDPA pinned to cuDNN's fused attention (``SDPBackend.CUDNN_ATTENTION``; GPU only)."""
    return torch_sdpa(inputs, dtype, device, backend="cudnn")


def flash_sdpa(inputs: Mapping[str, Any], dtype: str, device: str = "cuda") -> TorchCall:
    """torch SDPA pinned to its FlashAttention-2 backend (``SDPBackend.FLASH_ATTENTION``; GPU only)."""
    return torch_sdpa(inputs, dtype, device, backend="flash")


def flash_attn_4(inputs: Mapping[str, Any], dtype: str, device: str = "cuda") -> TorchCall:
    """flash-attn-4's CuTe DSL forward, ``flash_attn.cute.flash_attn_func(q, k, v, causal=)`` on
    (batch, seq, heads, head_dim) tensors: the inputs are transposed into that layout once, before timing,
    and the output back when it is read."""
    from flash_attn.cute import flash_attn_func

    causal = _causal(inputs)

    def call(q, k, v):
        return flash_attn_func(q, k, v, causal=causal)

    def first(result):
        out = result[0] if isinstance(result, tuple) else result
        return out.transpose(1, 2)

    return TorchCall(call, inputs, ("q", "k", "v"), dtype, "o", device, what="flash-attn-4 yardstick",
                     to_output=first, arrange=lambda t: t.transpose(1, 2))


YARDSTICKS = (
    Yardstick("torch-sdpa", "torch.nn.functional.scaled_dot_product_attention (torch picks flash, cuDNN or "
              "memory-efficient)", "torch", ("bf16", "f16", "f32"), torch_sdpa,
              call="torch.nn.functional.scaled_dot_product_attention", title="torch SDPA"),
    Yardstick("sdpa-flash", "torch SDPA pinned to its FlashAttention-2 backend (SDPBackend.FLASH_ATTENTION)",
              "torch", ("bf16", "f16"), flash_sdpa, requires="a CUDA GPU of sm_80 or later",
              call="torch.nn.functional.scaled_dot_product_attention[FLASH_ATTENTION]", title="flash SDPA"),
    Yardstick("cudnn", "torch SDPA pinned to cuDNN fused attention (SDPBackend.CUDNN_ATTENTION)", "torch",
              ("bf16", "f16"), cudnn_sdpa, requires="a CUDA GPU with cuDNN >= 9",
              call="torch.nn.functional.scaled_dot_product_attention[CUDNN_ATTENTION]", title="cuDNN SDPA"),
    Yardstick("flash-attn-4", "flash_attn.cute.flash_attn_func: FlashAttention 4 in CuTe DSL", "flash-attn-4",
              ("bf16", "f16"), flash_attn_4, requires="sm_90a or sm_100a; nvidia-cutlass-dsl",
              call="flash_attn.cute.flash_attn_func", title="FlashAttention-4"),
)

FAMILY = Family("attention", "o = softmax(q k^T / sqrt(head_dim) [causal]) v, grouped-query heads, forward",
                DIMS, work, floor=FLOOR, optional_dims=OPTIONAL, canonical=canonical, dtypes=DTYPES,
                distributions=DISTRIBUTIONS, make_inputs=make_inputs, oracle="attention", yardsticks=YARDSTICKS,
                example={"batch": 1, "seq": 32, "heads": 4, "head_dim": 16, "kv_heads": 2, "causal": 1})
