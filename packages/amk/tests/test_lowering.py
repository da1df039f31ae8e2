"""Lowering: the DAG's shape per ScheduleConfig, all-join counters, KV append before reads, disjoint
row ranges, SM policies, GPU-checked configs, TOML, JSON round trip, and the validator accepting real
lowerings of every family under several configs and positions."""

from __future__ import annotations

import json
from collections import Counter

import attrs
import numpy as np
import pytest
from mosaic.cli import main
from mosaic.errors import BadInput
from mosaic.plugins import host
from mosaic_amk.config import FUSIONS, ScheduleConfig, load_config
from mosaic_amk.lowering import LOGITS, NEXT_TOKEN, k_cache, lower
from mosaic_amk.reference_vm import ReferenceVM
from mosaic_amk.schedule import Schedule, load_schedule
from mosaic_amk.tiny_models import TINY_FAMILIES, tiny_model
from mosaic_amk.validate import validate


@pytest.fixture(scope="module")
def h200():
    return host().get("gpus", "h200")


def _ceil(a, b):
    return -(-a // b)


def test_task_counts_follow_the_config(h200):
    m = tiny_model("smollm2")  # hidden 96, 6 heads / 2 kv heads of 16, intermediate 112, vocab 96, 2 layers
    rows = 16
    s = lower(m, ScheduleConfig(gemv_rows_per_task=rows), h200, 3)
    ops = Counter(t.op for t in s.tasks)
    per_layer_gemv = (_ceil(m.q_dim, rows) + 2 * _ceil(m.kv_dim, rows) + _ceil(m.hidden_size, rows)
                      + _ceil(m.hidden_size, rows))
    assert ops["gemv"] == m.num_layers * per_layer_gemv + _ceil(m.vocab_size, rows)
    assert ops["gemv_silu_mul"] == m.num_layers * _ceil(m.intermediate_size, rows)
    assert ops["attention"] == m.num_layers * m.num_kv_heads
    assert ops["rope_append"] == ops["kv_append"] == ops["rope"] == m.num_layers
    assert ops["rmsnorm"] == 2 * m.num_layers + 1 and ops["embed"] == ops["argmax"] == 1
    assert "add" not in ops and "silu_mul" not in ops
    unfused = Counter(t.op for t in lower(m, ScheduleConfig(gemv_rows_per_task=rows, fusion=()), h200, 3).tasks)
    assert unfused["add"] == 2 * m.num_layers and unfused["silu_mul"] == m.num_layers
    assert unfused["kv_append"] == unfused["rope"] == 2 * m.num_layers and "rope_append" not in unfused
    assert unfused["gemv"] == ops["gemv"] + 2 * m.num_layers * _ceil(m.intermediate_size, rows)


@pytest.mark.parametrize("fusion", [FUSIONS, ()])
def test_waits_are_all_joins_on_earlier_producers_and_kv_appends_precede_reads(h200, fusion):
    m = tiny_model("llama")
    s = lower(m, ScheduleConfig(gemv_rows_per_task=10, fusion=fusion), h200, 5)
    producers = Counter(t.signal for t in s.tasks)
    index = {t.id: i for i, t in enumerate(s.tasks)}
    first_signal = {}
    for i, t in enumerate(s.tasks):
        for w in t.waits:
            assert w.threshold == producers[w.counter], (t.id, w)  # all-join
            assert first_signal[w.counter] < i  # topological list order
        first_signal.setdefault(t.signal, i)
    # every attention task waits for the counters signalled by its layer's K and V appends
    appends = {t.outputs[0]: t.signal for t in s.tasks if t.op in ("kv_append", "rope_append")}
    for t in s.tasks:
        if t.op == "attention":
            waited = {w.counter for w in t.waits}
            assert appends[t.inputs[1]] in waited and appends[t.inputs[2]] in waited
    assert sorted(index) == list(range(len(s.tasks)))


def test_row_split_writers_cover_each_buffer_exactly_once(h200):
    m = tiny_model("qwen2")
    s = lower(m, ScheduleConfig(gemv_rows_per_task=12, attention_kv_heads_per_task=1), h200, 2)
    bufs = s.buffer_map()
    written: dict[str, list] = {}
    for t in s.tasks:
        for out in t.outputs:
            if bufs[out].kind != "kv_cache":
                written.setdefault(out, []).append(t.range_of(out, bufs[out].rows))
    for name, ranges in written.items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == bufs[name].rows, name
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), (name, ranges)
    # the KV append writes the page of its position only
    append = next(t for t in s.tasks if t.outputs == (k_cache(0),))
    assert append.ranges[k_cache(0)] == (2 // 16, 2 // 16 + 1)


def test_sm_policies(h200):
    m = tiny_model("tinyllama")
    rr = lower(m, ScheduleConfig(sm_policy="round_robin", num_sms=7), h200, 0)
    assert rr.num_sms == 7 and all(t.sm == i % 7 for i, t in enumerate(rr.tasks))
    single = lower(m, ScheduleConfig(sm_policy="single"), h200, 0)
    assert single.num_sms == h200.sm_count and {t.sm for t in single.tasks} == {0}
    ll = lower(m, ScheduleConfig(sm_policy="least_loaded", num_sms=4, gemv_rows_per_task=8), h200, 0)
    load = Counter()
    for t in ll.tasks:
        load[t.sm] += 1
    assert set(load) == {0, 1, 2, 3}
    assert max(load.values()) - min(load.values()) <= len(ll.tasks) // 4  # spread, not piled on one SM


def test_lowering_is_deterministic_and_round_trips_through_json(h200, tmp_path):
    m = tiny_model("mistral")
    cfg = ScheduleConfig(gemv_rows_per_task=9, sm_policy="least_loaded", num_sms=3)
    s = lower(m, cfg, h200, 7)
    assert s.dumps() == lower(m, cfg, h200, 7).dumps()
    back = load_schedule(s.save(tmp_path / "s.json"))
    assert back == s and s.outputs == (LOGITS, NEXT_TOKEN)
    vm = ReferenceVM(m, cfg, h200)
    for pos, tok in enumerate([5, 6, 7, 8, 9, 10, 11]):
        vm.step(tok, pos)
    kv = {k: v.copy() for k, v in vm.kv.items()}
    a = vm.run(s, 12)
    vm.kv = kv
    b = vm.run(back, 12)
    assert a.token == b.token and (a.logits == b.logits).all()


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_validator_accepts_real_lowerings(h200, family):
    m = tiny_model(family)
    configs = [ScheduleConfig(gemv_rows_per_task=16), ScheduleConfig(sm_policy="single"),
               ScheduleConfig(gemv_rows_per_task=7, fusion=(), sm_policy="least_loaded", num_sms=5,
                              attention_kv_heads_per_task=2, kv_page_tokens=4)]
    for cfg in configs:
        for pos in (0, 6, 17):
            result = validate(lower(m, cfg, h200, pos))
            assert result.ok, [d.line() for d in result.diagnostics]


@pytest.mark.parametrize("fusion", [FUSIONS[:5], ()])
def test_balanced_split_runs_one_task_per_sm_per_gemv_and_covers_every_row(h200, fusion):
    """gemv_split="balanced": each GEMV is min(num_sms, units) tasks whose sizes differ by at most one unit (a row;
    a whole head for the RoPE GEMVs), the ranges tile the output exactly, round-robin puts each on its own SM, the
    validator accepts the lowering, and the ReferenceVM's tokens equal the rows split's (logits to float32 order)."""
    m = tiny_model("llama")  # q 128 rows (8 heads of 16), kv 32, hidden 128, intermediate 176, vocab 96
    sms = 6
    cfg = ScheduleConfig(gemv_split="balanced", num_sms=sms, fusion=fusion)
    s = lower(m, cfg, h200, 4)
    gemv_ops = {"gemv", "rmsnorm_gemv", "gemv_silu_mul", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append"}
    by_weight: dict = {}
    for t in s.tasks:
        if t.op in gemv_ops:
            w = t.inputs[2 if t.op.startswith("rmsnorm") else 1]
            by_weight.setdefault(w, []).append(t)
    assert len(by_weight) == m.num_layers * (4 + (2 if "gate_up_silu" in fusion else 3)) + 1
    for w, tasks in by_weight.items():
        n_out = next(b for b in s.buffers if b.name == w).shape[0]
        unit = m.head_dim if tasks[0].op.startswith("gemv_rope") else 1
        ranges = [(t.params["row_start"], t.params["row_end"]) for t in tasks]
        assert ranges[0][0] == 0 and ranges[-1][1] == n_out and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        sizes = [(r1 - r0) // unit for r0, r1 in ranges]
        assert len(tasks) == min(sms, -(-n_out // unit)), w
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True), (w, sizes)
        assert len({t.sm for t in tasks}) == len(tasks), w  # one task per SM
    result = validate(s)
    assert result.ok, [d.line() for d in result.diagnostics]
    prompt = [5, 1, 8]
    want = ReferenceVM(m, ScheduleConfig(num_sms=sms, fusion=fusion, gemv_rows_per_task=16), h200).generate(prompt, 4)
    got = ReferenceVM(m, cfg, h200).generate(prompt, 4)
    assert got[0] == want[0]
    # numpy's float32 GEMV sums in an order that depends on the row block (any two splits differ by ~1e-6)
    assert all(np.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(got[1], want[1], strict=True))


@pytest.mark.parametrize("family", ["llama", "smollm2"])
def test_attention_q_heads_per_task_splits_each_kv_group(h200, family):
    """attention_q_heads_per_task=q cuts each KV head's query heads into tasks of q heads (rows of whole heads inside
    one group), validated, and the ReferenceVM's tokens and logits are bit-identical to one task per group; it needs
    attention_kv_heads_per_task=1."""
    m = tiny_model(family)
    rep = m.num_heads // m.num_kv_heads
    s = lower(m, ScheduleConfig(attention_q_heads_per_task=1, num_sms=8), h200, 5)
    att = [t for t in s.tasks if t.op == "attention"]
    assert len(att) == m.num_layers * m.num_heads
    for t in att:
        r0, r1 = t.params["row_start"], t.params["row_end"]
        assert r1 - r0 == m.head_dim and r0 // m.head_dim // rep == (r1 - 1) // m.head_dim // rep
    assert validate(s).ok
    base = ReferenceVM(m, ScheduleConfig(num_sms=8), h200).generate([3, 4, 5], 4)
    split = ReferenceVM(m, ScheduleConfig(attention_q_heads_per_task=1, num_sms=8), h200).generate([3, 4, 5], 4)
    assert split[0] == base[0] and all(np.array_equal(a, b) for a, b in zip(split[1], base[1], strict=True))
    with pytest.raises(BadInput, match="attention_q_heads_per_task"):
        ScheduleConfig.from_mapping({"attention_q_heads_per_task": 1, "attention_kv_heads_per_task": 2})


def _placed(h200, family: str, placement: str, sms: int = 24):
    """(model, the round-robin CUDA_DEFAULT on ``sms`` SMs, its twin with ``placement``, that twin lowered at position
    5 and validated)."""
    from mosaic_amk.config import CUDA_DEFAULT

    m = tiny_model(family)
    base = attrs.evolve(CUDA_DEFAULT, num_sms=sms, attention_placement="round_robin")
    cfg = attrs.evolve(base, attention_placement=placement)
    s = lower(m, cfg, h200, 5)
    assert validate(s).ok
    return m, base, cfg, s


def _same_tokens(h200, m, base, cfg) -> None:
    """The ReferenceVM's greedy tokens of the two configs are equal, the logits to numpy's row-block float32 order."""
    want = ReferenceVM(m, base, h200).generate([3, 4, 5], 4)
    got = ReferenceVM(m, cfg, h200).generate([3, 4, 5], 4)
    assert got[0] == want[0]
    assert all(np.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(got[1], want[1], strict=True))


@pytest.mark.parametrize("family", ["llama", "smollm2", "qwen2"])
def test_attention_apart_places_attention_and_o_proj_on_disjoint_sms(h200, family):
    """attention_placement="apart": each layer's attention tasks on the last SMs, its o-projection cut over the
    other SMs (one task per SM with the balanced split), no SM with both; validated; the ReferenceVM's tokens equal
    round-robin placement's (logits to numpy's row-block float32 order)."""
    sms = 24
    m, base, cfg, s = _placed(h200, family, "apart", sms)
    for i in range(m.num_layers):
        att = [t for t in s.tasks if t.op == "attention" and t.outputs == (f"l{i}.attn",)]
        o = [t for t in s.tasks if t.outputs == (f"l{i}.h_mid",)]
        assert sorted(t.sm for t in att) == list(range(sms - len(att), sms))
        assert sorted(t.sm for t in o) == list(range(len(o))) and len(o) == min(sms - len(att), m.hidden_size)
        rows = sorted((t.params["row_start"], t.params["row_end"]) for t in o)
        assert rows[0][0] == 0 and rows[-1][1] == m.hidden_size
        assert all(a[1] == b[0] for a, b in zip(rows, rows[1:], strict=False))
    _same_tokens(h200, m, base, cfg)
    with pytest.raises(BadInput, match="attention_placement"):
        ScheduleConfig.from_mapping({"attention_placement": "apart", "sm_policy": "single"})
    with pytest.raises(BadInput, match="attention_placement"):
        ScheduleConfig.from_mapping({"attention_placement": "far"})


def test_attention_placement_auto_is_apart_only_for_small_o_projections(h200):
    """"auto" = apart when the o-projection over the SMs left is at most AUTO_APART_MAX_WEIGHTS_PER_SM weights each:
    the four bench shapes with one attention task per query head on the H200's 132 SMs (SmolLM2s apart, measured
    faster; Llama-3.2-1B and TinyLlama together, apart measured slower), and a lowered tiny model placed like
    "apart" or like round_robin as the bound says."""
    from mosaic_amk.bench.hf_gpu import SHAPES
    from mosaic_amk.config import AUTO_APART_MAX_WEIGHTS_PER_SM, CUDA_DEFAULT
    from mosaic_amk.lowering import apart

    got = {}
    for name, (_, kw) in SHAPES.items():
        h, heads = kw["hidden_size"], kw["num_attention_heads"]
        qd = heads * kw.get("head_dim", h // heads)
        got[name] = apart("auto", heads, 132, h * qd)
    assert got == {"smollm2-135m": True, "smollm2-360m": True, "tinyllama-1.1b": False, "llama-3.2-1b": False}
    assert apart("apart", 32, 132, 2048 * 2048) and not apart("round_robin", 9, 132, 576 * 576)
    assert not apart("apart", 132, 132, 1) and not apart("auto", 140, 132, 1)
    bound = AUTO_APART_MAX_WEIGHTS_PER_SM * 100
    assert apart("auto", 32, 132, bound) and not apart("auto", 32, 132, bound + 1)
    m = tiny_model("llama")
    wants = []
    for sms in (24, 4):  # 4 attention tasks: apart on 24 SMs, round_robin on 4 (no SM left for the o-projection)
        base = attrs.evolve(CUDA_DEFAULT, num_sms=sms, attention_placement="round_robin")
        auto = lower(m, attrs.evolve(base, attention_placement="auto"), h200, 5)
        n_att = sum(1 for t in auto.tasks if t.op == "attention" and t.outputs == ("l0.attn",))
        want = "apart" if apart("auto", n_att, sms, m.hidden_size * m.num_heads * m.head_dim) else "round_robin"
        ref = lower(m, attrs.evolve(base, attention_placement=want), h200, 5)
        assert [t.sm for t in auto.tasks] == [t.sm for t in ref.tasks]
        assert validate(auto).ok
        wants.append(want)
    assert wants == ["apart", "round_robin"]


def test_attention_apart_qkv_keeps_only_the_qkv_blocks_off_the_attention_sms(h200):
    """attention_placement="apart_qkv" (with rope_order blocked): the attention tasks on the last SMs, the q/k/v
    blocks over the others, the o-projection over every SM; validated; the ReferenceVM's tokens equal round-robin's."""
    sms = 24
    m, base, cfg, s = _placed(h200, "llama", "apart_qkv", sms)
    for i in range(m.num_layers):
        att = {t.sm for t in s.tasks if t.op == "attention" and t.outputs == (f"l{i}.attn",)}
        qkv = {t.sm for t in s.tasks if t.op.startswith("gemv_rope") and t.outputs[0] in
               (f"l{i}.q_rope", f"kv.{i}.k", f"kv.{i}.v")}
        o = sorted(t.sm for t in s.tasks if t.outputs == (f"l{i}.h_mid",))
        assert att == set(range(sms - len(att), sms)) and not att & qkv and o == list(range(sms))
    _same_tokens(h200, m, base, cfg)


def test_auto_placement_on_the_bench_shapes(h200):
    """"auto" on the real bench shapes (weights: zero-stride views, only their shapes matter), two layers: SmolLM2-135M
    apart (the attention SMs run nothing else of the layer), Llama-3.2-1B apart_qkv (the attention SMs run no q/k/v
    block; the o-projection over all 132 SMs); both validated."""
    from mosaic_amk.bench.hf_gpu import SHAPES
    from mosaic_amk.config import CUDA_DEFAULT
    from mosaic_amk.model import ModelSpec

    for name, want in (("smollm2-135m", "apart"), ("llama-3.2-1b", "apart_qkv")):
        kw = SHAPES[name][1]
        heads = kw["num_attention_heads"]
        m = ModelSpec(family="llama", vocab_size=kw["vocab_size"], hidden_size=kw["hidden_size"],
                      intermediate_size=kw["intermediate_size"], num_layers=2, num_heads=heads,
                      num_kv_heads=kw["num_key_value_heads"], head_dim=kw.get("head_dim", kw["hidden_size"] // heads),
                      rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=kw["tie_word_embeddings"])
        m = attrs.evolve(m, weights={n: np.broadcast_to(np.float32(0), sh) for n, sh in m.expected_shapes().items()})
        s = lower(m, CUDA_DEFAULT, h200, 7)
        assert validate(s).ok
        att = {t.sm for t in s.tasks if t.op == "attention" and t.outputs == ("l1.attn",)}
        qkv = {t.sm for t in s.tasks if t.op.startswith("gemv_rope") and t.outputs[0] in ("l1.q_rope", "kv.1.k", "kv.1.v")}
        o = {t.sm for t in s.tasks if t.outputs == ("l1.h_mid",)}
        assert att == set(range(132 - heads, 132)) and not att & qkv
        assert (o == set(range(132))) == (want == "apart_qkv") and (not att & o) == (want == "apart")
        if want == "apart_qkv":  # without the q/k/v split (the standard order) apart_qkv places like round_robin
            std = attrs.evolve(CUDA_DEFAULT, rope_order="standard")
            rr = lower(m, attrs.evolve(std, attention_placement="round_robin"), h200, 7)
            assert [t.sm for t in lower(m, std, h200, 7).tasks] == [t.sm for t in rr.tasks]


def test_balanced_split_sizes(h200):
    from mosaic_amk.lowering import _Builder

    b = _Builder(tiny_model("llama"), ScheduleConfig(gemv_split="balanced"), 132)
    assert b.row_ranges(2048, 32)[:2] == [(0, 16), (16, 32)] and len(b.row_ranges(2048, 32)) == 132
    assert sum(r1 - r0 == 16 for r0, r1 in b.row_ranges(2048, 32)) == 2048 - 132 * 15  # 68 of 16 rows, 64 of 15
    assert len(b.row_ranges(2048, 32, unit=64)) == 32  # q of Llama-3.2-1B: 32 whole heads, one task each
    assert b.row_ranges(100, 32, unit=64) == [(0, 64), (64, 100)]
    assert b.row_ranges(50, 32, balanced=False) == [(0, 32), (32, 50)]
    assert b.row_ranges(200, 32, unit=64, balanced=False) == [(0, 64), (64, 128), (128, 192), (192, 200)]


# ------------------------------------------------------------------------------------------- config

def test_config_checks_against_the_gpu(h200):
    ok = ScheduleConfig(threads_per_block=1024, smem_bytes=h200.smem_per_block, num_sms=h200.sm_count)
    assert ok.check(h200) == []
    bad = ScheduleConfig(threads_per_block=2048, smem_bytes=300 * 1024, num_sms=200, prefetch_depth=8,
                         prefetch_tile_bytes=64 * 1024)
    problems = bad.check(h200)
    assert len(problems) == 5, problems  # sms, threads, smem/block, smem/SM, prefetch
    with pytest.raises(BadInput, match="does not fit h200"):
        lower(tiny_model("llama"), bad, h200, 0)


@pytest.mark.parametrize("kwargs, word", [
    ({"gemv_rows_per_task": 0}, "gemv_rows_per_task"), ({"threads_per_block": 100}, "multiple of 32"),
    ({"fusion": ("residual", "magic")}, "fusion"), ({"sm_policy": "random"}, "sm_policy"),
    ({"kv_page_tokens": 12}, "power of two"), ({"kv_max_tokens": 100}, "multiple of kv_page_tokens"),
    ({"prefetch_depth": 9}, "<= 8"),
])
def test_config_rejects_bad_values(kwargs, word):
    with pytest.raises(BadInput, match=word):
        ScheduleConfig(**kwargs)


def test_config_from_toml(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[schedule]\ngemv_rows_per_task = 32\nfusion = ["residual"]\nsm_policy = "least_loaded"\n')
    c = load_config(p)
    assert (c.gemv_rows_per_task, c.fusion, c.sm_policy) == (32, ("residual",), "least_loaded")
    p.write_text("gemv_rows = 3\n")
    with pytest.raises(BadInput, match="unknown schedule config key"):
        load_config(p)
    p.write_text("gemv_rows_per_task = [\n")
    with pytest.raises(BadInput, match="not valid TOML"):
        load_config(p)


def test_position_outside_the_cache_is_rejected(h200):
    m = tiny_model("llama")
    with pytest.raises(BadInput, match="outside the KV cache"):
        lower(m, ScheduleConfig(kv_max_tokens=32), h200, 32)


# ---------------------------------------------------------------------------------------------- CLI

def test_lower_cli_writes_a_validated_schedule(tiny_checkpoint, tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("gemv_rows_per_task = 8\nnum_sms = 16\n")
    out = tmp_path / "s.json"
    with pytest.raises(SystemExit) as exc:
        main(["amk", "lower", "--model", str(tiny_checkpoint("qwen2")), "--config", str(cfg), "--position", "3",
              "-o", str(out)])
    assert exc.value.code == 0, capsys.readouterr().err
    assert "validated: safe" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["format"] == "mosaic-amk-schedule" and data["version"] == 1 and data["num_sms"] == 16
    s = Schedule.from_json(data)
    assert s.meta["position"] == 3 and validate(s).ok


def test_lower_cli_refuses_to_write_an_unsafe_schedule(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import mosaic_amk.lowering as lowering

    real = lowering.lower

    def drop_a_wait(*args, **kwargs):  # a lowering bug: attention no longer waits for the K append
        import attrs
        s = real(*args, **kwargs)
        tasks = [attrs.evolve(t, waits=t.waits[:1]) if t.op == "attention" else t for t in s.tasks]
        return attrs.evolve(s, tasks=tuple(tasks))

    monkeypatch.setattr(lowering, "lower", drop_a_wait)
    out = tmp_path / "s.json"
    with pytest.raises(SystemExit) as exc:
        main(["amk", "lower", "--model", str(tiny_checkpoint("llama")), "-o", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "unsafe schedule" in err and "not written" in err
    assert not out.exists()
