"""The static schedule validator: a total function over a schedule, written as a rule table.

``validate(schedule_or_raw_json) -> ValidationResult`` never raises on bad data: it returns every
:class:`~mosaic.errors.Diagnostic` it finds (a stable ``code``, the task ids in ``where``, expected and
actual values). A schedule it accepts cannot deadlock or race under any legal interleaving of the
execution model in docs/amk-schedule.md; the argument, rule by rule, is in docs/amk-schedule.md.

- :mod:`~mosaic_amk.validate.facts`: the derived graph facts the rules share (references, producers,
  footprints, backward edges, happens-before, conflicting accesses);
- :mod:`~mosaic_amk.validate.pages`: the page protocol's facts (pools, loader fills, the walk of each SM's
  queue, the extended list of events the happens-before clocks run over);
- :mod:`~mosaic_amk.validate.rules`: one rule function per diagnostic code (``RULES``, ``CODES``); every
  rule runs; ``validate_rules`` is the table alone;
- :mod:`~mosaic_amk.validate.screen`: the accelerated path, the same rules as whole-column numpy checks
  over the columnar form (``mosaic_amk.columns``). It can only conclude "no diagnostic at all"; anything
  it flags or does not recognise goes to the rule table, which names every problem. The parity tests
  hold ``validate`` equal to ``validate_rules``;
- :mod:`~mosaic_amk.validate.parity`: that equality schedule by schedule, per audit class (CI:
  packages/amk/tests/test_validate_fast_path.py; ``benchmarks/amk_validate.py --parity N``);
- :mod:`~mosaic_amk.validate.oracle`: the dynamic oracle (seeded interleavings, shadow memory), which
  shares no analysis code with the rules;
- :mod:`~mosaic_amk.validate.audit`: adversarial schedules labelled by the oracle, checked by ``validate``.
"""

from __future__ import annotations

from typing import Any

from mosaic_amk import columns as _columns
from mosaic_amk.schedule import Schedule
from mosaic_amk.validate.facts import Facts
from mosaic_amk.validate.rules import CODES, RULES, Rule, ValidationResult, validate_rules
from mosaic_amk.validate.screen import screen, screen_records


def validate(schedule: Any) -> ValidationResult:
    """Check a :class:`Schedule` (or its raw JSON object). Total: returns every diagnostic, never raises
    on bad data (an internal failure is itself reported as ``malformed``, so the verdict fails closed).

    The columnar screen may only say "no problem at all"; anything else goes to the rule table. A schedule that
    uses the page protocol (``Schedule.has_pages``; in raw JSON a ``page_pools`` field or a task's ``pages``, which
    the columns do not read) goes to the rule table directly: the screen does not restate the page rules
    (``screen_records`` says no to it, ``columns.from_raw`` returns None)."""
    if isinstance(schedule, Schedule):
        if screen_records(schedule):
            return ValidationResult((), len(schedule.tasks))
    else:
        cols = _columns.from_raw(schedule)
        if cols is not None and screen(cols):
            return ValidationResult((), cols.n)
    return validate_rules(schedule)


__all__ = ["CODES", "RULES", "Facts", "Rule", "ValidationResult", "validate", "validate_rules"]
