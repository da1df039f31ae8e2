"""Hostile AMK input, as a shared schedule, config or checkpoint would bring it: every case is refused with
one line ``error: … (…)`` and exit 2 (or an honest exit 1 for an unsafe schedule), never a traceback, no
unbounded memory or time. Each fixture is generated here, not committed."""

import json
import random
import tracemalloc

import pytest
from mosaic.cli import main
from mosaic_amk.validate import validate, validate_rules
from mosaic_amk.validate.clocks import inclusive_clocks, slots_of
from mosaic_amk.validate.facts import Facts


def cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["amk", *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def refused(capsys, args, *needles, rc=2) -> str:
    """Exit ``rc``, one ``error:`` line on stderr naming every needle, no traceback."""
    code, out, err = cli(capsys, *args)
    assert code == rc, (code, out, err)
    assert "Traceback" not in out + err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def chain(n: int, kind: str = "fanout", nsm: int = 132) -> dict:
    """A safe dependency chain: task i waits for task i-1 (its own counter). ``fanout``: every task also
    reads x0, written by task 0 (ordered only transitively, through the whole chain); ``pingpong``: two
    buffers overwritten in turn (write-after-read, ordered transitively)."""
    bufs = [{"name": "inp", "dtype": "f32", "shape": [4], "kind": "input"}]
    tasks = []
    if kind == "pingpong":
        bufs += [{"name": f"x{k}", "dtype": "f32", "shape": [4], "kind": "activation"} for k in (0, 1)]
        for i in range(n):
            a = "inp" if i == 0 else f"x{(i - 1) % 2}"
            tasks.append({"id": i, "op": "add", "sm": i % nsm, "inputs": [a, "inp"], "outputs": [f"x{i % 2}"],
                          "waits": [] if i == 0 else [{"counter": i - 1, "threshold": 1}], "signal": i,
                          "params": {}})
        out = f"x{(n - 1) % 2}"
    else:
        bufs += [{"name": f"x{i}", "dtype": "f32", "shape": [4], "kind": "activation"} for i in range(n)]
        for i in range(n):
            ins = ["inp", "inp"] if i == 0 else [f"x{i - 1}", "x0"]
            tasks.append({"id": i, "op": "add", "sm": i % nsm, "inputs": ins, "outputs": [f"x{i}"],
                          "waits": [] if i == 0 else [{"counter": i - 1, "threshold": 1}], "signal": i,
                          "params": {}})
        out = f"x{n - 1}"
    return {"format": "mosaic-amk-schedule", "version": 1, "num_sms": nsm, "buffers": bufs,
            "num_counters": n, "tasks": tasks, "outputs": [out]}


# -- 1. schedule files are read through mosaic.limits --------------------------------------------------------

def test_validate_dev_zero_is_refused_without_reading(capsys):
    refused(capsys, ["validate", "/dev/zero"], "not a regular file", "/dev/zero")


def test_validate_a_directory_and_a_missing_file(tmp_path, capsys):
    refused(capsys, ["validate", str(tmp_path)], "directory")
    refused(capsys, ["validate", str(tmp_path / "nope.json")], "no such file")


@pytest.mark.parametrize("text, needle", [
    ("[" * 100_000, "nested"),  # RecursionError in the parser
    ("[" * 70 + "]" * 70, "nesting"),  # over the depth limit, parses
    ('{"format": "mosaic-amk-schedule", "version": 1, "num_sms": ' + "9" * 5000 + "}", "digits"),
    ('{"format": "mosaic-amk-schedule", "version": 1, "num_sms": NaN}', "NaN"),
    ('{"format": "mosaic-amk-schedule", "version": 1, "num_sms": -Infinity}', "Infinity"),
    ('{"format": "mosaic-amk-schedule", "version": 1, "meta": {"a": "' + "[" * 500 + '"}}', None),
])
def test_hostile_schedule_json_is_one_line(tmp_path, capsys, text, needle):
    p = tmp_path / "s.json"
    p.write_text(text)
    code, out, err = cli(capsys, "validate", str(p))
    assert "Traceback" not in out + err
    if needle is None:  # brackets inside a string are no nesting: an (unsafe) schedule, not a refusal
        assert code in (1, 2)
        return
    refused(capsys, ["validate", str(p)], needle, str(p))


def test_schedule_over_the_task_limit_is_refused(tmp_path, capsys, monkeypatch):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(chain(50)))
    code, out, _ = cli(capsys, "validate", str(p))
    assert code == 0 and "safe (50 tasks)" in out
    monkeypatch.setenv("MOSAIC_LIMIT_SCHEDULE_TASKS", "49")
    refused(capsys, ["validate", str(p)], "50 tasks is over the limit of 49 tasks", "MOSAIC_LIMIT_SCHEDULE_TASKS")


def test_schedule_file_over_the_size_limit_is_refused(tmp_path, capsys, monkeypatch):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(chain(5)))
    monkeypatch.setenv("MOSAIC_LIMIT_TEXT_BYTES", "100")
    refused(capsys, ["validate", str(p)], "over the limit of 100 bytes")


# -- 2. the validator is linear in a dependency chain -----------------------------------------------------------

def _old_pred_bits(f: Facts) -> list[int]:
    """The bitset definition of happens-before (pred[i], a Python int per task): the reference the vector
    clocks must equal (quadratic memory, so only for small schedules here)."""
    tasks, prods, ncnt = f.tasks, f.prods, f.s.num_counters
    pred, last_on = [0] * f.n, {}
    for i, t in enumerate(tasks):
        prev = last_on.get(t.sm)
        acc = (pred[prev] | (1 << prev)) if prev is not None else 0
        last_on[t.sm] = i
        for w in t.waits:
            c, th = w.counter, w.threshold
            p = prods.get(c) if 0 <= c < ncnt else None
            if th < 1 or not p or th > len(p):
                continue
            if th == len(p):
                v = 0
                for j in p:
                    v |= pred[j] | (1 << j)
            else:
                v = -1
                for j in p:
                    v &= pred[j] | (1 << j)
            acc |= v
        pred[i] = acc
    return pred


def _random_dag(rng: random.Random, n: int) -> dict:
    nsm, ncnt = rng.randint(1, 4), rng.randint(1, 6)
    sig = [rng.randrange(ncnt) for _ in range(n)]
    tasks = []
    for i in range(n):
        waits = []
        for _ in range(rng.randint(0, 2)):
            earlier = [c for c in set(sig[:i])]
            if earlier:
                c = rng.choice(earlier)
                total = sig.count(c)
                waits.append({"counter": c, "threshold": rng.choice([1, total, max(1, total - 1)])})
        # producers of a waited counter must all be earlier: drop waits on counters signalled later
        waits = [w for w in waits if w["counter"] not in sig[i:]]
        tasks.append({"id": i, "op": "add", "sm": rng.randrange(nsm), "inputs": ["inp", "inp"],
                      "outputs": [f"y{i}"], "waits": waits, "signal": sig[i], "params": {}})
    bufs = [{"name": "inp", "dtype": "f32", "shape": [4], "kind": "input"}]
    bufs += [{"name": f"y{i}", "dtype": "f32", "shape": [4], "kind": "activation"} for i in range(n)]
    return {"format": "mosaic-amk-schedule", "version": 1, "num_sms": nsm, "buffers": bufs,
            "num_counters": ncnt, "tasks": tasks, "outputs": []}


def test_vector_clocks_equal_the_bitset_happens_before():
    from mosaic_amk.schedule import Schedule

    rng = random.Random(7)
    for _ in range(300):
        s = Schedule.from_json(_random_dag(rng, rng.randint(1, 24)))
        f = Facts(s)
        assert not f.backward and not f.self_waits
        pred = _old_pred_bits(f)
        sms = [t.sm for t in s.tasks]
        slot = slots_of(sms)
        clocks = list(inclusive_clocks(sms, [t.signal for t in s.tasks],
                                       [[(w.counter, w.threshold) for w in t.waits] for t in s.tasks],
                                       s.num_counters, slot))
        for i in range(f.n):
            for j in range(f.n):
                want = j == i or bool((pred[i] >> j) & 1)
                assert (clocks[i][slot[sms[j]]] >= j) == want, (i, j)


@pytest.mark.parametrize("kind", ["fanout", "pingpong"])
def test_a_long_chain_validates_safe_in_linear_memory(kind):
    raw = chain(30_000, kind)
    tracemalloc.start()
    try:
        result = validate(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok, result.lines()[:3]
    # the bitset happens-before held ~n^2/8 bytes twice over (225 MB here); clocks are a few per live task
    assert peak < 120 * 2**20, peak


def test_a_race_at_the_end_of_a_long_chain_is_still_found():
    raw = chain(20_000, "fanout")
    raw["tasks"][-1]["waits"] = []  # the last task no longer waits for its input's writer
    got = validate(raw)
    assert got.codes() == {"unordered-read"}
    assert got.lines() == validate_rules(raw).lines()
    assert "tasks 19998, 19999" in got.lines()[0]


# -- 3. physical bounds in the validator; hostile checkpoint configs and weights at import ---------------------

def _base():
    """test_validator's seven-task base schedule (rmsnorm, GEMVs, KV appends, attention, add)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_validator_cases", Path(__file__).with_name("test_validator.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.base()


@pytest.mark.parametrize("field, value", [("num_sms", 10**300), ("num_sms", 100_000), ("num_counters", 10**30)],
                         ids=["sms-10^300", "sms-100000", "counters-10^30"])
def test_validator_bounds_sms_and_counters(field, value):
    raw = _base().to_json()
    raw[field] = value
    got = validate(raw)
    assert not got.ok and "capacity" in got.codes(), got.lines()
    assert got.lines() == validate_rules(raw).lines()
    assert all(len(line) < 400 for line in got.lines())


def test_validator_bounds_head_dim_and_buffer_elements():
    import attrs
    from mosaic_amk.schedule import Buffer

    s = _base()
    tasks = list(s.tasks)
    tasks[5] = attrs.evolve(tasks[5], params={**tasks[5].params, "head_dim": 10**12})
    got = validate(attrs.evolve(s, tasks=tuple(tasks)))
    assert "capacity" in got.codes() and any("head_dim <= 1024" in line for line in got.lines()), got.lines()
    bufs = list(s.buffers)
    bufs[4] = Buffer("y", "f32", (2**20, 2**20), "activation")
    got = validate(attrs.evolve(s, buffers=tuple(bufs)))
    assert "capacity" in got.codes(), got.lines()


def test_validator_bounds_through_the_cli(tmp_path, capsys):
    raw = _base().to_json()
    raw["num_sms"] = 10**30
    p = tmp_path / "s.json"
    p.write_text(json.dumps(raw))
    code, out, err = cli(capsys, "validate", str(p))
    assert code == 1 and "[capacity]" in out and "Traceback" not in out + err


def _edit_config(ckpt, tmp_path, **changes):
    import shutil

    d = tmp_path / "ckpt"
    shutil.copytree(ckpt, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))  # json.dumps writes NaN/Infinity as HF does
    return d


CONFIG_CASES = [
    ({"partial_rotary_factor": "abc"}, "partial_rotary_factor"),
    ({"rope_scaling": {"rope_type": "default", "partial_rotary_factor": "abc"}}, "partial_rotary_factor"),
    ({"quantization_config": "gptq"}, "quantization_config"),
    ({"layer_types": 5}, "layer_types"),
    ({"layer_types": ["full_attention", 5]}, "layer_types"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
    ({"rope_theta": float("inf")}, "rope_theta"),
    ({"pretraining_tp": [1]}, "pretraining_tp"),
]


@pytest.mark.parametrize("changes, needle", CONFIG_CASES)
@pytest.mark.parametrize("verb", ["lower", "generate"])
def test_hostile_config_is_one_line_through_the_cli(tiny_checkpoint, tmp_path, capsys, changes, needle, verb):
    d = _edit_config(tiny_checkpoint("llama"), tmp_path, **changes)
    args = ["lower", "--model", str(d), "-o", str(tmp_path / "s.json")] if verb == "lower" else \
        ["generate", "--model", str(d), "--prompt-ids", "1,2", "--tokens", "1"]
    refused(capsys, args, needle, str(d))
    assert not (tmp_path / "s.json").exists()


def test_config_json_that_is_a_device_deep_or_huge_integer(tiny_checkpoint, tmp_path, capsys):
    import shutil

    d = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("llama"), d)
    out = ["lower", "--model", str(d), "-o", str(tmp_path / "s.json")]
    (d / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(capsys, out, "config.json")
    (d / "config.json").write_text('{"a": ' + "[" * 70 + "]" * 70 + "}")
    refused(capsys, out, "nesting")
    (d / "config.json").write_text('{"vocab_size": ' + "9" * 5000 + "}")
    refused(capsys, out, "digits")
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    refused(capsys, out, "config.json")  # /dev/zero is never read


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_weight_is_refused_naming_the_tensor(tiny_checkpoint, tmp_path, capsys, bad):
    import shutil

    from safetensors.numpy import load_file, save_file

    d = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("llama"), d)
    (st,) = d.glob("*.safetensors")
    tensors = load_file(st)
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = tensors[name].copy()
    tensors[name].flat[3] = bad
    save_file(tensors, st, metadata={"format": "pt"})
    refused(capsys, ["lower", "--model", str(d), "-o", str(tmp_path / "s.json")], name, "NaN or inf")


def test_model_spec_refuses_a_nan_eps_and_names_a_nan_weight():
    import attrs
    import numpy as np
    from mosaic.errors import BadInput
    from mosaic_amk.tiny_models import tiny_model

    spec = tiny_model("llama")
    for field in ("rms_norm_eps", "attention_scaling"):
        with pytest.raises(BadInput, match=field):
            attrs.evolve(spec, **{field: float("nan")})
    w = dict(spec.weights)
    w["model.norm.weight"] = np.full_like(w["model.norm.weight"], np.nan)
    assert attrs.evolve(spec, weights=w).check_weights() == ["model.norm.weight holds NaN or inf"]
