"""The AMK micro-ops: their signatures (arity, parameters, written region) and their numpy float32
semantics. This module is the single source of truth: the ReferenceVM executes these functions, the
validator reads the signatures, and the CUDA VM's micro-kernels are tested against them.

Conventions (documented in docs/amk.md):

- Every buffer is a dense row-major array. Activations are 1-D ``[n]``; weights keep their checkpoint
  shape (``[out, in]`` for a projection); a KV cache is ``[num_pages, page_tokens, kv_dim]``.
- A task with ``row_start``/``row_end`` parameters writes only rows ``[row_start, row_end)`` of dimension
  0 of its output; tasks whose row ranges are disjoint therefore never write the same element.
- ``kv_append`` and ``rope_append`` write exactly one cache slot: token ``position`` (page
  ``position // page_tokens``, slot ``position % page_tokens``); ``attention`` reads slots
  ``[0, position]`` (or the last ``window`` of them when ``window > 0``).
- Every other task writes its whole output.
- Reductions accumulate in float32 unless stated; the ReferenceVM is float32 end to end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

F32 = np.float32


@attrs.frozen
class OpSpec:
    """The signature of one op.

    ``inputs``/``outputs`` name the positional buffer roles; ``optional`` adds input roles when a boolean
    parameter is true (in the order listed, after ``inputs``); ``params`` are required parameter names;
    ``writes`` is ``"all"``, ``"rows"`` (rows ``[row_start, row_end)`` of output 0) or ``"kv_slot"``
    (one cache slot at ``position``)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[str, ...]
    optional: tuple[tuple[str, str], ...] = ()
    writes: str = "all"
    doc: str = ""

    def input_roles(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        extra = tuple(role for flag, role in self.optional if params.get(flag))
        return self.inputs + extra


_GEMV_PARAMS = ("row_start", "row_end", "bias", "residual")
_ATTN_PARAMS = ("position", "num_heads", "num_kv_heads", "head_dim", "row_start", "row_end", "window",
                "scale", "page_tokens")
_ROPE_PARAMS = ("position", "num_heads", "head_dim", "attention_scaling")

SPECS: dict[str, OpSpec] = {s.name: s for s in (
    OpSpec("embed", ("table", "token"), ("x",), (), doc="x = table[token[0]]"),
    OpSpec("rmsnorm", ("x", "weight"), ("y",), ("eps",),
           doc="y = weight * (x * rsqrt(mean(x^2) + eps))"),
    OpSpec("gemv", ("x", "w"), ("y",), _GEMV_PARAMS, optional=(("bias", "b"), ("residual", "res")),
           writes="rows", doc="y[r] = res[r] + (w[r] @ x + b[r]) for r in [row_start, row_end)"),
    OpSpec("gemv_silu_mul", ("x", "w_gate", "w_up"), ("y",), ("row_start", "row_end", "bias"),
           optional=(("bias", "b_gate"), ("bias", "b_up")), writes="rows",
           doc="y[r] = silu(w_gate[r] @ x + b_gate[r]) * (w_up[r] @ x + b_up[r])"),
    OpSpec("silu_mul", ("gate", "up"), ("y",), (), doc="y = silu(gate) * up"),
    OpSpec("add", ("a", "b"), ("y",), (), doc="y = a + b"),
    OpSpec("rope", ("x", "inv_freq"), ("y",), _ROPE_PARAMS,
           doc="rotate-half RoPE of each head of x at `position`"),
    OpSpec("kv_append", ("x",), ("cache",), ("position", "page_tokens"), writes="kv_slot",
           doc="cache[position // page_tokens, position % page_tokens] = x"),
    OpSpec("rope_append", ("x", "inv_freq"), ("cache",), (*_ROPE_PARAMS, "page_tokens"), writes="kv_slot",
           doc="kv_append(rope(x))"),
    OpSpec("attention", ("q", "k_cache", "v_cache"), ("y",), _ATTN_PARAMS, writes="rows",
           doc="decode attention of heads row_start/head_dim .. row_end/head_dim over cached tokens"),
    OpSpec("argmax", ("logits",), ("token",), (), doc="token[0] = first index of max(logits)"),
)}


def spec(op: str) -> OpSpec | None:
    """The signature of ``op``, or None for an unknown op."""
    return SPECS.get(op)


# ---------------------------------------------------------------------------------------------- semantics

def _rows(params: Mapping[str, Any]) -> slice:
    return slice(int(params["row_start"]), int(params["row_end"]))


def op_embed(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], p: Mapping[str, Any]) -> None:
    table, token = ins
    outs[0][...] = table[int(token[0])]


def op_rmsnorm(ins, outs, p) -> None:
    x, w = ins
    x = x.astype(F32, copy=False)
    var = np.mean(x * x, dtype=F32)
    outs[0][...] = w * (x * (F32(1.0) / np.sqrt(var + F32(p["eps"]), dtype=F32)))


def op_gemv(ins, outs, p) -> None:
    x, w = ins[0], ins[1]
    r = _rows(p)
    y = w[r] @ x
    k = 2
    if p.get("bias"):
        y = y + ins[k][r]
        k += 1
    if p.get("residual"):
        y = ins[k][r] + y
    outs[0][r] = y


def _silu(v: np.ndarray) -> np.ndarray:
    return v / (F32(1.0) + np.exp(-v, dtype=F32))


def op_gemv_silu_mul(ins, outs, p) -> None:
    x, wg, wu = ins[:3]
    r = _rows(p)
    g = wg[r] @ x
    u = wu[r] @ x
    if p.get("bias"):
        g = g + ins[3][r]
        u = u + ins[4][r]
    outs[0][r] = _silu(g) * u


def op_silu_mul(ins, outs, p) -> None:
    outs[0][...] = _silu(ins[0]) * ins[1]


def op_add(ins, outs, p) -> None:
    outs[0][...] = ins[0] + ins[1]


def rope_tables(inv_freq: np.ndarray, position: int, attention_scaling: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of shape [head_dim] as HF computes them: freqs = position * inv_freq in float32,
    emb = cat(freqs, freqs), cos = cos(emb) * attention_scaling."""
    freqs = F32(position) * inv_freq.astype(F32)
    emb = np.concatenate([freqs, freqs])
    cos = np.cos(emb.astype(np.float64)).astype(F32) * F32(attention_scaling)
    sin = np.sin(emb.astype(np.float64)).astype(F32) * F32(attention_scaling)
    return cos, sin


def _rope(x: np.ndarray, inv_freq: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    nh, hd = int(p["num_heads"]), int(p["head_dim"])
    cos, sin = rope_tables(inv_freq, int(p["position"]), float(p["attention_scaling"]))
    h = x.reshape(nh, hd)
    half = hd // 2
    rot = np.concatenate([-h[:, half:], h[:, :half]], axis=1)
    return (h * cos + rot * sin).reshape(-1)


def op_rope(ins, outs, p) -> None:
    outs[0][...] = _rope(ins[0], ins[1], p)


def _slot(p: Mapping[str, Any]) -> tuple[int, int]:
    pos, page = int(p["position"]), int(p["page_tokens"])
    return pos // page, pos % page


def op_kv_append(ins, outs, p) -> None:
    outs[0][_slot(p)] = ins[0]


def op_rope_append(ins, outs, p) -> None:
    outs[0][_slot(p)] = _rope(ins[0], ins[1], p)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True), dtype=F32)
    return e / e.sum(axis=-1, keepdims=True, dtype=F32)


def op_attention(ins, outs, p) -> None:
    q, kc, vc = ins
    pos, hd = int(p["position"]), int(p["head_dim"])
    nh, nkv = int(p["num_heads"]), int(p["num_kv_heads"])
    window = int(p["window"])
    rep = nh // nkv
    first = max(0, pos - window + 1) if window > 0 else 0
    n = pos + 1
    kv_dim = kc.shape[-1]
    keys = kc.reshape(-1, kv_dim)[first:n].reshape(n - first, nkv, hd)
    vals = vc.reshape(-1, kv_dim)[first:n].reshape(n - first, nkv, hd)
    h0, h1 = int(p["row_start"]) // hd, int(p["row_end"]) // hd
    scale = F32(p["scale"])
    out = outs[0]
    for h in range(h0, h1):
        g = h // rep
        qh = q[h * hd:(h + 1) * hd]
        scores = (keys[:, g, :] @ qh) * scale
        probs = _softmax(scores)
        out[h * hd:(h + 1) * hd] = probs @ vals[:, g, :]


def op_argmax(ins, outs, p) -> None:
    outs[0][0] = int(np.argmax(ins[0]))


KERNELS: dict[str, Callable[[Sequence[np.ndarray], Sequence[np.ndarray], Mapping[str, Any]], None]] = {
    "embed": op_embed, "rmsnorm": op_rmsnorm, "gemv": op_gemv, "gemv_silu_mul": op_gemv_silu_mul,
    "silu_mul": op_silu_mul, "add": op_add, "rope": op_rope, "kv_append": op_kv_append,
    "rope_append": op_rope_append, "attention": op_attention, "argmax": op_argmax,
}
assert set(KERNELS) == set(SPECS)
