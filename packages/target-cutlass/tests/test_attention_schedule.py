"""The CUTLASS attention template's schedule, run in numpy against the float64 oracle (no GPU, no nvcc).

The kernel cannot run here. Its schedule can, with the rules the template runs (their Python mirrors,
:func:`attention.key_blocks` and :func:`attention.kv_index`, equal to the build's own by
test_attention_lowering): key blocks from 0 up, a mask only in the blocks the rule says need one, TMA's zero fill
past seq, scores in fp32, exp2 with the scale and log2(e) folded into one multiplier, the running max with its "no
visible key yet" guard, P rounded to the input format before P V, the row sum kept from unrounded P, O divided at the
end. A wrong rule (a block that needs a mask left unmasked, a skipped block with visible keys, a wrong kv head) is
rejected by the oracle: the controls at the end show it.
"""

import math

import numpy as np
import pytest
from mosaic.families.attention import make_inputs
from mosaic.oracle.attention import reference
from mosaic.oracle.formats import fmt
from mosaic.oracle.verdict import compare
from mosaic_target_cutlass import attention
from mosaic_target_cutlass.attention import AttentionKnobs


def schedule(q, k, v, shape: dict, knobs: AttentionKnobs, dtype: str, blocks=attention.key_blocks,
             kv_index=attention.kv_index) -> np.ndarray:
    f = fmt(dtype)
    b_, s, h_, d = shape["batch"], shape["seq"], shape["heads"], shape["head_dim"]
    kvh = shape.get("kv_heads", h_)
    causal = bool(shape.get("causal", 0))
    bm, bn = knobs.block_m, knobs.block_n
    c = np.float32(math.log2(math.e) / math.sqrt(d))
    o = np.zeros(q.shape, np.float64)
    for b in range(b_):
        for h in range(h_):
            lk = kv_index(b, h, h_, kvh)
            bk, hk = divmod(lk, kvh)
            for m in range(-(-s // bm)):
                rows = m * bm + np.arange(bm)
                q_t = np.zeros((bm, d), np.float32)
                q_t[rows < s] = q[b, h, rows[rows < s]]
                masked, visited = blocks(knobs, m, s, causal)
                row_max = np.full(bm, -np.inf, np.float32)
                row_sum = np.zeros(bm, np.float32)
                acc = np.zeros((bm, d), np.float32)
                for j in range(visited):
                    keys = j * bn + np.arange(bn)
                    k_t, v_t = np.zeros((bn, d), np.float32), np.zeros((bn, d), np.float32)
                    k_t[keys < s], v_t[keys < s] = k[bk, hk, keys[keys < s]], v[bk, hk, keys[keys < s]]
                    sc = q_t @ k_t.T
                    if j >= masked:
                        hide = (keys >= s)[None, :] | ((keys[None, :] > rows[:, None]) if causal else False)
                        sc = np.where(hide, np.float32(-np.inf), sc)
                    mx = np.maximum(row_max, sc.max(axis=1))
                    shift = np.where(mx == -np.inf, np.float32(0), mx * c)
                    with np.errstate(invalid="ignore"):
                        corr = np.exp2(row_max * c - shift)
                        p = np.exp2(sc * c - shift[:, None]).astype(np.float32)
                    row_max = mx
                    row_sum = row_sum * corr + p.sum(axis=1)
                    acc = acc * corr[:, None] + f.round(p).astype(np.float32) @ v_t
                out = acc / np.where(row_sum > 0, row_sum, 1)[:, None]
                o[b, h, rows[rows < s]] = f.round(out[rows < s])
    return o


def _verdict(shape, knobs, dtype="bf16", seed=5, **model):
    inputs = make_inputs(shape, dtype, seed, "normal")
    got = schedule(inputs["q"], inputs["k"], inputs["v"], shape, AttentionKnobs(**knobs), dtype, **model)
    return compare("o", got, reference(inputs, fmt(dtype), fmt(dtype))["o"])


SMALL = {"batch": 2, "seq": 300, "heads": 4, "head_dim": 64}


@pytest.mark.parametrize("shape, knobs", [
    (SMALL, {"block_m": 128, "block_n": 64}),  # seq % block_n: the tail block masked
    ({**SMALL, "causal": 1}, {"block_m": 128, "block_n": 64}),  # two diagonal blocks per query block
    ({**SMALL, "causal": 1}, {"block_m": 64, "block_n": 128, "consumer_warpgroups": 1}),  # block_m < block_n
    ({**SMALL, "causal": 1, "kv_heads": 2}, {"block_m": 256, "block_n": 96}),
    ({**SMALL, "causal": 1, "kv_heads": 1}, {"causal_skip": False}),  # every block visited, upper ones masked
    ({**SMALL, "seq": 256, "kv_heads": 2}, {}),  # blocks divide seq: no masked block
    ({**SMALL, "seq": 37, "causal": 1}, {}),  # one block, shorter than either tile
])
def test_the_templates_schedule_meets_the_oracle(shape, knobs):
    report = _verdict(shape, knobs)
    assert report.passed, report.summary()


def test_f16_meets_the_oracle():
    report = _verdict({**SMALL, "causal": 1, "kv_heads": 2}, {"block_n": 64, "p_in": "smem"}, dtype="f16")
    assert report.passed, report.summary()


def test_block_rule_counts():
    """A causal 300-query problem in 128 x 64 blocks visits 2, 4, 5 key blocks, masking from 0, 2, 4 (the last one
    also holds the seq tail); without causal every block, the tail masked; without skipping every block."""
    k = AttentionKnobs(block_m=128, block_n=64)
    assert [attention.key_blocks(k, m, 300, True) for m in range(3)] == [(0, 2), (2, 4), (4, 5)]
    assert [attention.key_blocks(k, m, 300, False) for m in range(3)] == [(4, 5)] * 3
    assert attention.key_blocks(k, 0, 256, False) == (4, 4)
    noskip = AttentionKnobs(block_m=128, block_n=64, causal_skip=False)
    assert [attention.key_blocks(noskip, m, 300, True) for m in range(3)] == [(0, 5), (2, 5), (4, 5)]


def test_gqa_head_mapping():
    # batch 0: heads 0-3 -> kv 0, heads 4-7 -> kv 1; batch 1 starts at kv index 2
    assert [attention.kv_index(b, h, 8, 2) for b in (0, 1) for h in range(8)] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert [attention.kv_index(1, h, 4, 1) for h in range(4)] == [1] * 4  # MQA


# -- controls: the same check rejects a schedule with a broken rule ----------------------------------------------

def _no_masks(knobs, m, s, causal):
    return (attention.key_blocks(knobs, m, s, causal)[1],) * 2


def _skip_one_more(knobs, m, s, causal):
    masked, visited = attention.key_blocks(knobs, m, s, causal)
    return min(masked, visited - 1), visited - 1


def _interleaved_heads(b, h, heads, kv_heads):
    return b * kv_heads + h % kv_heads


@pytest.mark.parametrize("shape, knobs, model", [
    ({**SMALL, "causal": 1}, {"block_m": 128, "block_n": 64}, {"blocks": _no_masks}),
    (SMALL, {"block_m": 128, "block_n": 64}, {"blocks": _no_masks}),  # the tail's zero keys would get weight
    ({**SMALL, "causal": 1}, {"block_m": 128, "block_n": 64}, {"blocks": _skip_one_more}),
    ({**SMALL, "kv_heads": 2}, {}, {"kv_index": _interleaved_heads}),
])
def test_a_broken_rule_is_rejected(shape, knobs, model):
    assert not _verdict(shape, knobs, **model).passed
