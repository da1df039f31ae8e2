"""The fast path against the rule table, schedule by schedule: the equality the screen's speed rests on.

``validate`` runs the vectorised screen (:mod:`mosaic_amk.validate.screen`) and, unless it accepts,
the rule table (:func:`~mosaic_amk.validate.rules.validate_rules`). :func:`compare` checks one schedule:

- the verdict and every diagnostic of ``validate`` equal the rule table's, in order (code, where =
  the task ids, expected, actual, message), on the records and (optionally) on the raw JSON object;
- the screen alone never accepts what the rule table rejects (the only way the two could differ);
- whether the screen itself accepted (for a rule-accepted schedule: the fast path decided, not the
  fallback).

:func:`run` does it per class over the audit's inputs: real lowerings of every tiny family and config
(the audit's bases), single-injection mutants of each mutation class (``audit.MUTATORS``), random
DAGs (``audit.random_dag``), with the same per-schedule seeds scheme as the audit. Used by
packages/amk/tests/test_validate_fast_path.py (CI) and ``benchmarks/amk_validate.py --parity N``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import attrs

from mosaic_amk import columns as _columns
from mosaic_amk.validate import validate, validate_rules
from mosaic_amk.validate.screen import screen, screen_records


@attrs.define
class Row:
    """One class: schedules compared, how many the rule table accepted, how many of those the screen
    accepted by itself, how many use the page protocol (``validate`` sends those to the rule table: the screen
    never accepts them), and every difference found (must stay empty)."""

    name: str
    schedules: int = 0
    accepted: int = 0
    screen_accepted: int = 0
    json_compared: int = 0
    paged: int = 0
    differences: list = attrs.field(factory=list)

    def to_json(self) -> dict:
        return attrs.asdict(self)


def _diff(what: str, got: Any, want: Any) -> str | None:
    if got.diagnostics == want.diagnostics and got.num_tasks == want.num_tasks:
        return None
    return f"{what}: fast {got.lines()[:3]} vs rules {want.lines()[:3]} (tasks {got.num_tasks}/{want.num_tasks})"


def compare(s: Any, raw: bool = False) -> tuple[bool, bool, list[str]]:
    """(rule-table verdict, screen verdict, differences) for one Schedule (and its JSON when ``raw``)."""
    want = validate_rules(s)
    got = validate(s)
    fast = screen_records(s)
    out = []
    d = _diff("records", got, want)
    if d:
        out.append(d)
    if fast and not want.ok:
        out.append(f"screen accepted what the rules reject: {want.lines()[:3]}")
    if {(x.code, x.where) for x in got.diagnostics} != {(x.code, x.where) for x in want.diagnostics}:
        out.append("codes/tasks differ")
    if raw:
        obj = json.loads(json.dumps(s.to_json()))
        want_j, got_j = validate_rules(obj), validate(obj)
        d = _diff("json", got_j, want_j)
        if d:
            out.append(d)
        if want_j.diagnostics != want.diagnostics:
            out.append("the rule table differs between records and JSON")
        cols = _columns.from_raw(obj)
        if cols is not None and screen(cols) and not want_j.ok:
            out.append("screen (JSON columns) accepted what the rules reject")
    return want.ok, fast, out


def _tally(row: Row, s: Any, raw: bool, label: str) -> None:
    ok, fast, diffs = compare(s, raw)
    row.schedules += 1
    row.accepted += ok
    row.screen_accepted += ok and fast
    row.json_compared += raw
    row.paged += s.has_pages()
    row.differences.extend(f"{label}: {d}" for d in diffs)


def run(bases: list[tuple[str, Any]], per_class: int, dags: int, seed: int = 0, classes: Iterable[str] | None = None,
        json_every: int = 4) -> list[Row]:
    """Compare every base, ``per_class`` mutants of each mutation class (a base with nothing to mutate:
    another is drawn, as in the audit) and ``dags`` random DAGs; every ``json_every``-th schedule of a
    class is compared on its raw JSON too (every base always)."""
    from mosaic_amk.validate.audit import MUTATORS, bases_for, random_dag

    real = Row("real-lowerings")
    for name, s in bases:
        _tally(real, s, True, name)
    rows = [real]
    plain = [s for _, s in bases]
    for name in classes or MUTATORS:
        row = Row(name)
        pool = bases_for(name, plain)
        for k in range(per_class):
            rng = random.Random(f"{seed}/fast-path/{name}/{k}")
            s = None
            for _ in range(20):
                s = MUTATORS[name](pool[rng.randrange(len(pool))], rng)
                if s is not None:
                    break
            if s is not None:
                _tally(row, s, k % json_every == 0, f"{name}#{k}")
        rows.append(row)
    row = Row("random-dag")
    for k in range(dags):
        _tally(row, random_dag(random.Random(f"{seed}/fast-path/dag/{k}")), k % json_every == 0, f"dag#{k}")
    rows.append(row)
    return rows


def table(rows: list[Row]) -> str:
    head = ["class", "schedules", "rules accept", "screen accepts", "of those", "json compared", "differences"]
    body = [[r.name, r.schedules, r.accepted, r.screen_accepted,
             f"{100 * r.screen_accepted / r.accepted:.0f}%" if r.accepted else "-", r.json_compared,
             len(r.differences)] for r in rows]
    tot = ["total", *(sum(r[k] for r in body) for k in (1, 2, 3)), "", sum(r[5] for r in body),
           sum(r[6] for r in body)]
    body.append(tot)
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(line, widths,
                                                                                                        strict=True)))
                     for line in [head, ["-" * w for w in widths], *body])


__all__ = ["Row", "compare", "run", "table"]
