"""The columnar form of a schedule: one list (or numpy array) per task field, built once per validation.

The validator's fast screen (``mosaic_amk.validate.screen.screen``) reads a schedule through these columns
instead of walking :class:`~mosaic_amk.schedule.Task` records one by one: every column is extracted with
a C-level ``map`` over the task tuple, and the checks run as numpy operations over whole columns.

Two builders:

- :func:`from_schedule` takes the records (already typed by their attrs validators);
- :func:`from_raw` takes a raw JSON object (``json.loads`` output) *without* building records, but only
  when every value has exactly the type the records would accept (``type(x) is int``, ``str``, ``dict``,
  ``list``/``tuple``, no unknown or missing fields, no bools where integers go). Anything else returns
  ``None`` and the caller takes the exact path (records built leniently, every problem a diagnostic).
  So for data it accepts, the columns hold exactly what ``Schedule.from_json`` would hold (sequences
  may be lists instead of tuples). The page protocol's fields (``page_pools``, a task's ``pages``) are not
  columns: a schedule that has them returns ``None`` too (an unknown field here), so the rule table checks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from typing import Any

from mosaic_amk.schedule import BUFFER_KINDS, DTYPES, FORMAT, VERSION

_MISSING = object()
_SEQ = frozenset((list, tuple))
_INT = frozenset((int,))
_STR = frozenset((str,))
_DICT = frozenset((dict,))
_TOP_KNOWN = frozenset(("format", "version", "num_sms", "buffers", "num_counters", "tasks", "outputs", "meta"))
_BUF_KEYS = frozenset(("name", "dtype", "shape", "kind"))
_TASK_KEYS = ("id", "op", "sm", "inputs", "outputs", "waits", "signal", "params")
_WAIT_KEYS = frozenset(("counter", "threshold"))
_DTYPES = frozenset(DTYPES)
_KINDS = frozenset(BUFFER_KINDS)


class Columns:
    """A schedule as columns. Per buffer: ``buf_names``, ``buf_shapes``, ``buf_kinds``. Per task (list
    order): ``ids``, ``ops``, ``sms``, ``signals``, ``inputs``, ``outputs`` (name sequences), ``params``,
    ``ranges`` (dicts), ``wait_len`` (waits per task). Per wait, flattened in task order:
    ``wait_counter``, ``wait_threshold``. ``records`` is the Schedule when built from one (else None)."""

    __slots__ = ("num_sms", "num_counters", "outputs", "buf_names", "buf_shapes", "buf_kinds", "n", "ids",
                 "ops", "sms", "signals", "inputs", "task_outputs", "params", "ranges", "wait_len",
                 "wait_counter", "wait_threshold", "records")

    def __init__(self, **kw: Any):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


_t_id, _t_op, _t_sm, _t_sig = attrgetter("id"), attrgetter("op"), attrgetter("sm"), attrgetter("signal")
_t_in, _t_out, _t_waits = attrgetter("inputs"), attrgetter("outputs"), attrgetter("waits")
_t_params, _t_ranges = attrgetter("params"), attrgetter("ranges")
_w_counter, _w_threshold = attrgetter("counter"), attrgetter("threshold")
_b_name, _b_shape, _b_kind = attrgetter("name"), attrgetter("shape"), attrgetter("kind")


def from_schedule(s: Any) -> Columns:
    """Columns of a :class:`~mosaic_amk.schedule.Schedule` (its records are already typed)."""
    tasks, bufs = s.tasks, s.buffers
    waits = list(map(_t_waits, tasks))
    flat = list(chain.from_iterable(waits))
    return Columns(
        num_sms=s.num_sms, num_counters=s.num_counters, outputs=s.outputs,
        buf_names=list(map(_b_name, bufs)), buf_shapes=list(map(_b_shape, bufs)), buf_kinds=list(map(_b_kind, bufs)),
        n=len(tasks), ids=list(map(_t_id, tasks)), ops=list(map(_t_op, tasks)), sms=list(map(_t_sm, tasks)),
        signals=list(map(_t_sig, tasks)), inputs=list(map(_t_in, tasks)), task_outputs=list(map(_t_out, tasks)),
        params=list(map(_t_params, tasks)), ranges=list(map(_t_ranges, tasks)), wait_len=list(map(len, waits)),
        wait_counter=list(map(_w_counter, flat)), wait_threshold=list(map(_w_threshold, flat)), records=s)


def _types(values: Any) -> set:
    return set(map(type, values))


def _all(values: Sequence, allowed: frozenset) -> bool:
    return _types(values) <= allowed


def from_raw(data: Any) -> Columns | None:
    """Columns straight from a raw JSON object, or None unless it is exactly what the records accept
    (then the caller validates through the lenient record builder, which names every problem)."""
    try:
        return _from_raw(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _from_raw(data: Any) -> Columns | None:
    if type(data) is not dict or not data.keys() <= _TOP_KNOWN:
        return None
    if data.get("format") != FORMAT or type(data.get("version")) is not int or data["version"] != VERSION:
        return None
    nsm, ncnt, bufs, tasks, outputs = (data[k] for k in ("num_sms", "num_counters", "buffers", "tasks", "outputs"))
    if type(nsm) is not int or type(ncnt) is not int or type(bufs) is not list or type(tasks) is not list:
        return None
    if type(outputs) is not list or not _all(outputs, _STR):
        return None
    meta = data.get("meta", _MISSING)
    if meta is not _MISSING and (type(meta) is not dict or not _all(meta, _STR)):
        return None
    # buffers: exactly {name, dtype, shape, kind}, typed
    if not _all(bufs, _DICT) or any(b.keys() != _BUF_KEYS for b in bufs):
        return None
    names, shapes = list(map(itemgetter("name"), bufs)), list(map(itemgetter("shape"), bufs))
    kinds, dtypes = list(map(itemgetter("kind"), bufs), ), list(map(itemgetter("dtype"), bufs))
    if not (_all(names, _STR) and _all(kinds, _STR) and _all(dtypes, _STR) and set(kinds) <= _KINDS
            and set(dtypes) <= _DTYPES and _all(shapes, _SEQ) and _all(chain.from_iterable(shapes), _INT)):
        return None
    # tasks: the eight required fields, optionally `ranges`, nothing else
    n = len(tasks)
    if not _all(tasks, _DICT):
        return None
    cols = [list(map(itemgetter(k), tasks)) for k in _TASK_KEYS]  # KeyError: a field is missing
    ids, ops, sms, inputs, outs, waits, signals, params = cols
    ranges = list(map(dict.get, tasks, repeat("ranges"), repeat(_MISSING)))
    n_ranges = n - ranges.count(_MISSING)
    if sum(map(len, tasks)) != 8 * n + n_ranges:
        return None  # an unknown field
    if not (_all(ids, _INT) and _all(sms, _INT) and _all(signals, _INT) and _all(ops, _STR)
            and _all(inputs, _SEQ) and _all(outs, _SEQ) and _all(waits, _SEQ) and _all(params, _DICT)):
        return None
    if not (_all(chain.from_iterable(inputs), _STR) and _all(chain.from_iterable(outs), _STR)
            and _all(chain.from_iterable(params), _STR)):
        return None
    flat = list(chain.from_iterable(waits))
    if not _all(flat, _DICT) or any(w.keys() != _WAIT_KEYS for w in flat):
        return None
    wc, wt = list(map(itemgetter("counter"), flat)), list(map(itemgetter("threshold"), flat))
    if not (_all(wc, _INT) and _all(wt, _INT)):
        return None
    if n_ranges:
        given = [r for r in ranges if r is not _MISSING]
        if not _all(given, _DICT) or not _all(chain.from_iterable(given), _STR):
            return None
        vals = list(chain.from_iterable(map(dict.values, given)))
        if not _all(vals, _SEQ) or set(map(len, vals)) - {2} or not _all(chain.from_iterable(vals), _INT):
            return None
        empty: dict = {}
        ranges = [empty if r is _MISSING else r for r in ranges]
    else:
        ranges = [{}] * n
    return Columns(num_sms=nsm, num_counters=ncnt, outputs=outputs, buf_names=names, buf_shapes=shapes,
                   buf_kinds=kinds, n=n, ids=ids, ops=ops, sms=sms, signals=signals, inputs=inputs,
                   task_outputs=outs, params=params, ranges=ranges, wait_len=list(map(len, waits)),
                   wait_counter=wc, wait_threshold=wt, records=None)


__all__ = ["Columns", "from_raw", "from_schedule"]
