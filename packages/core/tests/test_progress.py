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
