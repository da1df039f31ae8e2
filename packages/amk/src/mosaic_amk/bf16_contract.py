"""The ``hf-bf16`` rounding contract (docs/amk-cuda.md "Precision contract") as a whole-sequence float32 torch
forward of a Llama checkpoint whose rounding points can be switched one by one.

Every value is float32; ``R(x)`` rounds to bf16 (round to nearest even) and back. The contract rounds at the
points of ``POINTS``, which are where transformers' bf16 eager Llama rounds (its tensors are bf16 there):

- ``linear``: every q/k/v/o/gate/up/down output; ``logits``: the lm_head output
- ``residual``: both residual sums of each layer
- ``norm_x`` / ``norm_w``: RMSNorm's normalised value, and its product with the weight
- ``rope_cs`` / ``rope_ops``: RoPE's cos/sin tables, and each product and the sum
- ``qk`` / ``scale``: the attention scores after ``q.k`` and after ``* scale``; ``probs``: the (float32) softmax
  output; ``pv``: ``p @ v``
- ``silu`` / ``gateup``: SiLU's output, and its product with ``up``

``rounded=frozenset()`` is float32 arithmetic on the (bf16) weights, i.e. HF float32 on those weights up to
summation order. ``order_seed`` permutes the summed axis of every linear, of ``q.k`` and of ``p @ v`` (the
same permutation for both operands: the same sum, another summation order): a bf16 run of the same contract
that differs from another only where float32 sums differ in their last bits -- the seed ensemble measures
how far such runs land from each other (a bf16 rounding flipped early moves every later position through the
residual stream and the KV cache). ``permuted_weights`` does the same for any implementation: an equivalent
checkpoint whose linears sum in another order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

POINTS = ("linear", "residual", "norm_x", "norm_w", "rope_cs", "rope_ops", "qk", "scale", "probs", "pv", "silu",
          "gateup", "logits")
CONTRACT = frozenset(POINTS)  # the CUDA VM's hf-bf16 mode = transformers' bf16 eager Llama


def load_weights(model_dir: str | Path) -> dict[str, np.ndarray]:
    """The checkpoint's tensors as float32 (bf16 values for a ``bf16_weights=True`` checkpoint)."""
    from safetensors.numpy import load_file

    w: dict[str, np.ndarray] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        w.update({k: v.astype(np.float32) for k, v in load_file(str(f)).items()})
    return w


def permuted_weights(weights: Mapping[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The same Llama with its residual-stream dims and each layer's MLP intermediate dims permuted (seeded): RMSNorm
    and the attention see the same values, so the model is the same function, but every linear sums over its input
    in another order -- any implementation (transformers, the CUDA VM) run on it is another summation order of
    itself. Other tensors (``rope.inv_freq``) pass unchanged; a checkpoint with linear biases is refused."""
    if any(k.endswith("_proj.bias") for k in weights):
        raise ValueError("a checkpoint with linear biases: permuted_weights does not permute them")
    emb = weights["model.embed_tokens.weight"]
    rng = np.random.default_rng(seed)
    ph = rng.permutation(emb.shape[1])
    cols = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")
    out: dict[str, np.ndarray] = {}
    for k, v in weights.items():
        if k in ("model.embed_tokens.weight", "lm_head.weight") or k.endswith(cols):
            out[k] = np.ascontiguousarray(v[:, ph])
        elif k.endswith("layernorm.weight") or k == "model.norm.weight":
            out[k] = np.ascontiguousarray(v[ph])
        elif k.endswith(("o_proj.weight", "down_proj.weight")):
            out[k] = np.ascontiguousarray(v[ph])
        else:
            out[k] = v
    for lay in sorted({k.rsplit(".mlp.", 1)[0] for k in weights if ".mlp.gate_proj." in k}):
        pi = rng.permutation(weights[f"{lay}.mlp.gate_proj.weight"].shape[0])
        for n in ("gate_proj", "up_proj"):
            out[f"{lay}.mlp.{n}.weight"] = np.ascontiguousarray(out[f"{lay}.mlp.{n}.weight"][pi])
        out[f"{lay}.mlp.down_proj.weight"] = np.ascontiguousarray(out[f"{lay}.mlp.down_proj.weight"][:, pi])
    return out


def check_points(rounded: Iterable[str]) -> frozenset:
    r = frozenset(rounded)
    bad = sorted(r - CONTRACT)
    if bad:
        raise ValueError(f"unknown rounding point(s) {bad}; known: {', '.join(POINTS)}")
    return r


def forward_nll(spec, weights: Mapping[str, np.ndarray], ids: Sequence[int], rounded: Iterable[str] = CONTRACT,
                order_seed: int | None = None, threads: int | None = None, device: str = "cpu") -> np.ndarray:
    """Teacher-forced per-prediction NLL (float64, ``len(ids) - 1`` values) of ``ids``: :func:`forward_logits`'s
    ``-log softmax`` at each next token."""
    return forward_logits(spec, weights, ids, rounded, order_seed, threads, device, nll=True)


def forward_logits(spec, weights: Mapping[str, np.ndarray], ids: Sequence[int], rounded: Iterable[str] = CONTRACT,
                   order_seed: int | None = None, threads: int | None = None, device: str = "cpu",
                   nll: bool = False, layers: int | None = None) -> np.ndarray:
    """The float32 logits ``[len(ids), vocab]`` of the whole sequence (one forward, causal) under the contract with
    the rounding points ``rounded`` (``nll``: the per-prediction NLL in float64 instead; ``layers``: only the
    first ``layers`` decoder layers, then the final norm and the LM head); ``spec`` is ``importer.import_checkpoint`` of the same checkpoint (its
    shape, eps and inv_freq; RoPE tables as ``ops.rope_tables`` builds them, the CUDA VM's host table).
    ``device``: a torch device (float32 matmuls stay float32: TF32 is switched off for the call)."""
    import torch

    from mosaic_amk.model import INV_FREQ
    from mosaic_amk.ops import rope_tables

    rounded = check_points(rounded)
    if threads:
        torch.set_num_threads(threads)
    L, nh, nkv, hd = layers or spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim
    rep, T = nh // nkv, len(ids)
    gen = torch.Generator().manual_seed(order_seed) if order_seed is not None else None

    def R(x, point):
        return x.to(torch.bfloat16).to(torch.float32) if point in rounded else x

    def perm(n):
        return torch.randperm(n, generator=gen).to(device) if gen is not None else None

    W = {k: torch.from_numpy(v).to(device) for k, v in weights.items()}

    def lin(name, x, point="linear"):
        w = W[name]
        p = perm(w.shape[1])
        if p is not None:
            w, x = w[:, p], x[:, p]
        return R(x @ w.T, point)

    eps = float(spec.rms_norm_eps)

    def norm(x, name):
        var = x.pow(2).mean(-1, keepdim=True)
        return R(W[name] * R(x * torch.rsqrt(var + eps), "norm_x"), "norm_w")

    inv = np.asarray(spec.weights[INV_FREQ], np.float32)
    scaling = float(spec.attention_scaling)
    tabs = [rope_tables(inv, p, scaling) for p in range(T)]
    cos = R(torch.from_numpy(np.stack([c for c, _ in tabs])).to(device), "rope_cs")[:, None, :]  # [T, 1, hd]
    sin = R(torch.from_numpy(np.stack([s for _, s in tabs])).to(device), "rope_cs")[:, None, :]
    half = hd // 2

    def rope(x):  # x [T, heads, hd]
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return R(R(x * cos, "rope_ops") + R(rot * sin, "rope_ops"), "rope_ops")

    scale = torch.tensor(hd ** -0.5, dtype=torch.float32, device=device)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)

    def layers():
        x = W["model.embed_tokens.weight"][torch.tensor(list(ids), dtype=torch.long, device=device)]
        for i in range(L):
            p = f"model.layers.{i}."
            xn = norm(x, p + "input_layernorm.weight")
            q = rope(lin(p + "self_attn.q_proj.weight", xn).reshape(T, nh, hd))
            k = rope(lin(p + "self_attn.k_proj.weight", xn).reshape(T, nkv, hd))
            v = lin(p + "self_attn.v_proj.weight", xn).reshape(T, nkv, hd)
            qh = q.permute(1, 0, 2)  # [nh, T, hd]
            kh = k.permute(1, 0, 2).repeat_interleave(rep, dim=0)
            vh = v.permute(1, 0, 2).repeat_interleave(rep, dim=0)
            pd = perm(hd)
            if pd is not None:
                qh, kh = qh[..., pd], kh[..., pd]
            s = R(R(qh @ kh.transpose(1, 2), "qk") * scale, "scale").masked_fill(mask, float("-inf"))
            pr = R(torch.softmax(s, dim=-1), "probs")
            pt = perm(T)
            if pt is not None:
                pr, vh = pr[..., pt], vh[:, pt]
            y = R(pr @ vh, "pv").permute(1, 0, 2).reshape(T, nh * hd)
            x = R(x + lin(p + "self_attn.o_proj.weight", y), "residual")
            xn = norm(x, p + "post_attention_layernorm.weight")
            g, u = lin(p + "mlp.gate_proj.weight", xn), lin(p + "mlp.up_proj.weight", xn)
            m = R(R(torch.nn.functional.silu(g), "silu") * u, "gateup")
            x = R(x + lin(p + "mlp.down_proj.weight", m), "residual")
        logits = lin(spec.lm_head_name, norm(x, "model.norm.weight"), "logits")
        if not nll:
            return logits.cpu().numpy()
        logits = logits[:-1].double()
        tgt = torch.tensor(list(ids[1:]), dtype=torch.long, device=device)
        return (torch.logsumexp(logits, dim=-1) - logits[torch.arange(T - 1, device=device), tgt]).cpu().numpy()

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            return layers()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
