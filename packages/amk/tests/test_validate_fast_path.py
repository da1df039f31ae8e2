"""The vectorised fast path (validate.screen) equals the rule table (validate.validate_rules).

Schedule by schedule (mosaic_amk.validate.parity.compare): the verdict and every diagnostic (code, task
ids, expected, actual, message, in order) of ``validate`` equal the rule table's on the records and on
the raw JSON; the screen alone never accepts what the rule table rejects; and the screen itself (not
the fallback) accepts every real lowering without pages: 224 of the 280 audit bases (every tiny family and
the int8 variant x 10 configs x 4 positions; the 56 of the two page configs go to the rule table, as every
schedule with pages does) and the SmolLM2-135M-shaped lowering the throughput benchmark times. Per class:
~5,800 schedules in all (120 single-injection mutants of each of the 33 audit classes, 1,500 random DAGs,
the 280 bases), the SmolLM2-135M shape lowered with pages and mutated once per page class, plus hand-made variants aimed at the screen's own shortcuts (distinct-tuple
resolution, the footprint memo, the per-read counter runs)."""

from __future__ import annotations

import random

import attrs
import pytest
from mosaic_amk.schedule import Wait
from mosaic_amk.validate import parity
from mosaic_amk.validate.audit import MUTATORS, PAGE_CLASSES, real_lowerings


@pytest.fixture(scope="module")
def bases():
    return real_lowerings()


def test_fast_path_equals_rule_table_in_every_class(bases):
    rows = parity.run(bases, per_class=120, dags=1500, seed=11)
    print("\n" + parity.table(rows))
    by = {r.name: r for r in rows}
    assert [d for r in rows for d in r.differences] == []
    real = by["real-lowerings"]
    # the fast path decides the 224 without pages; the 56 lowered with pages go to the rule table (validate routes them)
    assert real.schedules == real.accepted == 280 and real.paged == 56 and real.screen_accepted == 224
    for name in MUTATORS:
        assert by[name].schedules == 120, name
    control = by["reassign-sm"]  # safe by construction: the rules accept all, and so does the screen itself (but for
    assert control.accepted == control.schedules  # the mutants of page bases, which go to the rule table)
    assert control.screen_accepted == control.schedules - control.paged and control.paged > 0
    total = sum(r.schedules for r in rows)
    accepted = sum(r.accepted for r in rows)
    assert total >= 3900 and accepted > 400 and total - accepted > 2500, (total, accepted)


def test_smollm2_135m_lowering_is_accepted_by_the_fast_path(tmp_path):
    from mosaic.gpus import DEFAULT_GPU
    from mosaic.plugins import host
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.lowering import lower
    from mosaic_amk.tiny_models import SMOLLM2_135M, make_checkpoint

    spec = import_checkpoint(make_checkpoint(tmp_path / "smollm2-135m", config=SMOLLM2_135M))
    gpu = host().get("gpus", DEFAULT_GPU)
    coarse = ScheduleConfig(gemv_rows_per_task=1 << 20, lm_head_rows_per_task=1 << 20,
                            attention_kv_heads_per_task=spec.num_kv_heads)
    for cfg in (ScheduleConfig(), coarse):
        for pos in (0, 37):
            s = lower(spec, cfg, gpu, pos)
            ok, fast, diffs = parity.compare(s, raw=True)
            assert ok and fast and diffs == [], (pos, diffs)
            # and a few mutants of the full-size lowering, every class
            for name, mutate in sorted(MUTATORS.items()):
                m = mutate(s, random.Random(f"135m/{name}/{pos}"))
                if m is not None:
                    assert parity.compare(m)[2] == [], name
    # the same shape lowered with the page protocol (validate sends it to the rule table) and one mutant of each page
    # class, which only a paged lowering has anything to mutate in: the rules reject each, and validate says the same
    paged = lower(spec, ScheduleConfig(pages=4, page_bytes=16384), gpu, 37)
    ok, fast, diffs = parity.compare(paged)
    assert paged.has_pages() and ok and not fast and diffs == []
    for name in sorted(PAGE_CLASSES):
        m = MUTATORS[name](paged, random.Random(f"135m/{name}/paged"))
        assert m is not None, name
        ok, fast, diffs = parity.compare(m)
        assert not ok and not fast and diffs == [], (name, diffs)


def _edit(s, i, **params):
    t = s.tasks[i]
    tasks = list(s.tasks)
    tasks[i] = attrs.evolve(t, params={**t.params, **params})
    return attrs.evolve(s, tasks=tuple(tasks))


def _first(s, op):
    return next(i for i, t in enumerate(s.tasks) if t.op == op)


def test_the_screens_shortcuts_keep_the_rule_tables_verdicts(bases):
    """Values equal under == but of another type (the footprint memo and the row vectorisation key on
    values), parameter dicts in another key order, a buffer in two roles, waits that the per-read
    counter runs skip: each compared with the rule table."""
    s = next(b for name, b in bases if name.startswith("llama/default/pos5"))
    cases = []
    for op in ("gemv", "gemv_silu_mul"):
        i = _first(s, op)
        rs = s.tasks[i].params["row_start"]
        cases += [_edit(s, i, row_start=float(rs)), _edit(s, i, row_end=s.tasks[i].params["row_end"] + 0.0)]
        if rs in (0, 1):
            cases.append(_edit(s, i, row_start=bool(rs)))
    for op in ("attention", "kv_append", "rope_append"):
        i = _first(s, op)
        p = s.tasks[i].params
        cases += [_edit(s, i, position=float(p["position"])), _edit(s, i, position=p["position"] + 10 ** 6)]
        if "head_dim" in p:
            cases += [_edit(s, i, head_dim=float(p["head_dim"])), _edit(s, i, head_dim=2048)]
        tasks = list(s.tasks)  # same parameters, reversed key order: the memo keys on items then
        tasks[i] = attrs.evolve(tasks[i], params=dict(reversed(list(p.items()))))
        cases.append(attrs.evolve(s, tasks=tuple(tasks)))
    s = next(b for name, b in bases if name.startswith("llama/rr4-r8-nofuse/pos5"))  # row tasks of 8 rows
    i = next(i for i, t in enumerate(s.tasks) if t.op == "gemv" and t.params["row_start"] > 0
             and not t.params["residual"] and not t.params["bias"])
    t = s.tasks[i]  # a buffer in two roles (x also the residual): ranges must cover both
    tasks = list(s.tasks)
    tasks[i] = attrs.evolve(t, inputs=(*t.inputs, t.inputs[0]), params={**t.params, "residual": True})
    cases.append(attrs.evolve(s, tasks=tuple(tasks)))
    rows = {b.name: b.shape[0] for b in s.buffers}
    x, rs, re = t.inputs[0], t.params["row_start"], t.params["row_end"]
    for rng in ((0, rows[x]), (rs, re)):  # ...with a ranges entry on it: whole (covers both) or the rows only
        tasks[i] = attrs.evolve(t, inputs=(*t.inputs, x), params={**t.params, "residual": True},
                                ranges={**t.ranges, x: rng})
        cases.append(attrs.evolve(s, tasks=tuple(tasks)))
    other = next(b.name for b in s.buffers if b.name not in (*t.inputs, *t.outputs))
    tasks[i] = attrs.evolve(t, ranges={**t.ranges, other: (0, 1)})  # an entry for a buffer it does not name
    cases.append(attrs.evolve(s, tasks=tuple(tasks)))
    # the last wait of the argmax (on every lm_head row task) replaced by waits on a few producers' SMs
    i = _first(s, "argmax")
    t = s.tasks[i]
    cases.append(attrs.evolve(s, tasks=(*s.tasks[:i], attrs.evolve(t, waits=(Wait(t.waits[0].counter, 1),)),
                                        *s.tasks[i + 1:])))
    seen = []
    for k, case in enumerate(cases):
        ok, fast, diffs = parity.compare(case, raw=True)
        assert diffs == [], (k, diffs)
        seen.append((ok, fast))
    assert {ok for ok, _ in seen} == {True, False}
    # a buffer in two roles: no entry, a whole entry, a rows-only entry; an entry for a buffer it does not name
    assert seen[-5:-1] == [(True, True), (True, True), (False, False), (False, False)], seen
