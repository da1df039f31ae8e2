"""The fast validator against the rule table alone (mosaic_amk.validate.validate_rules): the same
diagnostics, in the same order, on audit mutants of real lowerings, random DAGs, the raw-JSON path and
damaged JSON; and the fast screen really is what accepts real lowerings."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mosaic_amk import columns
from mosaic_amk.validate import validate
from mosaic_amk.validate import validate_rules as validate_reference
from mosaic_amk.validate.audit import MUTATORS, random_dag, real_lowerings
from mosaic_amk.validate.screen import screen as _screen
from mosaic_amk.validate.screen import screen_records


@pytest.fixture(scope="module")
def bases():
    return [s for _, s in real_lowerings(families=("llama", "mistral", "qwen2", "smollm2"), quick=True)]


def same(x) -> bool:
    """validate and validate_reference agree exactly on ``x``; returns the verdict."""
    got, want = validate(x), validate_reference(x)
    assert got.diagnostics == want.diagnostics, (got.lines(), want.lines())
    assert got.num_tasks == want.num_tasks
    return got.ok


def test_real_lowerings_pass_the_fast_screen(bases):
    plain = [s for s in bases if not s.has_pages()]
    paged = [s for s in bases if s.has_pages()]
    # 5 quick configs (one with every fused op, one with the page protocol) x 2 positions x 4 families
    assert (len(plain), len(paged)) == (32, 8)
    for s in plain:
        assert screen_records(s) and _screen(columns.from_schedule(s))  # the fast path, not the fallback
        raw = json.loads(s.dumps())
        assert columns.from_raw(raw) is not None and _screen(columns.from_raw(raw))
        assert same(s) and same(raw)
    for s in paged:  # the screen does not restate the page rules: the rule table decides these
        raw = json.loads(s.dumps())
        assert not screen_records(s) and columns.from_raw(raw) is None
        assert same(s) and same(raw)


def test_audit_mutants_agree_schedule_by_schedule(bases):
    """Every mutation class of the audit, ~90 mutants each, in records and as raw JSON."""
    verdicts = {True: 0, False: 0}
    for name, mutate in sorted(MUTATORS.items()):
        for k in range(90):
            rng = random.Random(f"parity/{name}/{k}")
            s = mutate(bases[rng.randrange(len(bases))], rng)
            if s is None:
                continue
            ok = same(s)
            assert same(s.to_json()) == ok
            verdicts[ok] += 1
    assert verdicts[True] > 100 and verdicts[False] > 1000, verdicts  # both sides really exercised


def test_random_dags_agree():
    oks = 0
    for k in range(600):
        s = random_dag(random.Random(f"parity-dag/{k}"))
        ok = same(s)
        assert same(s.to_json()) == ok
        oks += ok
    assert 20 < oks < 580


def test_screen_never_accepts_what_the_reference_rejects(bases):
    """The screen alone (no fallback): True only where the reference finds nothing."""
    seen = 0
    for name, mutate in sorted(MUTATORS.items()):
        for k in range(40):
            rng = random.Random(f"screen/{name}/{k}")
            s = mutate(bases[rng.randrange(len(bases))], rng)
            if s is None:
                continue
            if screen_records(s):
                seen += 1
                assert validate_reference(s).ok, (name, k)
    assert seen > 0


json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 12) | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=5), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_damaged_raw_json_agrees(data):
    raw = real_base_json()
    task_dicts, buf_dicts = list(raw["tasks"]), list(raw["buffers"])  # damage these even if replaced
    waits = [w for t in task_dicts for w in t["waits"]]
    ranges = [t["ranges"] for t in task_dicts if t.get("ranges")]
    for _ in range(data.draw(st.integers(1, 3))):
        pool = data.draw(st.sampled_from((None, task_dicts, buf_dicts, waits, ranges)))
        target = raw if pool is None else pool[data.draw(st.integers(0, len(pool) - 1))]
        key = data.draw(st.sampled_from(sorted(target)))
        target[key] = data.draw(json_values)
    same(raw)


_BASE_JSON: list = []


def real_base_json() -> dict:
    if not _BASE_JSON:
        _BASE_JSON.append(real_lowerings(families=("qwen2",), quick=True)[0][1].dumps())
    return json.loads(_BASE_JSON[0])
