"""``mosaic amk tune`` (mosaic_amk.tune): the knob table as data, proposals, the screen (check, lowering, static
validation before any launch), the criterion (2) gate on the ReferenceVM, the keep/revert and roofline rules, the
journal and --resume, the report; CPU end to end with ``--vm reference`` on a tiny checkpoint. The timing step
needs the GPU (the ``gpu`` test at the end)."""

from __future__ import annotations

import json

import attrs
import pytest
from mosaic.cli import main
from mosaic.errors import BadInput
from mosaic.plugins import host
from mosaic_amk import ops, tune
from mosaic_amk.config import CUDA_DEFAULT, VM_FUSIONS, ScheduleConfig, load_config
from mosaic_amk.tiny_models import tiny_model


@pytest.fixture(scope="module")
def h200():
    return host().get("gpus", "h200")


# ------------------------------------------------------------------------------------------------ the knob table


def test_every_knob_is_a_schedule_config_field_or_a_gemv_define_with_values_it_accepts():
    from mosaic_amk.cuda.build import _DEFINE

    fields = {a.name for a in attrs.fields(ScheduleConfig)}
    seen = set()
    for k in tune.KNOBS:
        assert k.field not in seen and k.values and k.why
        seen.add(k.field)
        assert all(f in fields or f in tune.GEMV_DEFINES for f, _ in k.needs)
        if k.define:  # a GEMV build define: one the VM build allows, with its default among the values
            assert k.field in tune.GEMV_DEFINES and k.build and tune.GEMV_DEFINES[k.field] in k.values
            assert all(_DEFINE.match(f"{k.field}={v}") for v in k.values)
            continue
        assert k.field in fields
        for v in k.values:  # each value is one ScheduleConfig accepts from the defaults or from CUDA_DEFAULT
            ok = []
            for base in (ScheduleConfig(), CUDA_DEFAULT):
                try:
                    attrs.evolve(base, **{k.field: v})
                    ok.append(True)
                except (ValueError, TypeError):
                    ok.append(False)
            assert any(ok), (k.field, v)
    # the build variants (a new nvcc build each) come after every launch-flag / schedule knob
    builds = [k.build for k in tune.KNOBS]
    assert builds == sorted(builds) and any(builds) and not all(builds)


def test_gemv_defines_are_proposed_only_where_the_build_allows_them():
    # CUDA_DEFAULT has the weight preload, which needs GEMV body 1: no body-2 proposal
    assert not [p for p in tune.proposals(CUDA_DEFAULT, tune.KNOBS, set()) if p.knob.startswith("AMK_")]
    plain = attrs.evolve(CUDA_DEFAULT, weight_preload=0)
    props = [p for p in tune.proposals(plain, tune.KNOBS, set()) if p.knob.startswith("AMK_")]
    assert [(p.knob, p.value, p.was, p.defines, p.config) for p in props] == [
        ("AMK_GEMV_IMPL", 2, 1, ("AMK_GEMV_IMPL=2",), plain)]
    # with body 2: its depth, and no preload / stream proposals
    body2 = ("AMK_GEMV_IMPL=2",)
    props = list(tune.proposals(plain, tune.KNOBS, set(), body2))
    assert [(p.value, p.defines) for p in props if p.knob == "AMK_GEMV_DEPTH"] == [
        (4, ("AMK_GEMV_DEPTH=4", "AMK_GEMV_IMPL=2")), (12, ("AMK_GEMV_DEPTH=12", "AMK_GEMV_IMPL=2")),
        (16, ("AMK_GEMV_DEPTH=16", "AMK_GEMV_IMPL=2"))]
    assert not [p for p in props if p.knob in ("weight_preload", "weight_stream")]
    assert all(p.defines == body2 for p in props if not p.knob.startswith("AMK_"))
    back = [p for p in props if p.knob == "AMK_GEMV_IMPL"]
    assert [(p.value, p.defines) for p in back] == [(1, ())]  # the default is not written out
    # tried keys tell the defines apart
    assert tune.config_key(plain, body2) != tune.config_key(plain)
    with pytest.raises(BadInput, match="not a tune build define"):
        tune.define_map(["AMK_TRACE=1"])


def test_knob_table_by_name():
    assert tune.knob_table(None) == tune.KNOBS
    assert [k.field for k in tune.knob_table(["fusion", "wait_mode"])] == ["wait_mode", "fusion"]  # table order
    with pytest.raises(BadInput, match="unknown tune knob"):
        tune.knob_table(["wait_mode", "warp_speed"])


def test_proposals_follow_the_table_skip_the_incumbent_value_unmet_needs_and_tried_configs():
    props = list(tune.proposals(CUDA_DEFAULT, tune.KNOBS, set()))
    first = props[0]
    assert (first.knob, first.value, first.was) == ("wait_mode", "acquire", "relaxed")
    assert first.config == attrs.evolve(CUDA_DEFAULT, wait_mode="acquire")
    assert all(p.value != p.was for p in props)
    # gemv_rows_per_task needs gemv_split rows: CUDA_DEFAULT is balanced
    assert "gemv_rows_per_task" not in {p.knob for p in props}
    order = [k.field for k in tune.KNOBS]
    assert [order.index(p.knob) for p in props] == sorted(order.index(p.knob) for p in props)
    # a value ScheduleConfig refuses with the incumbent's other fields is proposed as refused (not built)
    refused = [p for p in props if p.config is None]
    assert [(p.knob, tuple(p.value)) for p in refused] == [("fusion", ("residual", "gate_up_silu", "rope_append"))]
    assert "rope_order" in refused[0].error
    # a refused change is not proposed again once tried (keyed by the incumbent and the change)
    key = tune.refused_key(CUDA_DEFAULT, "fusion", refused[0].value)
    assert all(p.config is not None for p in tune.proposals(CUDA_DEFAULT, tune.KNOBS, {key}))
    # a config already tried is not proposed again
    tried = {tune.config_key(first.config)}
    again = list(tune.proposals(CUDA_DEFAULT, tune.KNOBS, tried))
    assert len(again) == len(props) - 1 and again[0].knob == "signal_mode"
    # from the defaults (gemv_split rows), gemv_rows_per_task is proposed
    assert "gemv_rows_per_task" in {p.knob for p in tune.proposals(ScheduleConfig(), tune.KNOBS, set())}


# ------------------------------------------------------------------------------------------------ the screen


def test_screen_passes_a_safe_config_and_gives_the_config_the_vm_runs(h200):
    spec = tiny_model("smollm2")
    s = tune.screen(spec, CUDA_DEFAULT, h200, (0, 30), 64)
    assert s.ok and s.stage == "screen" and s.tasks > 0 and "safe at positions [0, 30]" in s.reason
    assert s.config.kv_max_tokens == 64 and s.config.rope_order == CUDA_DEFAULT.rope_order


@pytest.mark.parametrize("change, stage, words", [
    ({"threads_per_block": 2048}, "does-not-fit", "max_threads_per_block"),
    ({"kv_max_tokens": 16}, "lowering", "outside the KV cache"),
    ({"kv_max_tokens": 2 ** 34}, "unsafe", "the validator rejects it (capacity)"),
])
def test_screen_rejects_before_any_launch(h200, change, stage, words):
    s = tune.screen(tiny_model("smollm2"), attrs.evolve(ScheduleConfig(), **change), h200, (0, 30), 64)
    assert not s.ok and s.stage == stage and words in s.reason and s.config is None


# ------------------------------------------------------------------------------------------------ decisions


def test_keep_only_when_faster_than_the_incumbent_by_more_than_the_noise():
    d = tune.decide_times(0.70, 0.75, 0.01, 0.06)
    assert d.accepted and d.reason_code == "faster"
    d = tune.decide_times(0.745, 0.75, 0.01, 0.06)  # within the noise: a null result, reverted
    assert not d.accepted and d.reason_code == "null"
    d = tune.decide_times(0.80, 0.75, 0.01, 0.06)
    assert not d.accepted and d.reason_code == "slower"


def test_a_time_below_the_weight_traffic_floor_is_refused_as_a_measurement_error():
    d = tune.decide_times(0.05, 0.75, 0.01, 0.06)
    assert not d.accepted and d.reason_code == "below-floor" and "measurement is wrong" in d.reason


def test_reason_text_names_the_verdict_and_the_times():
    text = tune.reason_text("below-floor", 0.05, 0.75, 0.01, 0.06)
    assert text.startswith("below the weight-traffic floor: a measurement error")
    assert "0.0500 vs 0.7500 ms/token" in text and "floor 0.0600 ms" in text
    assert tune.reason_text("faster", 0.7, 0.75, 0.01, 0.06).startswith("faster than the incumbent by more than")


def test_roofline_stop():
    assert tune.near_floor(0.065, 0.06, 0.10) and not tune.near_floor(0.07, 0.06, 0.10)
    assert not tune.near_floor(0.065, 0.0, 0.10)  # no floor known: never stops on it


def test_interleave_alternates_the_order():
    calls = []

    def sampler(name, value):
        return lambda: calls.append(name) or value

    a, b = tune.interleave(sampler("inc", 2.0), sampler("cand", 1.0), 4)
    assert calls == ["inc", "cand", "cand", "inc", "inc", "cand", "cand", "inc"]
    assert a == [2.0] * 4 and b == [1.0] * 4


def test_noise_is_measured_from_interleaved_self_pairs():
    values = iter([1.00, 1.02, 0.98, 1.01, 0.99, 1.00, 1.03, 0.97, 1.00, 1.01] * 3)
    n = tune.noise_of(lambda: next(values), pairs=5, runs=3)
    assert n.blocks == 10 and n.runs_per_block == 3 and len(n.differences) == 5 and n.value > 0


# ------------------------------------------------------------------------------------------------ the journal


def test_replay_applies_every_kept_trial_in_order(tmp_path):
    start = CUDA_DEFAULT
    a = attrs.evolve(start, wait_mode="acquire")
    b = attrs.evolve(a, prefetch_depth=1)
    c = attrs.evolve(b, signal_mode="side")
    recs = [{"kind": "start", "config": start.to_json()},
            {"kind": "trial", "trial": 1, "config": a.to_json(), "decision": "kept"},
            {"kind": "noise", "incumbent_ms": 1.0},
            {"kind": "trial", "trial": 2, "config": None, "decision": "rejected", "key": "refused x"},
            {"kind": "trial", "trial": 3, "config": b.to_json(), "decision": "kept"},
            {"kind": "trial", "trial": 4, "config": c.to_json(), "decision": "reverted"}]
    st = tune.replay(recs)
    assert st.start == start and st.incumbent == b and st.trials == 4 and st.kept == 2 and st.defines == ()
    d = attrs.evolve(b, weight_preload=0)
    more = [*recs, {"kind": "trial", "trial": 5, "config": d.to_json(), "decision": "kept"},
            {"kind": "trial", "trial": 6, "config": d.to_json(), "defines": ["AMK_GEMV_IMPL=2"], "decision": "kept"}]
    st2 = tune.replay(more)
    assert st2.incumbent == d and st2.defines == ("AMK_GEMV_IMPL=2",) and st2.kept == 4
    assert tune.config_key(d, ("AMK_GEMV_IMPL=2",)) in st2.tried and tune.config_key(d) in st2.tried
    with pytest.raises(BadInput, match="not a tune build define"):
        tune.replay([*recs, {"kind": "trial", "trial": 5, "config": d.to_json(), "defines": ["AMK_X=1"]}])
    assert st.tried == {tune.config_key(x) for x in (start, a, b, c)} | {"refused x"}
    with pytest.raises(BadInput, match="start record"):
        tune.replay(recs[1:])
    j = tune.Journal(tmp_path / "j.jsonl")
    for r in recs:
        j.append(r)
    assert j.read() == recs
    (tmp_path / "bad.jsonl").write_text('{"kind": "start"}\nnot json\n')
    with pytest.raises(BadInput, match="line 2 is not JSON"):
        tune.Journal(tmp_path / "bad.jsonl").read()


def test_config_toml_reads_back_as_the_same_config(tmp_path):
    cfg = attrs.evolve(CUDA_DEFAULT, wait_mode="acquire", num_sms=120, weight_preload=0)
    text = tune.config_toml(cfg, ("AMK_GEMV_DEPTH=4", "AMK_GEMV_IMPL=2"))
    (tmp_path / "best.toml").write_text(text)
    assert load_config(tmp_path / "best.toml") == cfg
    assert "# GEMV build defines (CudaVM extra_defines, not config fields): AMK_GEMV_DEPTH=4 AMK_GEMV_IMPL=2" in text


# ------------------------------------------------------------------------------------------------ end to end (CPU)


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["amk", "tune", *argv])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


SMALL = ["--vm", "reference", "--prompts", "2", "--tokens", "6"]


def test_tune_reference_screens_and_gates_every_trial_and_resumes(tiny_checkpoint, tmp_path, capsys):
    ck, out = str(tiny_checkpoint("smollm2")), tmp_path / "run"
    knobs = ["--knobs", "wait_mode,gemv_split,num_sms"]
    code, stdout, err = _run(["--model", ck, "-o", str(out), "--max-trials", "2", *knobs, *SMALL], capsys)
    assert code == 0, err
    recs = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in recs]
    assert kinds == ["start", "envelope", "incumbent", "trial", "trial", "stop"]
    assert recs[0]["vm"] == "reference" and recs[0]["config"] == CUDA_DEFAULT.to_json()
    assert recs[0]["knobs"] == ["wait_mode", "gemv_split", "num_sms"]
    assert recs[1]["envelope_ulps"] == 0 and recs[1]["prompts"] == 2 and recs[1]["tokens"] == 6
    assert recs[2]["gate"]["ok"] and "safe at positions" in recs[2]["screen"]
    t1, t2 = (r for r in recs if r["kind"] == "trial")
    # wait_mode is a launch flag: the lowered schedules are the incumbent's, so the ReferenceVM verdict is too
    assert (t1["trial"], t1["knob"], t1["value"], t1["stage"], t1["decision"]) == (1, "wait_mode", "acquire",
                                                                                   "screen", "screened")
    assert t1["same_schedules"] is True and "gate" not in t1 and "the same lowered schedules" in t1["reason"]
    # gemv_split rows lowers other schedules: validated, then gated with criterion (2) on the ReferenceVM
    assert (t2["trial"], t2["knob"], t2["value"], t2["stage"], t2["decision"]) == (2, "gemv_split", "rows", "gate",
                                                                                   "screened")
    assert t2["same_schedules"] is False and "safe at positions" in t2["screen"] and "timing" not in t2
    assert t2["gate"]["ok"] and t2["gate"]["positions"] == 12 and t2["gate"]["decisive"] == 0
    assert recs[-1]["reason"] == "2 trials"
    assert "| 1 | wait_mode | acquire | relaxed | screen | screened |" in stdout
    assert "| 2 | gemv_split | rows | balanced | gate | screened |" in stdout
    assert (out / "report.md").read_text().strip() == stdout.split("\nwrote ")[0].strip()
    assert load_config(out / "best.toml") == CUDA_DEFAULT  # nothing kept without timing

    # the same -o again without --resume: one line, exit 2
    code, _, err = _run(["--model", ck, "-o", str(out), *knobs, *SMALL], capsys)
    assert code == 2 and "pass --resume" in err and len(err.strip().splitlines()) == 1

    # --resume continues the numbering, never proposes a tried config again, and ends the pass
    code, stdout, err = _run(["--model", ck, "-o", str(out), "--resume", *knobs, *SMALL], capsys)
    assert code == 0, err
    recs = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    trials = [r for r in recs if r["kind"] == "trial"]
    assert [(t["trial"], t["knob"], t["value"]) for t in trials] == [
        (1, "wait_mode", "acquire"), (2, "gemv_split", "rows"), (3, "num_sms", 128), (4, "num_sms", 120)]
    assert all(t["gate"]["ok"] for t in trials[2:])
    keys = [json.dumps(t["config"], sort_keys=True) for t in trials]
    assert len(set(keys)) == 4 and json.dumps(CUDA_DEFAULT.to_json(), sort_keys=True) not in keys
    assert [r["kind"] for r in recs].count("start") == 1
    assert recs[-1]["reason"].startswith("every single-knob change of the incumbent screened and gated")
    assert "| 4 | num_sms | 120 | 0 | gate | screened |" in stdout


def test_tune_rejects_unsafe_and_unlowerable_schedules_before_the_gate(tiny_checkpoint, tmp_path, capsys):
    """Knob tables are data: a table whose values lower to a schedule the validator rejects, or that lowering
    refuses, is screened out before anything runs (no gate record)."""
    from mosaic_amk.bench.gate import gate_prompts, measure_envelope
    from mosaic_amk.importer import import_checkpoint, load_hf

    ck = tiny_checkpoint("smollm2")
    spec, (model, _) = import_checkpoint(ck), load_hf(ck, eager=True)
    env = measure_envelope(model, gate_prompts(None, spec.vocab_size, 2), 6)
    gpu = host().get("gpus", "h200")
    j = tune.Journal(tmp_path / "journal.jsonl")
    j.append({"kind": "start", "config": CUDA_DEFAULT.to_json()})
    table = (tune.Knob("kv_max_tokens", (2 ** 34, 16, 64), "test: too large, too small, enough"),)
    settings = tune.Settings(positions=(0, 20), max_positions=24)  # the screen lowers at 20
    st = tune.State(CUDA_DEFAULT, CUDA_DEFAULT, {tune.config_key(CUDA_DEFAULT)})
    tune.run_loop(tune.ReferenceBackend(spec, gpu, env), spec, gpu, j, st, table, settings, log=lambda m: None)
    trials = [r for r in j.read() if r["kind"] == "trial"]
    assert [(t["value"], t["stage"], t["decision"]) for t in trials] == [
        (2 ** 34, "unsafe", "rejected"), (16, "lowering", "rejected"), (64, "gate", "screened")]
    assert "gate" not in trials[0] and "gate" not in trials[1] and trials[2]["gate"]["ok"]
    assert "capacity" in trials[0]["reason"]


def test_tune_gate_rejects_a_candidate_whose_schedule_computes_a_wrong_token(tiny_checkpoint, tmp_path, capsys,
                                                                              monkeypatch):
    """The argmax op (used only without split_argmax) returns the wrong token: the trial that drops split_argmax
    fails criterion (2) with decisive disagreements; the incumbent (split argmax) passes."""
    real = ops.KERNELS["argmax"]
    vocab = tiny_model("smollm2").vocab_size

    def wrong_argmax(ins, outs, p):
        real(ins, outs, p)
        outs[0][0] = (outs[0][0] + 1) % vocab

    monkeypatch.setitem(ops.KERNELS, "argmax", wrong_argmax)
    out = tmp_path / "run"
    code, stdout, err = _run(["--model", str(tiny_checkpoint("smollm2")), "-o", str(out), "--knobs", "fusion",
                              *SMALL], capsys)
    assert code == 0, err
    trials = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines() if '"trial"' in x]
    by_value = {tuple(t["value"]): t for t in trials}
    bad = by_value[tuple(VM_FUSIONS)]
    assert bad["stage"] == "gate" and bad["decision"] == "rejected" and bad["gate"]["decisive"] > 0
    assert "FAIL" in bad["reason"]
    assert by_value[("residual", "gate_up_silu", "rope_append")]["stage"] == "invalid"  # needs rope_order standard


def test_tune_refuses_an_incumbent_that_fails_the_gate(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    real = ops.KERNELS["argmax"]
    monkeypatch.setitem(ops.KERNELS, "argmax", lambda i, o, p: (real(i, o, p), o[0].__setitem__(0, 1)))
    cfg = tmp_path / "plain.toml"
    cfg.write_text("fusion = [\"residual\", \"gate_up_silu\", \"rope_append\"]\n")
    code, _, err = _run(["--model", str(tiny_checkpoint("smollm2")), "-o", str(tmp_path / "run"), "--config",
                         str(cfg), *SMALL], capsys)
    assert code == 1 and "incumbent config fails criterion (2)" in err
    recs = [json.loads(x) for x in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    assert recs[-1]["kind"] == "incumbent" and recs[-1]["gate"]["ok"] is False and recs[-1]["gate"]["decisive"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--model", "/nonexistent/ckpt"], "not a checkpoint directory"),
    (["--knobs", "warp_speed"], "unknown tune knob"),
    (["--resume"], "--resume: no tune journal here"),
    (["--vm", "cuda"], "the CUDA VM needs cupy"),  # no GPU stack here
    (["--gpu", "nope"], "nope"),
])
def test_tune_bad_input_is_one_line_and_exit_2(tiny_checkpoint, tmp_path, capsys, argv, message):
    args = ["--model", str(tiny_checkpoint("smollm2")), "-o", str(tmp_path / "run"), "--vm", "reference", *argv]
    code, _, err = _run(args, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_tune_resume_refuses_another_runs_journal(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "journal.jsonl").write_text(json.dumps({"kind": "start", "model": "/elsewhere", "gpu": "h200",
                                                   "vm": "reference", "config": CUDA_DEFAULT.to_json()}) + "\n")
    code, _, err = _run(["--model", str(tiny_checkpoint("smollm2")), "-o", str(out), "--resume", *SMALL], capsys)
    assert code == 2 and "not this run's" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------------ the GPU loop


@pytest.mark.gpu
def test_tune_cuda_times_interleaved_and_keeps_only_beyond_the_noise(cuda_device, tiny_checkpoint, tmp_path):
    """On the GPU: the incumbent's noise and floor are measured, each timed trial has interleaved samples of both,
    a kept trial is faster than the incumbent by more than the noise, nothing below the floor is kept."""
    out = tmp_path / "run"
    recs = tune.tune(str(tiny_checkpoint("smollm2")), "h200", str(out), vm="cuda",
                     settings=tune.Settings(max_trials=4, rounds=5), n_prompts=2, n_tokens=8, steps=16,
                     log=lambda m: None)
    noise = [r for r in recs if r["kind"] == "noise"]
    assert noise and noise[0]["floor_ms"] > 0 and noise[0]["noise_ms"] >= 0
    timed = [r for r in recs if r["kind"] == "trial" and "timing" in r]
    assert timed
    for t in timed:
        tm = t["timing"]
        assert len(tm["candidate_samples"]) == 5 and len(tm["incumbent_samples"]) == 5
        if t["decision"] == "kept":
            assert tm["candidate_ms"] < tm["incumbent_ms"] - tm["noise_ms"]
            assert tm["candidate_ms"] >= tm["floor_ms"]
    assert (out / "report.md").is_file() and (out / "best.toml").is_file()
