"""mosaic.progress: the backend choice, the plain lines' period and text, quiet, and the real rich/tqdm bars."""

from __future__ import annotations

import io
import os

import pytest
from mosaic.errors import BadInput
from mosaic.progress import ENV, Progress, choose_backend, track


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


def test_not_a_terminal_writes_only_periodic_lines_and_the_closing_line():
    out, clock = io.StringIO(), Clock()
    with Progress("capture", total=10, stream=out, clock=clock) as bar:
        assert bar.backend == "plain" and bar.every_s == 30.0
        for i in range(10):
            clock.t += 7.0  # 7 s per item: a line once 30 s passed since the last (item 5 at 35 s, then 70 s)
            bar.advance(note=f"k{i}")
    lines = out.getvalue().splitlines()
    # item 10 at 70 s is the last: the closing line says it, once
    assert lines == ["[mosaic] capture: 5/10 (50%), 35 s, ~35 s left: k4",
                     "[mosaic] capture: 10/10 (100%), done in 1 min 10 s: k9"]


def test_quiet_writes_nothing_at_all():
    out, clock = io.StringIO(), Clock()
    with Progress("candidates", total=3, stream=out, quiet=True, clock=clock) as bar:
        for _ in range(3):
            clock.t += 100
            bar.advance(note="x")
    assert bar.backend == "none" and out.getvalue() == "" and bar.count == 3


def test_unknown_total_and_units():
    out, clock = io.StringIO(), Clock()
    bar = Progress("sweep", stream=out, unit="configs", every_s=1, clock=clock)
    clock.t += 2
    bar.advance(3)
    bar.close()
    bar.close()  # idempotent
    assert out.getvalue().splitlines() == ["[mosaic] sweep: 3 configs, 2.0 s", "[mosaic] sweep: 3 configs, done in 2.0 s"]


def test_env_chooses_and_a_bad_name_is_one_clear_error(monkeypatch):
    out = io.StringIO()
    monkeypatch.setenv(ENV, "none")
    assert choose_backend(out) == "none"
    monkeypatch.setenv(ENV, "fancy")
    with pytest.raises(BadInput, match=r"unknown progress display 'fancy'; known: auto, rich, tqdm, plain, none"):
        Progress("x", stream=out)
    assert choose_backend(out, quiet=True) == "none"  # --quiet wins over the environment


def test_a_real_terminal_gets_rich_then_tqdm_then_plain():
    import importlib.util

    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            assert tty.isatty()
            expected = next((m for m in ("rich", "tqdm") if importlib.util.find_spec(m)), "plain")
            assert choose_backend(tty) == expected
            assert choose_backend(io.StringIO()) == "plain"
    finally:
        os.close(master)
        os.close(slave)


def test_rich_bar_shows_description_count_and_note():
    pytest.importorskip("rich")
    out = io.StringIO()
    with Progress("lowering", total=4, stream=out, backend="rich") as bar:
        for i in range(4):
            bar.advance(note=f"cand{i}")
    text = out.getvalue()
    assert "lowering" in text and "4/4" in text and "cand3" in text


def test_tqdm_bar_shows_description_count_and_note():
    pytest.importorskip("tqdm")
    out = io.StringIO()
    with Progress("timing", total=4, stream=out, backend="tqdm", unit="runs") as bar:
        for _ in range(4):
            bar.advance(note="ok")
    text = out.getvalue()
    assert "timing" in text and "4/4" in text and "runs" in text and "ok" in text


def test_track_counts_each_item_once_it_is_done():
    out, clock = io.StringIO(), Clock()
    seen = []
    for item in track(["a", "b", "c"], "items", stream=out, every_s=0, clock=clock):
        clock.t += 1
        seen.append(item)
    assert seen == ["a", "b", "c"]
    assert out.getvalue().splitlines()[-1] == "[mosaic] items: 3/3 (100%), done in 3.0 s"
    assert out.getvalue().splitlines()[0] == "[mosaic] items: 1/3 (33%), 1.0 s, ~2.0 s left"


# -- Wait: one blocking wait (a lowering, a gate, a timing session), shown while it lasts -------------------

def test_wait_in_a_log_writes_a_line_per_period_naming_what_it_waits_on_and_its_limit():
    from mosaic.progress import Wait

    out, clock = io.StringIO(), Clock()
    with Wait("the numerics gate of cand-1a2b", limit_s=101, why="5 x the slowest gate so far (20.2 s)",
              note="the worker", stream=out, tick_s=0, clock=clock) as w:
        assert w.backend == "plain" and w.every_s == 30.0
        for _ in range(95):  # 95 s, ticked each second: a line at 30, 60 and 90 s only
            clock.t += 1
            w.tick()
    assert out.getvalue().splitlines() == [
        f"[mosaic] waiting on the numerics gate of cand-1a2b: {s} of at most 1 min 41 s "
        "(5 x the slowest gate so far (20.2 s)): the worker" for s in ("30 s", "1 min 00 s", "1 min 30 s")]
    assert w.lines == 3


def test_a_short_wait_in_a_log_writes_nothing_and_quiet_never_does():
    from mosaic.progress import Wait

    out, clock = io.StringIO(), Clock()
    with Wait("lowering k", limit_s=900, stream=out, tick_s=0, clock=clock) as w:
        for _ in range(29):
            clock.t += 1
            w.tick()
    assert out.getvalue() == ""
    with Wait("lowering k", quiet=True, stream=out, tick_s=0, clock=clock) as w:
        clock.t += 100
        w.tick()
    assert w.backend == "none" and out.getvalue() == ""


def test_wait_started_earlier_counts_from_then():
    from mosaic.progress import Wait

    clock = Clock()
    w = Wait("lowering k", since=clock.t - 40, stream=io.StringIO(), tick_s=0, clock=clock)
    assert w.line().startswith("[mosaic] waiting on lowering k: 40 s")


def test_wait_on_a_terminal_rewrites_one_line_and_clears_it_at_the_end():
    from mosaic.progress import Wait

    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            clock = Clock()
            with Wait("timing k against reference", limit_s=60, stream=tty, backend="plain", tick_s=0,
                      delay_s=1.0, clock=clock) as w:
                w.tick()  # before delay_s: nothing
                for _ in range(3):
                    clock.t += 1
                    w.tick()
            tty.flush()
            import select

            text = ""
            while select.select([master], [], [], 0.5)[0]:
                text += os.read(master, 4096).decode()
    finally:
        os.close(master)
        os.close(slave)
    shown = [part.replace("\x1b[K", "") for part in text.split("\r") if part.replace("\x1b[K", "")]
    assert shown == [f"[mosaic] waiting on timing k against reference: {s}.0 s of at most 1 min 00 s" for s in (1, 2, 3)]
    assert text.endswith("\r\x1b[K")  # cleared: the caller's own line says how the wait ended


def test_wait_ticks_by_itself_in_a_thread_while_the_caller_blocks():
    import time as real_time

    from mosaic.progress import Wait

    out = io.StringIO()
    with Wait("a sleeping child", stream=out, every_s=0.2, delay_s=0.0, tick_s=0.05):
        real_time.sleep(0.75)
    lines = out.getvalue().splitlines()
    prefix = "[mosaic] waiting on a sleeping child: "
    assert all(ln.startswith(prefix) and ln.endswith(" s") for ln in lines), lines
    # the thread kept ticking (a thread that ticked once writes one line) and spaced its lines every_s apart (one
    # per tick, 15 in 0.75 s, without it): lines at about 0.2, 0.4 and 0.6 s
    shown = [float(ln[len(prefix):-2]) for ln in lines]
    assert 2 <= len(shown) <= 4, lines
    assert shown[0] >= 0.2 and all(b - a >= 0.15 for a, b in zip(shown, shown[1:], strict=False)), lines


def test_wait_rich_and_tqdm_bars_on_a_terminal_name_the_wait_and_its_limit(monkeypatch):
    import fcntl
    import select
    import struct
    import termios

    from mosaic.progress import Wait

    monkeypatch.setenv("COLUMNS", "200")  # rich sizes itself from the environment under pytest's capture
    for backend in ("rich", "tqdm"):
        pytest.importorskip(backend)
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))  # a 200-column terminal
        try:
            with os.fdopen(slave, "w", closefd=False) as tty:
                clock = Clock()
                with Wait("the reference capture", limit_s=900, why="the reference capture's cap", stream=tty,
                          backend=backend, tick_s=0, clock=clock) as w:
                    clock.t += 5
                    w.tick()
                    w.tick()
                tty.flush()
                text = ""
                while select.select([master], [], [], 0.5)[0]:
                    text += os.read(master, 65536).decode(errors="replace")
        finally:
            os.close(master)
            os.close(slave)
        assert "waiting on the reference capture" in text and "reference capture's cap" in text, (backend, text)
        assert "900" in text or "15 min" in text, (backend, text)
