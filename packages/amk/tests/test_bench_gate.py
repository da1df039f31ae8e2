"""The bench's and the tuner's correctness gate (mosaic_amk.bench.gate): parity criterion (2), with HF's envelope
measured once and each candidate teacher-forced over HF's tokens. CPU: HF eager float32 and the ReferenceVM on a tiny
checkpoint (a correct schedule passes with zero decisive disagreements; the same VM with one damaged weight fails);
GPU: ``run_bench`` records the envelope once and a verdict per candidate."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from mosaic_amk.bench import gate
from mosaic_amk.config import CUDA_DEFAULT, ScheduleConfig
from mosaic_amk.importer import import_checkpoint, load_hf
from mosaic_amk.parity import PARITY_PROMPTS
from mosaic_amk.reference_vm import ReferenceVM


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    d = tiny_checkpoint("smollm2")
    spec = import_checkpoint(d)
    model, _ = load_hf(d, eager=True)
    prompts = gate.gate_prompts(str(d), spec.vocab_size, 3)
    return d, spec, gate.measure_envelope(model, prompts, 12)


def test_envelope_is_measured_from_hf_variants_over_the_reference_tokens(tiny):
    _, spec, env = tiny
    assert len(env.prompts) == 3 and env.n_tokens == 12
    assert [name for name, _ in env.variants] == ["hf-static-cache", "hf-eager-uncached", "hf-eager-batch3"]
    for _, fs in env.variants:
        assert [f.positions for f in fs] == [12, 12, 12]
    # float32 HF against itself: the variants flip nothing on this model, so the envelope is 0 ulps
    assert env.k == 0 and env.flips() == {"hf-static-cache": 0, "hf-eager-uncached": 0, "hf-eager-batch3": 0}
    for tokens, logits in env.reference:
        assert len(tokens) == 12 and all(lg.shape == (spec.vocab_size,) for lg in logits)
        assert tokens == [int(np.argmax(lg)) for lg in logits]
    j = env.to_json()
    assert j["envelope_ulps"] == 0 and j["prompts"] == 3 and j["tokens"] == 12


@pytest.mark.parametrize("config", [ScheduleConfig(), CUDA_DEFAULT], ids=["default", "cuda-default"])
def test_reference_vm_passes_criterion_2(tiny, config):
    _, spec, env = tiny
    v = gate.judge(env, gate.reference_vm_candidate(ReferenceVM(spec, config)))
    assert v.positions == 36
    assert v.ok and v.decisive == 0, gate.verdict_line(v)
    j = gate.verdict_json(v)
    assert j["ok"] is True and j["decisive"] == 0 and j["positions"] == 36 and j["decisive_at"] == []
    assert gate.verdict_line(v).endswith("PASS")


def test_a_damaged_weight_fails_with_decisive_disagreements(tiny):
    _, spec, env = tiny
    name = "model.layers.1.mlp.down_proj.weight"
    damaged = attrs.evolve(spec, weights={**spec.weights, name: spec.weights[name] * 1.5})
    v = gate.judge(env, gate.reference_vm_candidate(ReferenceVM(damaged, CUDA_DEFAULT)))
    assert not v.ok and v.decisive > 0
    j = gate.verdict_json(v)
    assert j["ok"] is False and j["decisive"] == v.decisive and j["decisive_at"]
    first = j["decisive_at"][0]
    assert first["gap_ulps"] > env.k and first["ref_token"] != first["other_token"]
    assert gate.verdict_line(v).endswith("FAIL")


def test_gate_prompts_without_a_tokenizer_are_seeded_ids_from_1(tiny):
    d, spec, _ = tiny
    a = gate.gate_prompts(str(d), spec.vocab_size, 8)
    assert a == gate.gate_prompts(None, spec.vocab_size, 8)  # the tiny checkpoint has no tokenizer
    assert len(a) == 8 and all(len(p) == 8 for p in a)
    assert all(1 <= i < spec.vocab_size for p in a for i in p)  # token 0 is generate's pad id
    assert gate.gate_prompts(None, spec.vocab_size, 8, seed=1) != a


def test_model_dir_of(tiny, tmp_path):
    d, _, _ = tiny
    model, _ = load_hf(d, eager=True)
    assert gate.model_dir_of(model) == str(d)

    class NoConfig:
        pass

    assert gate.model_dir_of(NoConfig()) is None


@pytest.mark.slow
def test_gate_prompts_of_the_real_checkpoint_are_the_parity_prompts(smollm2_checkpoint):
    from mosaic_amk.text import encode, load_tokenizer

    tok = load_tokenizer(smollm2_checkpoint)
    got = gate.gate_prompts(str(smollm2_checkpoint), 49152, 8)
    assert got == [encode(tok, p) for p in PARITY_PROMPTS]


def test_judge_needs_one_run_per_prompt(tiny):
    _, spec, env = tiny
    with pytest.raises(ValueError):
        gate.judge(env, lambda p, t: ([0] * (len(t) - 1), [np.zeros(spec.vocab_size, np.float32)] * (len(t) - 1)))


@pytest.mark.gpu
def test_run_bench_gates_each_candidate_with_criterion_2(cuda_device, gpu_model):
    """On the GPU: the envelope is measured once (static cache + CUDA graph, batch), every candidate carries its
    verdict; a passing one is timed, and the table prints the verdicts."""
    from mosaic_amk.bench.bench import format_table, run_bench

    model, spec, _, gpu = gpu_model("tiny-smollm2")
    cands = [("cuda-default", CUDA_DEFAULT), ("default", ScheduleConfig())]
    res = run_bench(model, spec, gpu, cands, rounds=1, steps=8, gate_tokens=8, variants=False, eager=False,
                    graph=False, log=lambda m: None)
    g = res["gate"]
    assert g["prompts"] == 8 and g["tokens"] == 8 and isinstance(g["envelope_ulps"], int)
    assert set(g["variant_flips"]) == {"hf-static-cache", "hf-eager-batch8"}
    for entry in res["candidates"]:
        assert "error" not in entry, entry.get("error")
        assert "gate" not in entry  # set only for a candidate that fails
        v = entry["verdict"]
        assert v["criterion"] == "bf16-near-tie" and v["positions"] == 64 and v["launch_consistent"] is True
        assert v["ok"] and v["decisive"] == 0, v["line"]
    timed = [c for c in res["contenders"] if c["name"].startswith("amk[")]
    assert len(timed) == 2 and all(c["ms_per_token"] for c in timed)
    table = format_table(res)
    assert "gate, criterion (2): envelope" in table and "candidate default: criterion (2)" in table


@pytest.mark.gpu
def test_run_bench_times_only_the_fastest_by_one_selection_sample(cuda_device, gpu_model):
    """time_best=1 with two passing candidates: both carry a selection sample, only the faster one is timed over the
    rounds (and probed), the other is recorded as passed and not timed."""
    from mosaic_amk.bench.bench import run_bench

    model, spec, _, gpu = gpu_model("tiny-smollm2")
    cands = [("cuda-default", CUDA_DEFAULT), ("default", ScheduleConfig())]
    res = run_bench(model, spec, gpu, cands, rounds=2, steps=8, gate_tokens=8, eager=False, graph=False,
                    log=lambda m: None, time_best=1, probe_only=("skip all ops (sync skeleton)",))
    sel = res["selection"]
    assert set(sel["samples_ms"]) == {"cuda-default", "default"} and all(sel["samples_ms"].values())
    kept = min(sel["samples_ms"], key=sel["samples_ms"].get)
    assert sel["kept"] == [kept] and res["probed"] == [kept] and res["rounds_run"] == 2
    timed = [c["name"] for c in res["contenders"]]
    assert timed == [f"amk[{kept}]", f"amk probe[{kept}]: skip all ops (sync skeleton)"]
    other = next(c for c in res["candidates"] if c["name"] != kept)
    assert other["verdict"]["ok"] and "gate" not in other and other["not_timed"].startswith("outside the fastest 1")


@pytest.mark.parametrize("family, tied", [("llama", False), ("smollm2", True)])
def test_floor_bytes_counts_every_weight_once_and_one_row_of_a_gathered_table(family, tied):
    """bench.floor_bytes: every weight a non-embed task reads, whole; of a table only the embed task gathers, one row
    in its device bytes (nbytes // rows, so a quantized table's blocks and scales count too)."""
    from mosaic.plugins import host
    from mosaic_amk.bench.bench import floor_bytes
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.cuda_vm import cuda_config
    from mosaic_amk.lowering import lower
    from mosaic_amk.tiny_models import tiny_model

    spec = tiny_model(family)
    enc = E.encode(lower(spec, cuda_config(CUDA_DEFAULT, 64), host().get("gpus", "h200"), 0))
    weights = [b for b in enc.buffers if b.kind == "weight"]
    embed = next(b for b in weights if b.name == "model.embed_tokens.weight")
    total = sum(b.nbytes for b in weights)
    want = total if tied else total - embed.nbytes + embed.nbytes // spec.vocab_size
    assert floor_bytes(enc) == want
    assert embed.nbytes // spec.vocab_size == spec.hidden_size * 2  # bf16 rows


def test_format_table_prints_the_envelope_and_every_candidates_verdict():
    from mosaic_amk.bench.bench import format_table

    res = {"model": "llama", "layers": 30, "hidden": 576, "vocab": 49152, "params": 134.5e6, "gpu": "h200",
           "gate": {"envelope_ulps": 3, "prompts": 8, "tokens": 32,
                    "variant_flips": {"hf-static-cache-graph": 2, "hf-eager-batch8": 5}},
           "candidates": [
               {"name": "a", "verdict": {"line": "criterion (2): 256 positions, 1 disagreements, 1 near-ties "
                                                 "(<= 3 ulps), 0 decisive: PASS"}},
               {"name": "b", "verdict": {"line": "x"}, "gate": "criterion (2): ... 4 decisive: FAIL: not timed"},
               {"name": "c", "error": "DeviceError: launch failed"}],
           "contenders": [{"name": "amk[a]", "ms_per_token": 0.75, "samples": [0.75], "error": None}]}
    table = format_table(res)
    assert ("gate, criterion (2): envelope 3 bf16 ulps of HF's own variants (hf-static-cache-graph: 2 flips, "
            "hf-eager-batch8: 5 flips) over 8 prompts x 32 tokens") in table
    assert "candidate a: criterion (2): 256 positions, 1 disagreements, 1 near-ties (<= 3 ulps), 0 decisive: PASS" in table
    assert "candidate b: criterion (2): ... 4 decisive: FAIL: not timed" in table
    assert "candidate c: DeviceError: launch failed" in table


def test_fastest_keeps_the_smallest_samples_and_never_a_failed_one():
    """The bench's selection (run_bench time_best): the n smallest one-sample times, fastest first; a candidate whose
    sample failed (None) is never kept, ties keep the candidates' order, and keeping none is refused."""
    from mosaic_amk.bench.bench import fastest

    s = {"a": 0.70, "b": None, "c": 0.66, "d": 0.70, "e": 0.68}
    assert fastest(s, 3) == ["c", "e", "a"]
    assert fastest(s, 10) == ["c", "e", "a", "d"]
    assert fastest({"x": None}, 2) == []
    with pytest.raises(ValueError):
        fastest(s, 0)
