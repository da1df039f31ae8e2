"""The attention family's float64 oracle rejects the bugs an attention port makes (issue #34's list), in CI.

The outputs come from a float32 flash-attention forward written here the way the kernels compute it: key blocks
of 64, an online softmax with exp2 and the log2(e) fold into the scale, P rounded to the input format before the
P.V product, an fp32 accumulator, GQA head h reading KV head h // (heads / kv_heads). The faithful forward passes
on every input distribution of the family; each planted bug (a dropped causal mask, no rescale of the accumulator
and running sum when the maximum grows, P.V accumulated in bf16, the output written (batch, seq, heads, head_dim)
where the family's layout is (batch, heads, seq, head_dim), KV head h % kv_heads) fails, on a shape where it
matters.
"""

from __future__ import annotations

import numpy as np
import pytest
from mosaic.families.attention import make_inputs
from mosaic.oracle import check
from mosaic.oracle.formats import fmt

F32 = np.float32
LOG2E = 1.4426950408889634
BLOCK_N = 64
MMA_K = 16  # the P.V MMA's k step: a bf16 accumulator is rounded after each


def flash_forward(q, k, v, causal: bool, dtype: str, *, rescale=True, mask=True, pv_bf16=False,
                  head_map="group", layout="bhsd"):
    f = fmt(dtype)
    b, h, s, d = q.shape
    kvh = k.shape[1]
    group = h // kvh
    c = F32(LOG2E / np.sqrt(d))  # the softmax scale folded into exp2's argument
    o = np.zeros(q.shape, F32)
    bf = fmt("bf16")
    for bi in range(b):
        for hi in range(h):
            kv = hi // group if head_map == "group" else hi % kvh
            qq, kk, vv = q[bi, hi].astype(F32), k[bi, kv].astype(F32), v[bi, kv].astype(F32)
            m = np.full(s, -np.inf, F32)
            total = np.zeros(s, F32)
            acc = np.zeros((s, d), F32)
            for n0 in range(0, s, BLOCK_N):
                sc = (qq @ kk[n0:n0 + BLOCK_N].T).astype(F32) * c
                if causal and mask:
                    cols = np.arange(n0, n0 + sc.shape[1])
                    sc = np.where(cols[None, :] > np.arange(s)[:, None], -np.inf, sc).astype(F32)
                m_new = np.maximum(m, sc.max(axis=1))
                alpha = np.exp2(m - m_new).astype(F32) if rescale else np.ones(s, F32)
                p = np.exp2(sc - m_new[:, None]).astype(F32)
                total = (total * alpha + p.sum(axis=1, dtype=F32)).astype(F32)
                acc = (acc * alpha[:, None]).astype(F32)
                pr = f.round(p).astype(F32)  # P in the input format for the second MMA
                if pv_bf16:
                    for k0 in range(0, pr.shape[1], MMA_K):
                        part = pr[:, k0:k0 + MMA_K] @ vv[n0 + k0:n0 + k0 + MMA_K]
                        acc = bf.round((acc + part).astype(np.float64)).astype(F32)
                else:
                    acc = (acc + pr @ vv[n0:n0 + BLOCK_N]).astype(F32)
                m = m_new
            o[bi, hi] = acc / total[:, None]
    if layout == "bshd":  # written as (batch, seq, heads, head_dim), read back in the family's layout
        o = np.ascontiguousarray(o.transpose(0, 2, 1, 3)).reshape(q.shape)
    return f.round(o.astype(np.float64)).astype(F32)


def _inputs(shape: dict, dtype: str, values: str, seed: int = 3) -> dict:
    return make_inputs(shape, dtype, seed, values)


def _verdict(inputs: dict, dtype: str, **bug):
    causal = bool(inputs.get("causal", False))
    o = flash_forward(inputs["q"], inputs["k"], inputs["v"], causal, dtype, **bug)
    return check("attention", inputs, {"o": o}, dtype)


SHAPE = {"batch": 1, "seq": 256, "heads": 4, "head_dim": 64, "kv_heads": 2}


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("values", ["normal", "int", "large", "equal-rows"])
@pytest.mark.parametrize("causal", [0, 1])
def test_the_faithful_forward_passes(dtype, values, causal):
    """f16 on ``int`` inputs failed before the oracle's subnormal term eT (15x the band: nearly one-hot rows put the
    tail probabilities in f16's subnormals)."""
    inputs = _inputs({**SHAPE, "causal": causal}, dtype, values)
    v = _verdict(inputs, dtype)
    assert v.passed, v.reason


# P.V accumulated in bf16 hides inside the band on normal inputs (the output's cancellation leaves |P@V| far
# below P@|V|, which the band scales with); the family's ``int`` inputs (nearly one-hot rows, exact values) show it
@pytest.mark.parametrize("name,shape,values,bug", [
    ("dropped causal mask", {**SHAPE, "causal": 1}, "normal", {"mask": False}),
    ("no rescale", SHAPE, "normal", {"rescale": False}),
    ("P.V accumulated in bf16", {**SHAPE, "seq": 1024, "heads": 2, "kv_heads": 1}, "int", {"pv_bf16": True}),
    ("transposed head layout", SHAPE, "normal", {"layout": "bshd"}),
    ("wrong GQA head mapping", SHAPE, "normal", {"head_map": "modulo"}),
], ids=["dropped-mask", "no-rescale", "pv-bf16", "transposed-heads", "gqa-mapping"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_planted_bug_fails(name, shape, values, bug, dtype):
    inputs = _inputs(shape, dtype, values)
    assert _verdict(inputs, dtype).passed  # the same problem passes without the bug
    v = _verdict(inputs, dtype, **bug)
    assert not v.passed, name
    o = v.outputs[0]
    assert o.failures > 0.002 * o.elements, (name, o.failures, o.elements)

