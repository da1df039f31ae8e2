"""Predicted row features: what a knob set would make a diff row read, known on the CPU before any build.

A target's knob class may carry ``PREDICTS``, a table of data from a diff row's key (``"smem.dynamic"``,
``"grid"``) to a function ``(knobs, spec) -> value`` that computes the value the lift would read off the built
kernel for those knobs: the row-wise Pallas kernels know their dynamic shared memory (stages and output slots of
``block_rows`` full rows, the weight row, the reduction scratch, one mbarrier a stage) and their grid (rows over
the rows one CTA walks) exactly. The ``knobs`` proposer reads it two ways, for the rows it predicts:

* **direction** (:class:`Gauge`): an edit's predicted change is the sum, over every predicted row of the
  request, of how much nearer to or farther from the reference's value it moves that row; the distance is
  ``|log(value / reference)|`` (sizes and counts: halving and doubling are the same step), and a change under
  5% (:data:`SAME`) counts as none. An edit whose change
  is positive (farther on balance: more shared memory when the reference uses less, fewer CTAs when it launches
  more) comes after every edit that is not; among one row's edits, those that bring the rows nearer come first,
  the largest change first. Judging by every predicted row, not only the one that proposed the edit, keeps a
  row from promoting an edit that is neutral for it and moves another row away.
* **reach**: every knob whose listed values change the predicted value is a candidate for that row, also one
  no catalog concept of the row names (a grid row names no row-wise knob through the catalog, but
  ``blocks_per_cta`` and ``block_rows`` set the CTA count).

A prediction is advice on order, never a verdict: the build, the gate and the timing still decide every edit.
A function that raises or returns something that is not a size leaves that edit unordered (``None``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from mosaic.errors import MosaicError, RecordError

#: a predicted change smaller than this (5% of a size, in log units) is no change
SAME = math.log(1.05)


def predictions_of(knob_cls: type | None) -> Mapping[str, Callable]:
    """The knob class's ``PREDICTS`` table ({} when it has none)."""
    table = getattr(knob_cls, "PREDICTS", None) if knob_cls is not None else None
    return dict(table) if isinstance(table, Mapping) else {}


def size(value: Any) -> float | None:
    """A row value as one positive size: an int, or the product of a launch dimension [x, y, z]; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value > 0 else None
    if isinstance(value, list | tuple) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        n = math.prod(value)
        return float(n) if n > 0 else None
    return None


def distance(value: Any, reference: Any) -> float | None:
    """``|log(value / reference)|`` of two sizes; None when either is not one."""
    a, b = size(value), size(reference)
    if a is None or b is None:
        return None
    return abs(math.log(a / b))


def predict(fn: Callable, knob_cls: type, knobs: Mapping, spec) -> Any:
    """``fn`` on the knob class built from ``knobs``; None when the knobs do not make a valid instance or the
    prediction fails (the edit then goes unordered)."""
    try:
        return fn(knob_cls(**knobs), spec)
    except (MosaicError, RecordError, TypeError, ValueError, KeyError, ZeroDivisionError, AttributeError):
        return None


@attrs.frozen
class Gauge:
    """The predicted rows of one request and the current knobs' distance from the reference over them."""

    predicts: Mapping = attrs.field(converter=dict)
    knob_cls: Any
    spec: Any
    rows: tuple = attrs.field(converter=tuple)
    current: Mapping = attrs.field(converter=dict)

    def _measured(self) -> list:
        if self.spec is None or self.knob_cls is None:
            return []
        return [(row, self.predicts[row.key]) for row in self.rows
                if row.key in self.predicts and size(row.reference) is not None]

    def total(self, knobs: Mapping) -> float | None:
        """Sum of the predicted rows' distances at ``knobs``; None when no row is predicted or one fails."""
        measured = self._measured()
        if not measured:
            return None
        out = 0.0
        for row, fn in measured:
            d = distance(predict(fn, self.knob_cls, knobs, self.spec), row.reference)
            if d is None:
                return None
            out += d
        return out

    def change(self, knobs: Mapping) -> float | None:
        """``total(knobs) - total(current)``: negative nearer the reference, positive farther, 0.0 within
        :data:`SAME` (a third stage written in place moves shared memory by 8 bytes: no direction); None: unknown."""
        before, after = self.total(self.current), self.total(knobs)
        if before is None or after is None:
            return None
        return 0.0 if abs(after - before) < SAME else after - before

    def record(self, knobs: Mapping, change: float) -> dict:
        """What the journal keeps of the prediction: each predicted row's value before and after, and the change."""
        return {"rows": {row.key: {"was": _plain(predict(fn, self.knob_cls, self.current, self.spec)),
                                   "value": _plain(predict(fn, self.knob_cls, knobs, self.spec)),
                                   "reference": _plain(row.reference)} for row, fn in self._measured()},
                "change": round(change, 4)}


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


__all__ = ["Gauge", "distance", "predict", "predictions_of", "size"]
