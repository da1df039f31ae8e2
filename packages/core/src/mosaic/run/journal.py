"""The campaign journal: every event of a convergence run, one JSON object per line in ``DIR/journal.jsonl``.

Each event is written, flushed and ``fsync``-ed before the loop moves on, so after a ``kill -9`` the file
holds every event up to the last one the loop finished, plus at most one torn (partial) last line. Reading
tolerates that torn line (it is dropped and reported); a malformed line anywhere else is damage and an
error. Reopening for resume truncates the torn tail first, so the next event starts on a line of its own.

Resume replays: the loop runs again from the top and :meth:`Journal.emit` checks each event it would write
against the one already on disk (same kind, same key, same decision). A match is not written again; the
first event past the end of the file is appended. A mismatch means the journal and the loop disagree and
stops the run (:class:`JournalDiverged`) rather than silently forking history.

The journal is never read, created or appended to through a link (:mod:`mosaic.safe_paths`): a ``journal.jsonl``
that is a symlink, dangling or not, is refused with one line.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from mosaic import safe_paths
from mosaic.errors import BadInput, MosaicError

NAME = "journal.jsonl"
FORMAT = "mosaic-journal"
VERSION = 1
#: fields compared when a replayed event meets the recorded one (beyond ``event`` itself)
IDENTITY = ("key", "step", "decision", "reason_code", "passed", "ok", "against", "stop")


class JournalDiverged(MosaicError):
    """The loop produced a different event than the journal recorded at the same position."""

    exit_code = 1


def _clean(value: Any) -> Any:
    """JSON-safe form: tuples to lists, non-finite floats to None (JSON has no inf/nan)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def read_journal(path: str | os.PathLike) -> tuple[list[dict], str | None]:
    """Every complete event, and a note when a torn last line was dropped (``None`` when the file was whole).

    A last line that lacks only its newline but parses as an event is complete (the write reached the file;
    the newline is added on resume): only a line that does not parse is torn."""
    events, torn, _ = _read(Path(path))
    return events, torn


def _read(path: Path) -> tuple[list[dict], str | None, bool]:
    """(events, torn note, whether the last complete event lacks its newline)."""
    safe_paths.no_link(path)  # a journal is read (and resumed, appended to) only where it is
    if not path.is_file():
        raise BadInput("no journal here (a campaign directory holds journal.jsonl)", str(path))
    data = safe_paths.read_bytes(path, "json_bytes")
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else a line that was never finished
    events, torn, unterminated = [], None, False
    for n, raw in enumerate(lines, 1):
        event = _event(raw, n, path)
        if event is None:
            raise BadInput(f"journal line {n} is not JSON (damage before the last line)", str(path))
        events.append(event)
    if tail:
        event = _event(tail, len(lines) + 1, path)
        if event is None:
            torn = f"dropped a torn last line ({len(tail)} bytes written before the process stopped)"
        else:
            events.append(event)
            unterminated = True
    if events and (events[0].get("event") != "campaign" or events[0].get("format") != FORMAT):
        raise BadInput("the journal does not start with a mosaic campaign header", str(path))
    return events, torn, unterminated


def _event(raw: bytes, n: int, path: Path) -> dict | None:
    """One line as an event object; None when it is not JSON; BadInput when it is JSON but not an event."""
    from mosaic import limits

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not text.strip():
        return None
    where = f"{path}: line {n}"
    try:
        json.loads(text, parse_int=lambda s: 0, parse_constant=lambda s: 0)  # well-formed? (cheap, no big ints)
    except json.JSONDecodeError:
        return None
    except RecursionError:
        pass  # well-formed or not, loads_json refuses its depth with one line
    event = limits.loads_json(text, where)
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        raise BadInput(f"journal line {n} is not an event object", str(path))
    return event


class Journal:
    """Append-only event log. ``replay`` holds events already on disk that a resumed run must reproduce."""

    def __init__(self, path: str | os.PathLike, replay: list[dict] | None = None):
        self.path = Path(path)
        self.replay = list(replay or [])
        self.position = 0  # index of the next event the loop emits
        self._fh = None

    @classmethod
    def create(cls, directory: str | os.PathLike) -> Journal:
        path = safe_paths.no_link(safe_paths.real_dir(directory, create=True) / NAME)  # a dangling link included
        if path.exists() and path.stat().st_size:
            raise BadInput("a journal exists already; resume it with --resume, or choose another --out", str(path))
        return cls(path)

    @classmethod
    def resume(cls, directory: str | os.PathLike) -> tuple[Journal, str | None]:
        path = Path(directory) / NAME
        events, torn, unterminated = _read(path)
        if not events:
            raise BadInput("the journal is empty; start the campaign again instead", str(path))
        if torn:
            _truncate_after_last_newline(path)
        elif unterminated:  # a complete last event that lost only its newline: end its line, keep it
            _append(path, b"\n")
        return cls(path, events), torn

    @property
    def replaying(self) -> bool:
        return self.position < len(self.replay)

    def recorded(self, event: str) -> list[dict]:
        return [e for e in self.replay if e["event"] == event]

    def emit(self, event: str, **data: Any) -> dict:
        record = {"event": event, "seq": self.position, **_clean(data)}
        if self.replaying:
            old = self.replay[self.position]
            for field in ("event", *IDENTITY):
                if old.get(field) != record.get(field):
                    raise JournalDiverged(
                        f"journal line {self.position + 1} recorded {old.get('event')} "
                        f"{field}={old.get(field)!r}, the loop now gives {record.get(field)!r}", str(self.path))
            self.position += 1
            return old
        record["time"] = round(time.time(), 3)
        self._write(record)
        self.position += 1
        return record

    def _write(self, record: dict) -> None:
        if self._fh is None:  # an O_APPEND descriptor: each event is one write(2) at the end of the file
            self._fh = safe_paths.open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        safe_paths.write_all(self._fh, (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode("utf-8"))

    def close(self) -> None:
        if self._fh is not None:
            os.close(self._fh)
            self._fh = None


def _append(path: Path, data: bytes) -> None:
    fd = safe_paths.open_file(path, os.O_WRONLY | os.O_APPEND)
    try:
        safe_paths.write_all(fd, data)
    finally:
        os.close(fd)


def _truncate_after_last_newline(path: Path) -> None:
    keep = safe_paths.read_bytes(path, "json_bytes").rfind(b"\n") + 1
    fd = safe_paths.open_file(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, keep)
        os.fsync(fd)
    finally:
        os.close(fd)


# -- what each event must hold before a resumed, re-decided or reported campaign reads it ------------------------
def _num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt(check):
    return lambda v: v is None or check(v)


def _blocks(v) -> bool:
    return (isinstance(v, list) and bool(v)
            and all(isinstance(b, list) and b and all(_num(x) and x >= 0 for x in b) for b in v))


def _fields(**checks):
    return lambda v: isinstance(v, dict) and all(check(v.get(k)) for k, check in checks.items())


def _list_of(check):
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


_STR, _BOOL, _MAP = (lambda v: isinstance(v, str)), (lambda v: isinstance(v, bool)), (lambda v: isinstance(v, dict))
_ANY = lambda v: True  # noqa: E731
_ROW = _fields(layer=_STR, key=_STR, edit=_STR, why=_opt(_STR))
_EDIT = _opt(lambda v: isinstance(v, dict) and _opt(_fields(layer=_STR, key=_STR, rank=_ANY))(v.get("row"))
             and _opt(_MAP)(v.get("knobs")))
def _samples(v) -> bool:
    from mosaic.timing.throttle import sample_problem

    return isinstance(v, list) and all(sample_problem(x) is None for x in v)


#: the device that timed a comparison: {index, uuid, name, clocks, power_rounds} (a record of the live workbench)
_GPU = _fields(uuid=_opt(_STR), power_rounds=_opt(_samples))
_TIMES = {"t_candidate": _opt(_num), "t_incumbent": _opt(_num), "d_candidate": _opt(_num),
          "d_incumbent": _opt(_num)}
#: event kind -> field -> check; a field a check names is required (``_opt`` lets it be null or absent)
EVENT_FIELDS: dict[str, dict] = {
    "campaign": {"campaign": _MAP, "gpu": _opt(_MAP), "workbench": _opt(_STR), "proposer": _opt(_STR),
                 "source_dir": _opt(_STR), "source_bundles": _opt(_STR), "replays_journal": _opt(_BOOL),
                 "gate_seeds": _opt(lambda v: isinstance(v, list) and bool(v) and all(_int(x) and x >= 0 for x in v))},
    "reference": {"bundle": _STR, "noise_blocks": _blocks, "time_ns": _num, "floor_ns": _num, "cost_s": _num,
                  "noise": _fields(value_ns=_num, relative=_num, statistic=_STR, blocks=_int)},
    "yardstick": {"key": _STR, "name": _STR, "blocks": _blocks, "time_ns": _num, "yardstick": _opt(_STR)},
    "yardstick-unmeasured": {"key": _STR, "yardstick": _STR, "name": _STR, "reason_code": _STR, "reason": _STR},
    "proposal": {"step": lambda v: _int(v) and v >= 0, "ok": _BOOL, "key": _opt(_STR), "parent": _opt(_STR),
                 "edit": _EDIT, "knobs": _opt(lambda v: _MAP(v) and all(isinstance(k, str) for k in v)),
                 "source": _opt(_STR), "reason": _opt(_STR), "done": _opt(_BOOL)},
    "build": {"key": _STR, "ok": _BOOL, "reason": _STR, "reason_code": _STR, "bundle": _opt(_STR), "cost_s": _num,
              "distance": _opt(_num), "step": _opt(_int)},
    "numerics": {"key": _STR, "passed": _BOOL, "reason": _STR, "cost_s": _num},
    "timed": {"key": _STR, "against": _STR, "incumbent_blocks": _blocks, "candidate_blocks": _blocks,
              "order": _STR, "source": _STR, "cost_s": _num, "gpu": _opt(_GPU),
              "spot_check": _opt(lambda v: _MAP(v) and isinstance(v.get("passed"), bool))},
    "verdict": {"key": _STR, "step": _int, "decision": _STR, "reason_code": _STR, "reason": _STR,
                "closer_but_slower": _opt(_BOOL), "edit": _EDIT, **_TIMES},
    "incumbent": {"key": _STR, "time_ns": _num},
    "beam": {"members": _list_of(_MAP)},
    "stop": {"stop": _STR, "reason": _STR, "incumbent": _opt(_STR), "t_incumbent_ns": _opt(_num),
             "t_reference_ns": _opt(_num), "noise_ns": _num, "timed": _opt(_int), "steps": _opt(_int),
             "cost_s": _num, "remaining": _list_of(_ROW),
             "yardstick_paired": _opt(_fields(t_yardstick_ns=_num, t_incumbent_ns=_num)),
             "yardsticks_paired": _opt(_list_of(_fields(key=_STR, name=_STR, yardstick=_STR, t_yardstick_ns=_num,
                                                        t_incumbent_ns=_num)))},
}


def check_events(events: list[dict], path: str | os.PathLike) -> list[dict]:
    """Refuse, with one line naming the journal line and the field, a journal whose events a resume, an
    offline re-decision or the report could not read: a header without its campaign, a field of the wrong
    type. Returns ``events``."""
    if not events:
        raise BadInput("the journal is empty; start the campaign again instead", str(path))
    for n, e in enumerate(events, 1):
        kind = e["event"]
        if n == 1 and kind != "campaign":
            raise BadInput("the journal does not start with a mosaic campaign header", str(path))
        if n > 1 and kind == "campaign":
            raise BadInput(f"journal line {n} is a second campaign header", str(path))
        for field, check in EVENT_FIELDS.get(kind, {}).items():
            if not check(e.get(field)):
                what = "lacks" if field not in e else "has a malformed"
                raise BadInput(f"journal line {n} ({kind} event) {what} field '{field}'"
                               + ("" if field not in e else f": {_short(e[field])}"), str(path))
    return events


def _short(value) -> str:
    text = json.dumps(value, allow_nan=True)
    return text if len(text) <= 60 else text[:57] + "..."


def read_campaign_journal(path: str | os.PathLike) -> tuple[list[dict], str | None]:
    """:func:`read_journal` plus :func:`check_events`: what resume, offline and the report read."""
    events, torn = read_journal(path)
    return check_events(events, path), torn
