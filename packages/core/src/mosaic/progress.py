"""Progress of a long step (a capture's builds, a campaign's candidates, a tuning sweep): one small abstraction.

:class:`Progress` counts items; :class:`Wait` shows one blocking wait (a lowering, a numerics gate, a timing
session of ``mosaic run``): what it waits on, the seconds so far and the limit it runs under.

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
import threading
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
                                     console=Console(file=self._stream), transient=False,
                                     redirect_stdout=False)  # stdout is the verb's (--json): never moved
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


class Wait:
    """One blocking wait, shown while it lasts: ``[mosaic] waiting on DESC: 31 s of at most 300 s (WHY): NOTE``.

    The backend is :func:`choose_backend`'s, as for :class:`Progress`: ``rich``/``tqdm`` a transient bar of the
    seconds against ``limit_s`` (it disappears when the wait ends: the caller then says how it ended);
    ``plain`` on a terminal one line rewritten in place and cleared at the end; ``plain`` elsewhere (a log, CI)
    one line per ``every_s`` seconds (default :data:`PERIOD_S`), so a wait shorter than that writes nothing;
    ``none`` nothing. Nothing shows before ``delay_s``: an answer that comes at once (a replayed step) never
    flickers. A thread ticks every ``tick_s`` seconds (``tick_s=0``: none; the caller calls :meth:`tick`)."""

    def __init__(self, desc: str, *, limit_s: float | None = None, why: str = "", note: str = "",
                 quiet: bool = False, stream: IO | None = None, backend: str | None = None,
                 every_s: float | None = None, delay_s: float = 1.0, tick_s: float = 1.0,
                 since: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.desc, self.limit_s, self.why, self.note = desc, limit_s, why, note
        self._stream = stream if stream is not None else sys.stderr
        self.backend = choose_backend(self._stream, quiet=quiet, requested=backend)
        self._tty = _isatty(self._stream)
        self.every_s = every_s if every_s is not None else PERIOD_S
        self.delay_s, self.tick_s, self._clock = delay_s, tick_s, clock
        self._start = clock() if since is None else since  # since: a ``clock`` value the wait began at
        self._last_line: float | None = None
        self._shown = False
        self._bar: Any = None
        self._task: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines = 0  # plain lines written (the periodic ones)

    def elapsed(self, now: float | None = None) -> float:
        return (self._clock() if now is None else now) - self._start

    def line(self, now: float | None = None) -> str:
        """``[mosaic] waiting on DESC: ELAPSED[ of at most LIMIT][ (WHY)][: NOTE]``."""
        text = f"[mosaic] waiting on {self.desc}: {_seconds(self.elapsed(now))}"
        if self.limit_s:
            text += f" of at most {_seconds(self.limit_s)}"
        if self.why:
            text += f" ({self.why})"
        return text + (f": {self.note}" if self.note else "")

    def tick(self) -> None:
        """Show the wait as it stands now (the thread calls this every ``tick_s`` seconds)."""
        with self._lock:
            if self.backend == "none" or self._stop.is_set():
                return
            now = self._clock()
            elapsed = self.elapsed(now)
            if elapsed < self.delay_s:
                return
            if self.backend == "plain" and not self._tty:
                if elapsed >= self.every_s and (self._last_line is None or now - self._last_line >= self.every_s):
                    self._last_line = now
                    self.lines += 1
                    print(self.line(now), file=self._stream, flush=True)
                return
            if not self._shown:
                self._open()
            if self.backend == "rich":
                self._bar.update(self._task, completed=min(elapsed, self.limit_s or elapsed),
                                 description=self.line(now).removeprefix("[mosaic] "))
            elif self.backend == "tqdm":
                self._bar.n = int(min(elapsed, self.limit_s or elapsed))
                self._bar.refresh()
            else:  # plain on a terminal: the one line, rewritten in place
                self._stream.write("\r" + self.line(now) + "\x1b[K")
                self._stream.flush()

    def _tail(self) -> str:
        return " ".join(t for t in ((f"({self.why})" if self.why else ""), self.note) if t)

    def _open(self) -> None:
        self._shown = True
        total = self.limit_s if self.limit_s else None
        if self.backend == "rich":
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn
            from rich.progress import Progress as RichProgress

            # a short bar of the seconds against the limit, then the plain line (rich cuts it at the edge)
            self._bar = RichProgress(BarColumn(bar_width=16), TextColumn("{task.description}"),
                                     console=Console(file=self._stream), transient=True, redirect_stdout=False)
            self._bar.start()
            self._task = self._bar.add_task(self.line().removeprefix("[mosaic] "), total=total)
        elif self.backend == "tqdm":
            from tqdm import tqdm

            tail = self._tail().replace("{", "{{").replace("}", "}}")
            self._bar = tqdm(total=int(total) if total else None, desc=f"waiting on {self.desc}", file=self._stream,
                             unit="s", leave=False, dynamic_ncols=True,
                             bar_format=("{desc}: {n_fmt}/{total_fmt} s |{bar:20}| " if total else "{desc}: {n_fmt} s ")
                             + tail)

    def close(self) -> None:
        """Stop the ticks and take the display away (a plain log keeps its lines); idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None
        with self._lock:
            if not self._shown:
                return
            self._shown = False
            if self.backend == "rich":
                self._bar.stop()
            elif self.backend == "tqdm":
                self._bar.close()
            elif self.backend == "plain":
                self._stream.write("\r\x1b[K")
                self._stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.tick()

    def __enter__(self) -> Wait:
        if self.backend != "none" and self.tick_s > 0:
            self._thread = threading.Thread(target=self._run, name=f"mosaic-wait {self.desc}", daemon=True)
            self._thread.start()
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


__all__ = ["BACKENDS", "ENV", "PERIOD_S", "Progress", "Wait", "choose_backend", "track"]
