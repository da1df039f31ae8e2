"""Progress of a long step (a capture's builds, a campaign's candidates, a tuning sweep): one small abstraction.

:class:`Progress` counts done items of a step and shows them on stderr in one of four ways, picked once:

* ``rich`` -- a live bar (``pip install rich``; ``mosaic-core[progress]``), on a terminal;
* ``tqdm`` -- a bar, on a terminal where rich is absent and tqdm is installed;
* ``plain`` -- one line now and then (``[mosaic] capture: 3/10 (30%), 12 s, ~28 s left: note``): on a terminal
  without either library, and whenever stderr is not a terminal (a log, CI), where it writes one line per
  ``every_s`` seconds (default 30) plus the closing line and nothing else;
* ``none`` -- nothing, with ``quiet`` (the verbs' ``--quiet``).

``MOSAIC_PROGRESS=rich|tqdm|plain|none`` overrides the choice (``auto``, the default, is the rule above).
Progress never writes to stdout, so ``--json`` output stays clean::

    with Progress("candidates", total=len(todo), quiet=quiet) as bar:
        for c in todo:
            ...
            bar.advance(note=f"{c.name} {verdict}")
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, TypeVar

from mosaic.errors import BadInput

ENV = "MOSAIC_PROGRESS"
BACKENDS = ("rich", "tqdm", "plain", "none")
PERIOD_S = 30.0  # a plain line at most this often when stderr is not a terminal
TTY_PERIOD_S = 1.0  # ... and when it is one
T = TypeVar("T")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _isatty(stream: IO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def choose_backend(stream: IO, *, quiet: bool = False, requested: str | None = None) -> str:
    """The backend for ``stream``: ``requested`` (or ``$MOSAIC_PROGRESS``) when given and not ``auto``, else the
    module docstring's rule. BadInput for an unknown name or a library that is not installed."""
    if quiet:
        return "none"
    name = (requested or os.environ.get(ENV) or "auto").strip().lower()
    where = "--progress" if requested else ENV
    if name not in (*BACKENDS, "auto"):
        raise BadInput(f"unknown progress display '{name}'; known: auto, {', '.join(BACKENDS)}", where)
    if name in ("rich", "tqdm") and not _installed(name):
        raise BadInput(f"progress display '{name}' needs {name}: pip install {name}", where)
    if name != "auto":
        return name
    if not _isatty(stream):
        return "plain"
    return next((lib for lib in ("rich", "tqdm") if _installed(lib)), "plain")


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


class Progress:
    """Done items of one step, shown on ``stream`` (stderr) by the chosen backend; a context manager.

    ``total`` may be None (unknown). ``clock`` is the time source of the plain lines' period and elapsed time.
    """

    def __init__(self, desc: str, total: int | None = None, *, quiet: bool = False, stream: IO | None = None,
                 backend: str | None = None, every_s: float | None = None, unit: str = "",
                 clock: Callable[[], float] = time.monotonic):
        self.desc = desc
        self.total = total
        self.count = 0
        self.unit = unit
        self.text = ""
        self._stream = stream if stream is not None else sys.stderr
        self.backend = choose_backend(self._stream, quiet=quiet, requested=backend)
        self._clock = clock
        self._start = clock()
        tty = _isatty(self._stream)
        self.every_s = every_s if every_s is not None else (TTY_PERIOD_S if tty else PERIOD_S)
        self._last_line = self._start
        self._closed = False
        self._bar: Any = None
        self._task: Any = None
        if self.backend == "rich":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[note]}"),
                                     console=Console(file=self._stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(desc, total=total, note="")
        elif self.backend == "tqdm":
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, file=self._stream, unit=unit or "it", leave=True,
                             dynamic_ncols=True)

    # -- use ------------------------------------------------------------------------------------------------
    def advance(self, n: int = 1, note: str | None = None) -> None:
        """``n`` more items done; ``note`` (what just finished) is shown beside the count."""
        self.count += n
        if note is not None:
            self.text = note
        if self.backend == "rich":
            self._bar.update(self._task, advance=n, note=self.text)
        elif self.backend == "tqdm":
            if note is not None:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(n)
        elif self.backend == "plain":
            now = self._clock()
            finished = self.total is not None and self.count >= self.total  # the closing line says it
            if now - self._last_line >= self.every_s and not finished:
                self._last_line = now
                self._write(self.line(now))

    def note(self, text: str) -> None:
        """Change the note without counting an item (the step now running)."""
        self.advance(0, text)

    def line(self, now: float | None = None, done: bool = False) -> str:
        """The plain line: ``[mosaic] DESC: COUNT/TOTAL (P%), ELAPSED, ~LEFT left: NOTE``."""
        elapsed = (self._clock() if now is None else now) - self._start
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            count = f"{self.count}/{self.total}{unit} ({100 * self.count / self.total:.0f}%)"
        else:
            count = f"{self.count}{unit}"
        parts = [count, ("done in " if done else "") + _seconds(elapsed)]
        if not done and self.total and 0 < self.count < self.total:
            parts.append(f"~{_seconds(elapsed / self.count * (self.total - self.count))} left")
        text = f"[mosaic] {self.desc}: {', '.join(parts)}"
        return text + (f": {self.text}" if self.text else "")

    def _write(self, text: str) -> None:
        print(text, file=self._stream, flush=True)

    def close(self) -> None:
        """Finish the display (the plain backend writes its closing line); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.backend == "rich":
            self._bar.stop()
        elif self.backend == "tqdm":
            self._bar.close()
        elif self.backend == "plain":
            self._write(self.line(done=True))

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def track(items: Iterable[T], desc: str, total: int | None = None, **options: Any) -> Iterator[T]:
    """Yield each of ``items``, counting it done when the next is asked for (``options`` as :class:`Progress`)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(desc, total, **options) as bar:
        for item in items:
            yield item
            bar.advance()


__all__ = ["BACKENDS", "ENV", "PERIOD_S", "Progress", "choose_backend", "track"]
