"""The blocked RoPE order (rope_order.py, ScheduleConfig.rope_order): the layout, the weights bound row-permuted, the
ops' semantics (bit for bit the standard order's), the lowering's 8-row split, the encoder's F_ROPE_BLOCK, and the
CUDA VM's staging bound. The GPU comparison of the two orders is in test_cuda_rope_order.py."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from mosaic.errors import BadInput
from mosaic.plugins import host
from mosaic_amk import ops, rope_order
from mosaic_amk.config import CUDA_DEFAULT, VM_FUSIONS, ScheduleConfig
from mosaic_amk.lowering import apart, lower, qkv_sms
from mosaic_amk.reference_vm import ReferenceVM
from mosaic_amk.tiny_models import tiny_model
from mosaic_amk.validate import validate

BLOCKED = attrs.evolve(CUDA_DEFAULT, rope_order="blocked")


@pytest.fixture(scope="module")
def h200():
    return host().get("gpus", "h200")


@pytest.mark.parametrize("hd", [8, 24, 64, 128])
def test_layout_pairs_and_chunks(hd):
    d = rope_order.dims(hd)
    half = hd // 2
    assert sorted(d.tolist()) == list(range(hd))
    for s in range(hd):  # stored row s pairs with s ^ 4: its standard partner
        assert abs(int(d[s ^ 4]) - int(d[s])) == half and (d[s] < half) == (s % 8 < 4)
    for c in range(hd // 4):  # every 16-byte chunk holds 4 consecutive standard dims, in order
        assert d[4 * c: 4 * c + 4].tolist() == list(range(int(d[4 * c]), int(d[4 * c]) + 4))
    x = np.arange(3 * hd, dtype=np.float32)
    r = rope_order.rows(3 * hd, hd)
    assert np.array_equal(rope_order.to_standard(x[r], hd), x)
    assert np.array_equal(r[hd:2 * hd], hd + d)
    with pytest.raises(ValueError):
        rope_order.dims(hd + 4)
    with pytest.raises(ValueError):
        rope_order.rows(hd + 4, hd)


def test_resolve_permutes_the_checkpoint_rows():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((128, 16)).astype(np.float32)
    table = {"q.weight": w}
    name = rope_order.weight_name("q.weight", 64)
    assert rope_order.split_name(name) == ("q.weight", 64) and rope_order.split_name("q.weight") is None
    got = rope_order.resolve(table.get, name)
    assert np.array_equal(got, w[rope_order.rows(128, 64)]) and got.flags.c_contiguous
    assert rope_order.resolve(table.get, "q.weight") is w
    assert rope_order.resolve(table.get, rope_order.weight_name("k.weight", 64)) is None  # missing
    assert rope_order.resolve(table.get, rope_order.weight_name("q.weight", 48)) is None  # not whole heads
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(w)
    assert np.array_equal(rope_order.resolve({"q.weight": t}.get, name).numpy(), got)


def _gemv_rope_params(r0, r1, hd, blk, **extra):
    return {"row_start": r0, "row_end": r1, "bias": True, "norm": False, "eps": 0.0, "position": 37, "head_dim": hd,
            "attention_scaling": 1.0, **({"rope_block": 8} if blk else {}), **extra}


@pytest.mark.parametrize("hd", [24, 64])
def test_ops_blocked_equal_standard_bit_for_bit(hd):
    """gemv_rope / gemv_rope_append (k into a cache slot) cut in 8-row tasks of the blocked order, then read back in
    the standard order, equal the whole-head standard ops bit for bit (integer weights and x: every GEMV row is
    exact, so only RoPE's arithmetic is compared); the attention over blocked q and K equals the standard one (to
    numpy's float32 dot order)."""
    rng = np.random.default_rng(1)
    nh, nkv, k_in, page = 4, 2, 32, 4
    qd, kvd = nh * hd, nkv * hd
    inv = (1.0 / 10000 ** (np.arange(0, hd, 2) / hd)).astype(np.float32)
    x = rng.integers(-3, 4, k_in).astype(np.float32)
    wq, bq = (rng.integers(-2, 3, (qd, k_in)).astype(np.float32), rng.integers(-4, 5, qd).astype(np.float32))
    y_std = np.zeros(qd, np.float32)
    ops.op_gemv_rope([x, wq, inv, bq], [y_std], _gemv_rope_params(0, qd, hd, False))
    perm = rope_order.rows(qd, hd)
    y_blk = np.full(qd, np.nan, np.float32)
    for r0 in range(0, qd, 8):
        ops.op_gemv_rope([x, wq[perm], inv, bq[perm]], [y_blk], _gemv_rope_params(r0, r0 + 8, hd, True))
    assert np.array_equal(rope_order.to_standard(y_blk, hd).view(np.uint32), y_std.view(np.uint32))

    wk, bk = wq[:kvd], bq[:kvd]
    kc_std = np.zeros((4, page, kvd), np.float32)
    kc_blk = np.zeros_like(kc_std)
    for pos in range(9):  # a few positions of the K cache, each appended as the lowering does
        p = _gemv_rope_params(0, kvd, hd, False, position=pos, rope=True, page_tokens=page)
        ops.op_gemv_rope_append([x + pos, wk, inv, bk], [kc_std], p)
        kperm = rope_order.rows(kvd, hd)
        for r0 in range(0, kvd, 16):
            p = _gemv_rope_params(r0, r0 + 16, hd, True, position=pos, rope=True, page_tokens=page)
            ops.op_gemv_rope_append([x + pos, wk[kperm], inv, bk[kperm]], [kc_blk], p)
    assert np.array_equal(rope_order.to_standard(kc_blk, hd), kc_std)

    q = rng.standard_normal(qd).astype(np.float32)
    vc = rng.standard_normal(kc_std.shape).astype(np.float32)
    kc = rng.standard_normal(kc_std.shape).astype(np.float32)
    att = {"position": 8, "num_heads": nh, "num_kv_heads": nkv, "head_dim": hd, "row_start": 0, "row_end": qd,
           "window": 0, "scale": hd ** -0.5, "page_tokens": page}
    want, got = np.zeros(qd, np.float32), np.zeros(qd, np.float32)
    ops.op_attention([q, kc, vc], [want], att)
    ops.op_attention([q[perm], kc[..., rope_order.rows(kvd, hd)], vc], [got], {**att, "rope_block": 8})
    # numpy's dot order follows the operands' alignment (the blocked path reads copies), so to its float32 rounding;
    # the CUDA VM's two orders are compared bit for bit (test_cuda_rope_order.py)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-7)
    ops.op_attention([q[perm], kc, vc], [got], {**att, "rope_block": 8})  # q blocked, K not: wrong pairs
    assert not np.allclose(got, want, rtol=1e-3)


def test_footprints_refuse_split_pairs():
    spec = ops.OP_SPECS["gemv_rope"]
    shapes = ([32], [128, 32], [32], [128]), ([128],)
    ok = spec.footprint(_gemv_rope_params(8, 24, 64, True), *shapes)
    assert ok == [(0, 32), (8 * 32, 24 * 32), (0, 32), (8, 24), (8, 24)]
    assert "blocks of 8" in spec.footprint(_gemv_rope_params(4, 24, 64, True), *shapes)
    assert "heads of 64" in spec.footprint(_gemv_rope_params(8, 24, 64, False), *shapes)
    assert "rope_block" in spec.footprint(_gemv_rope_params(8, 24, 64, False, rope_block=4), *shapes)
    att = ops.OP_SPECS["attention"].footprint(
        {"position": 3, "num_heads": 2, "num_kv_heads": 1, "head_dim": 64, "row_start": 0, "row_end": 64,
         "window": 0, "scale": 0.125, "page_tokens": 4, "rope_block": 3}, [[128], [2, 4, 64], [2, 4, 64]], [[128]])
    assert "rope_block" in att


def test_config_refusals():
    for bad in ({"rope_order": "blocked"},  # no gemv_rope_append fusion
                {"rope_order": "sideways"}):
        with pytest.raises(BadInput, match="rope_order"):
            ScheduleConfig.from_mapping(bad)
    assert ScheduleConfig.from_mapping({"rope_order": "blocked", "fusion": list(VM_FUSIONS)}).rope_order == "blocked"


def test_qkv_sms_share_the_sms_by_rows():
    q, k, v = qkv_sms(2048, 512, 132)  # Llama-3.2-1B: 3072 rows
    assert (len(q), len(k), len(v)) == (88, 22, 22) and q + k + v == list(range(132))
    q, k, v = qkv_sms(576, 192, 132)  # SmolLM2-135M: at most one 8-row block of q / k per SM
    assert (len(q), len(k), len(v)) == (72, 24, 36) and q + k + v == list(range(132))
    assert qkv_sms(96, 48, 2) == ([0, 1], [0, 1], [0, 1])


@pytest.mark.parametrize("family", ["llama", "smollm2", "qwen2"])
@pytest.mark.parametrize("sms,split", [(132, "balanced"), (24, "balanced"), (2, "balanced"), (24, "rows")])
def test_lowered_blocked_schedule(h200, family, sms, split):
    """q/k tasks of whole 8-row blocks with rope_block, v cut by rows, the q/k weights (and biases) bound by their
    blocked names; balanced: the q/k/v stage one task per SM on distinct SMs (when there are 3 or more); validated;
    the ReferenceVM's tokens equal the standard order's (logits to numpy's row-block float32 order)."""
    m = tiny_model(family)
    base = attrs.evolve(CUDA_DEFAULT, num_sms=sms, gemv_split=split, gemv_rows_per_task=16)
    cfg = attrs.evolve(base, rope_order="blocked")
    s = lower(m, cfg, h200, 5)
    assert validate(s).ok
    for i in range(m.num_layers):
        stage = [t for t in s.tasks if t.op.startswith("gemv_rope") and t.params["position"] == 5
                 and (t.outputs[0] in (f"l{i}.q_rope", f"kv.{i}.k", f"kv.{i}.v"))]
        assert stage, [t.outputs for t in s.tasks if t.op.startswith("gemv_rope")][:4]
        for t in stage:
            rope = t.op == "gemv_rope" or t.params.get("rope")
            r0, r1 = t.params["row_start"], t.params["row_end"]
            assert (t.params.get("rope_block") == 8) == bool(rope)
            assert not rope or (r0 % 8 == 0 and r1 % 8 == 0)
            assert bool(rope) == (rope_order.split_name(t.inputs[1]) is not None)
        if split == "balanced" and sms >= 3:
            assert len({t.sm for t in stage}) == len(stage)
        att = [t for t in s.tasks if t.op == "attention" and t.outputs == (f"l{i}.attn",)]
        assert att and all(t.params["rope_block"] == 8 for t in att)
        if split == "balanced" and apart("auto", len(att), sms, m.hidden_size * m.q_dim):
            # apart: the attention SMs run neither a q/k/v task nor an o-proj task of the layer
            assert not {t.sm for t in att} & {t.sm for t in stage}
            assert max(t.sm for t in stage) < sms - len(att)
    if m.weights.get(m.layer(0, "self_attn.q_proj.bias")) is not None:
        assert rope_order.weight_name(m.layer(0, "self_attn.q_proj.bias"), m.head_dim) in {b.name for b in s.buffers}
    want = ReferenceVM(m, base, h200).generate([3, 4, 5], 5)
    got = ReferenceVM(m, cfg, h200).generate([3, 4, 5], 5)
    assert got[0] == want[0]
    assert all(np.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(got[1], want[1], strict=True))


def test_encoder_flags_and_decode(h200):
    from mosaic_amk.cuda import decode as D
    from mosaic_amk.cuda import encode as E

    s = lower(tiny_model("llama"), attrs.evolve(BLOCKED, num_sms=24), h200, 5)
    enc = E.encode(s)
    flagged = {E.OPS[int(r[E.W_OP])] for r in enc.tasks if r[E.W_FLAGS] & E.F_ROPE_BLOCK}
    assert flagged == {"gemv_rope", "gemv_rope_append", "attention"}
    for r in enc.tasks:  # the k appends are flagged, the v appends not
        if E.OPS[int(r[E.W_OP])] == "gemv_rope_append":
            assert bool(r[E.W_FLAGS] & E.F_ROPE_BLOCK) == bool(r[E.W_FLAGS] & E.F_ROPE)
    back = D.decode(enc)
    assert [t.params.get("rope_block", 0) for t in back.tasks] == [t.params.get("rope_block", 0) for t in s.tasks]
    i = next(i for i, t in enumerate(s.tasks) if t.op == "gemv_rope")
    t = s.tasks[i]
    bad = attrs.evolve(s, tasks=(*s.tasks[:i], attrs.evolve(t, params={**t.params, "row_end": t.params["row_end"] - 4}),
                                 *s.tasks[i + 1:]))
    with pytest.raises(E.EncodeError, match="8-row blocks"):
        E.encode(bad)


def test_staging_bound_and_the_cuda_vm_fallback():
    """staged_tokens mirrors att_shape's fit (the bound fits, one more token does not); the CUDA VM keeps the blocked
    order only when its KV capacity fits the staging, and refuses (launcher) an encoding where it does not."""
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.cuda_vm import staged_rope_order
    from mosaic_amk.cuda.launcher import ATT_NB, blocked_attention_problem, staged_tokens

    for hd, heads in ((64, 1), (128, 1), (64, 4), (24, 2)):
        n = staged_tokens(hd, heads, 512, 96 * 1024)
        room = 96 * 1024 // 4 - (ATT_NB * hd + 16 * ATT_NB + 4 * 512)
        fits = [((min(heads, 8) * k + 3) & ~3) + 2 * k * (hd + 4) <= room for k in (n, n + 1)]
        assert n > 0 and fits == [True, False]
    assert staged_tokens(64, 1, 512, 96 * 1024) == 159
    m = tiny_model("llama")
    small = attrs.evolve(BLOCKED, kv_max_tokens=64)
    assert staged_rope_order(m, small) == (small, None)
    big = attrs.evolve(BLOCKED, kv_max_tokens=16384)
    got, why = staged_rope_order(m, big)
    assert got == attrs.evolve(big, rope_order="standard") and "KV capacity (16384 tokens)" in why
    kv_groups = attrs.evolve(small, attention_q_heads_per_task=0, attention_kv_heads_per_task=2)
    assert "more than one KV group" in staged_rope_order(m, kv_groups)[1]
    got, why = staged_rope_order(m, attrs.evolve(small, attention_stage=False))
    assert got.rope_order == "standard" and "attention_stage is off" in why
    std = attrs.evolve(small, rope_order="standard")
    assert staged_rope_order(m, std) == (std, None)
    h200 = host().get("gpus", "h200")
    enc = E.encode(lower(m, attrs.evolve(small, num_sms=24), h200, 5))
    assert blocked_attention_problem(enc, 512, 96 * 1024) is None
    enc_big = E.encode(lower(m, attrs.evolve(big, num_sms=24), h200, 5))
    assert "the staging holds" in blocked_attention_problem(enc_big, 512, 96 * 1024)
    baked = E.encode(lower(m, attrs.evolve(small, num_sms=24), h200, 5), runtime_position=False)  # never staged
    assert "F_KV_STAGE" in blocked_attention_problem(baked, 512, 96 * 1024)
