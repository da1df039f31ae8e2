"""Hypothesis over AMK schedules and configs as a shared file would bring them: whatever the damage, the CLI
exits 0, 1 or 2, writes at most one error line and never a traceback (bounded: max_examples, no deadline)."""

import json
import shutil
import tomllib

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from mosaic.cli import main


def _chain(n: int) -> dict:
    """test_hostile_amk.chain(n, "fanout", nsm=3): a safe dependency chain."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_hostile_cases", Path(__file__).with_name("test_hostile_amk.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.chain(n, "fanout", nsm=3)


SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# JSON values a hostile file may hold where anything else belongs (NaN/inf are written as NaN/Infinity)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.sampled_from([10**45, -1, 0, 2**31, 10**12])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def run(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["amk", *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def well_behaved(code, out, err) -> None:
    event(f"exit {code}")
    assert code in (0, 1, 2), (code, out, err)
    assert "Traceback" not in out + err
    lines = [ln for ln in err.strip().splitlines() if ln and not ln.startswith("warning: ")]
    assert len(lines) <= 1, err
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), err


def _paths(value, prefix=()):
    """Every (path, value) of a JSON document, the document itself first."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for k, v in enumerate(value):
            yield from _paths(v, (*prefix, k))


def _damage(doc, picks, values, drops):
    """Replace the values at ``picks`` (indices into the document's paths) with ``values``; delete at ``drops``."""
    paths = [p for p, _ in _paths(doc) if p]
    for pick, value in zip(picks, values, strict=False):
        *head, last = paths[pick % len(paths)]
        node = doc
        for k in head:
            node = node[k]
        node[last] = value
        paths = [p for p, _ in _paths(doc) if p]
    for pick in drops:
        *head, last = paths[pick % len(paths)]
        node = doc
        for k in head:
            node = node[k]
        del node[last]
        paths = [p for p, _ in _paths(doc) if p]
    return doc


SCHEDULE = _chain(6)


@SETTINGS
@given(picks=st.lists(st.integers(0, 10**6), max_size=4), values=st.lists(VALUES, max_size=4),
       drops=st.lists(st.integers(0, 10**6), max_size=2))
def test_damaged_schedules_exit_0_1_or_2_with_at_most_one_error_line(tmp_path_factory, capsys, picks, values, drops):
    doc = _damage(json.loads(json.dumps(SCHEDULE)), picks, values, drops)
    p = tmp_path_factory.mktemp("sched") / "s.json"
    p.write_text(json.dumps(doc))
    well_behaved(*run(capsys, "validate", str(p)))
    well_behaved(*run(capsys, "validate", str(p), "--json"))


@SETTINGS
@given(text=st.text(alphabet='{}[]",:0123456789.eE-+ aNIfinty\\', max_size=200))
def test_schedule_text_of_json_punctuation(tmp_path_factory, capsys, text):
    p = tmp_path_factory.mktemp("sched") / "s.json"
    p.write_text('{"format": "mosaic-amk-schedule", "version": 1, ' + text)
    well_behaved(*run(capsys, "validate", str(p)))


CONFIG_KEYS = ["partial_rotary_factor", "quantization_config", "layer_types", "rms_norm_eps", "rope_theta",
               "rope_scaling", "sliding_window", "num_key_value_heads", "pretraining_tp", "hidden_act", "model_type",
               "head_dim", "tie_word_embeddings", "max_position_embeddings", "vocab_size"]


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), VALUES, min_size=1, max_size=3))
def test_damaged_checkpoint_configs_through_lower(tiny_checkpoint, tmp_path_factory, capsys, changes):
    d = tmp_path_factory.mktemp("ckpt") / "m"
    shutil.copytree(tiny_checkpoint("llama"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    out = d.parent / "s.json"
    got = run(capsys, "lower", "--model", str(d), "-o", str(out))
    well_behaved(*got)
    if got[0] != 0:
        assert not out.exists()


def test_unsupported_reasons_never_raise_on_any_value():
    from mosaic_amk.importer import unsupported_reasons

    @SETTINGS
    @given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), VALUES, max_size=5))
    def check(changes):
        assert isinstance(unsupported_reasons({"model_type": "llama", **changes}), list)

    check()


SCHEDULE_CONFIG_KEYS = ["gemv_rows_per_task", "lm_head_rows_per_task", "num_sms", "threads_per_block", "smem_bytes",
                        "fusion", "prefetch_depth", "kv_page_tokens", "attention_kv_splits", "rope_order", "bogus"]
TOML_VALUES = (st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6)
               | st.booleans() | st.lists(st.integers(0, 9), max_size=3))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(v, "nan" if v != v else repr(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def test_damaged_schedule_configs_load_or_refuse_with_one_line(tmp_path):
    from mosaic.errors import BadInput
    from mosaic.plugins import host
    from mosaic_amk.config import load_config

    gpu = host().get("gpus", "h200")

    @SETTINGS
    @given(changes=st.dictionaries(st.sampled_from(SCHEDULE_CONFIG_KEYS), TOML_VALUES, min_size=1, max_size=3))
    def check(changes):
        p = tmp_path / "c.toml"
        p.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in changes.items()))
        tomllib.loads(p.read_text())  # the text is TOML
        try:
            load_config(str(p)).for_gpu(gpu)
        except BadInput as exc:
            assert "\n" not in str(exc.what)

    check()
