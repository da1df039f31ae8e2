"""The hopper attention kernel's schedule, run in numpy against the float64 oracle.

CuTe DSL has no CPU interpreter, so the kernel itself cannot run here. What can run is its schedule, with the
kernel module's own rules (:func:`key_block_range`: which key blocks a query block visits and which of them it
masks; :func:`kv_head_index`: the GQA head mapping): key blocks from the last visited down, a mask only in the
blocks the rule says need one, scores in fp32, exp2 with the log2(e) fold, the running max with the "nothing
visible yet" guard, per-thread partial row sums (a quad's four threads own interleaved column pairs), P rounded to
the input format before P V, O rounded at the end. If a rule were wrong -- a block needing a mask left unmasked,
a skipped block that holds visible keys, a wrong kv head -- the oracle rejects the output; the controls at the
end show that it does.
"""

import math

import numpy as np
import pytest
from mosaic.families.attention import make_inputs
from mosaic.oracle.attention import reference
from mosaic.oracle.formats import fmt
from mosaic.oracle.verdict import compare
from mosaic_target_cute.kernels.hopper_attention import key_block_range, kv_head_index
from mosaic_target_cute.knobs import AttentionKnobs, AttentionShape


def schedule(q, k, v, shape: AttentionShape, knobs: AttentionKnobs, dtype: str, blocks=key_block_range,
             kv_index=kv_head_index) -> np.ndarray:
    """The kernel's arithmetic in numpy (fp32 where it is fp32), one (m block, batch*head) tile at a time."""
    f = fmt(dtype)
    bm, bn, s, d = knobs.block_m, knobs.block_n, shape.seq, shape.head_dim
    c = np.float32(math.log2(math.e) / math.sqrt(d))
    lane = (np.arange(bn) % 8) // 2  # which thread of the quad holds a column of the wgmma accumulator
    o = np.zeros(q.shape, np.float64)
    for l_q in range(shape.batch * shape.heads):
        bq, hq = divmod(l_q, shape.heads)
        bk, hk = divmod(kv_index(l_q, shape), shape.kv_heads)
        for m in range(-(-s // bm)):
            rows = m * bm + np.arange(bm)
            q_t = np.zeros((bm, d), np.float32)
            q_t[rows < s] = q[bq, hq, rows[rows < s]]  # TMA zero-fills rows past seq
            masked, visited = blocks(shape, knobs, m)
            row_max = np.full(bm, -np.inf, np.float32)
            sums = np.zeros((bm, 4), np.float32)
            acc = np.zeros((bm, d), np.float32)
            for n in reversed(range(visited)):
                keys = n * bn + np.arange(bn)
                k_t, v_t = np.zeros((bn, d), np.float32), np.zeros((bn, d), np.float32)
                k_t[keys < s], v_t[keys < s] = k[bk, hk, keys[keys < s]], v[bk, hk, keys[keys < s]]
                scores = q_t @ k_t.T
                if n >= masked:
                    hide = (keys >= s)[None, :] | ((keys[None, :] > rows[:, None]) if shape.causal else False)
                    scores = np.where(hide, np.float32(-np.inf), scores)
                new_max = np.maximum(row_max, scores.max(axis=1))
                shift = np.where(new_max == -np.inf, np.float32(0), new_max) * c
                with np.errstate(invalid="ignore"):
                    rescale = np.exp2(row_max * c - shift)
                    p = np.exp2(scores * c - shift[:, None]).astype(np.float32)
                sums = sums * rescale[:, None] + np.stack([p[:, lane == t].sum(axis=1) for t in range(4)], axis=1)
                row_max = new_max
                acc = acc * rescale[:, None] + f.round(p).astype(np.float32) @ v_t
            total = sums.sum(axis=1)
            out = acc / np.where(total == 0, 1, total)[:, None]
            o[bq, hq, rows[rows < s]] = f.round(out[rows < s])
    return o


def _verdict(shape_dict, knobs, dtype="bf16", seed=3, **model):
    shape = AttentionShape.from_shape(shape_dict)
    inputs = make_inputs(shape_dict, dtype, seed, "normal")
    got = schedule(inputs["q"], inputs["k"], inputs["v"], shape, AttentionKnobs(**knobs), dtype, **model)
    exp = reference(inputs, fmt(dtype), fmt(dtype))["o"]
    return compare("o", got, exp)


SMALL = {"batch": 2, "seq": 300, "heads": 4, "head_dim": 64}


@pytest.mark.parametrize("shape, knobs", [
    (SMALL, {"block_m": 128, "block_n": 64}),  # seq % block_n: the last key block masked
    ({**SMALL, "causal": 1}, {"block_m": 128, "block_n": 64}),  # two diagonal blocks per query block
    ({**SMALL, "causal": 1}, {"block_m": 64, "block_n": 128, "consumer_warpgroups": 1}),  # block_m < block_n
    ({**SMALL, "causal": 1, "kv_heads": 2}, {"block_m": 192, "block_n": 80, "consumer_warpgroups": 3}),
    ({**SMALL, "causal": 1, "kv_heads": 1}, {"causal_skip": False}),  # every block visited, upper ones masked
    ({**SMALL, "seq": 256, "kv_heads": 2}, {}),  # blocks divide seq: no masked block at all
])
def test_the_kernels_schedule_meets_the_oracle(shape, knobs):
    report = _verdict(shape, knobs)
    assert report.passed, report.summary()


def test_f16_meets_the_oracle():
    report = _verdict({**SMALL, "causal": 1, "kv_heads": 2}, {"block_n": 96}, dtype="f16")
    assert report.passed, report.summary()


def test_block_rule_counts():
    """The rule on its own: a causal 300-query problem of 128 x 64 blocks visits 2, 4, 5 key blocks, masking
    from 0, 2, 4 (the last block also holds the seq tail); without causal every block, the tail masked."""
    k = AttentionKnobs(block_m=128, block_n=64)
    causal = AttentionShape.from_shape({**SMALL, "causal": 1})
    assert [key_block_range(causal, k, m) for m in range(3)] == [(0, 2), (2, 4), (4, 5)]
    plain = AttentionShape.from_shape(SMALL)
    assert [key_block_range(plain, k, m) for m in range(3)] == [(4, 5)] * 3
    assert key_block_range(AttentionShape.from_shape({**SMALL, "seq": 256}), k, 0) == (4, 4)
    noskip = AttentionKnobs(block_m=128, block_n=64, causal_skip=False)
    assert [key_block_range(causal, noskip, m) for m in range(3)] == [(0, 5), (2, 5), (4, 5)]


def test_gqa_head_mapping():
    shape = AttentionShape.from_shape({**SMALL, "heads": 8, "kv_heads": 2})
    # batch 0 heads 0-3 -> kv 0, heads 4-7 -> kv 1; batch 1 starts at kv index 2
    assert [kv_head_index(lq, shape) for lq in range(16)] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4


# -- controls: the same check rejects a schedule with a broken rule ------------------------------------------

def _no_masks(shape, knobs, m):
    return (key_block_range(shape, knobs, m)[1],) * 2  # every visited block treated as unmasked


def _skip_one_more(shape, knobs, m):
    masked, visited = key_block_range(shape, knobs, m)
    return min(masked, visited - 1), visited - 1  # the diagonal block dropped


def _wrong_gqa(l_q, shape):
    return (l_q // shape.heads) * shape.kv_heads + (l_q % shape.heads) % shape.kv_heads  # interleaved, not grouped


@pytest.mark.parametrize("shape, knobs, model", [
    ({**SMALL, "causal": 1}, {"block_m": 128, "block_n": 64}, {"blocks": _no_masks}),
    (SMALL, {"block_m": 128, "block_n": 64}, {"blocks": _no_masks}),  # the seq tail's zero keys get weight
    ({**SMALL, "causal": 1}, {"block_m": 128, "block_n": 64}, {"blocks": _skip_one_more}),
    ({**SMALL, "kv_heads": 2}, {}, {"kv_index": _wrong_gqa}),
])
def test_a_broken_rule_is_rejected(shape, knobs, model):
    assert not _verdict(shape, knobs, **model).passed
