"""The campaign journal: every event of a convergence run, one JSON object per line in ``DIR/journal.jsonl``.

Each event is written, flushed and ``fsync``-ed before the loop moves on, so after a ``kill -9`` the file
holds every event up to the last one the loop finished, plus at most one torn (partial) last line. Reading
tolerates that torn line (it is dropped and reported); a malformed line anywhere else is damage and an
error. Reopening for resume truncates the torn tail first, so the next event starts on a line of its own.

Resume replays: the loop runs again from the top and :meth:`Journal.emit` checks each event it would write
against the one already on disk (same kind, same key, same decision). A match is not written again; the
first event past the end of the file is appended. A mismatch means the journal and the loop disagree and
stops the run (:class:`JournalDiverged`) rather than silently forking history.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

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
    """Every complete event, and a note when a torn last line was dropped (``None`` when the file was whole)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput("no journal here (a campaign directory holds journal.jsonl)", str(path))
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else a line that was never finished
    events, torn = [], None
    for n, raw in enumerate(lines, 1):
        try:
            event = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadInput(f"journal line {n} is not JSON (damage before the last line)", str(path)) from None
        if not isinstance(event, dict) or "event" not in event:
            raise BadInput(f"journal line {n} is not an event object", str(path))
        events.append(event)
    if tail:
        torn = f"dropped a torn last line ({len(tail)} bytes written before the process stopped)"
    if events and (events[0].get("event") != "campaign" or events[0].get("format") != FORMAT):
        raise BadInput("the journal does not start with a mosaic campaign header", str(path))
    return events, torn


class Journal:
    """Append-only event log. ``replay`` holds events already on disk that a resumed run must reproduce."""

    def __init__(self, path: str | os.PathLike, replay: list[dict] | None = None):
        self.path = Path(path)
        self.replay = list(replay or [])
        self.position = 0  # index of the next event the loop emits
        self._fh = None

    @classmethod
    def create(cls, directory: str | os.PathLike) -> Journal:
        path = Path(directory) / NAME
        if path.exists() and path.stat().st_size:
            raise BadInput("a journal exists already; resume it with --resume, or choose another --out", str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(path)

    @classmethod
    def resume(cls, directory: str | os.PathLike) -> tuple[Journal, str | None]:
        path = Path(directory) / NAME
        events, torn = read_journal(path)
        if not events:
            raise BadInput("the journal is empty; start the campaign again instead", str(path))
        if torn:
            _truncate_after_last_newline(path)
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
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held for the campaign
        self._fh.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _truncate_after_last_newline(path: Path) -> None:
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    with open(path, "r+b") as fh:
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
