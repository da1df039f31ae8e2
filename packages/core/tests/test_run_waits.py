"""What a campaign waits on is shown while it waits (mosaic.progress.Wait in the live workbench): a numerics gate
in a real worker process that hangs until its scaled limit is shown on stderr as 'waiting on the numerics gate of
KEY: N s of at most L s (WHY): the worker', the display stops when the wait ends, --quiet shows nothing, and stdout
gets none of it."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from mosaic.progress import ENV
from mosaic.run.live.parent import LiveWorkbench, Timeouts

HERE = Path(__file__).resolve().parent
SCRIPT = [sys.executable, str(HERE / "worker_script.py")]
sys.path.insert(0, str(HERE))
from test_request_timeouts import _candidate, _route, budget_campaign, campaign  # noqa: E402 - the same stand-ins

LINE = re.compile(r"^\[mosaic\] waiting on the numerics gate of (\S+): ([\d.]+) s of at most (\S+) s \((.+)\): "
                  r"the worker$")


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


def test_a_hanging_gate_is_shown_with_its_limit_until_it_is_killed(tmp_path):
    err = io.StringIO()
    bench = LiveWorkbench(campaign(), tmp_path, progress=lambda line: None, worker_argv=SCRIPT,
                          timeouts=Timeouts(check=3.0), wait_options={"stream": err, "every_s": 0.5, "tick_s": 0.1})
    try:
        k = _candidate(bench, 64)
        _route(bench, "hang", pidfile=str(tmp_path / "h.pid"))
        checked = bench._gate(k, bench.dest(k.key))
        shown = err.getvalue().splitlines()
        import time

        time.sleep(0.6)  # a display that outlived its wait would write again by now
        assert err.getvalue().splitlines() == shown
    finally:
        bench.close()
    assert not checked.passed and checked.reason.startswith("hang: killed after 3 s (the cap")
    parsed = [LINE.match(ln) for ln in shown]
    assert shown and all(parsed), shown
    assert {m.group(1) for m in parsed} == {k.key} and {m.group(3) for m in parsed} == {"3.0"}
    assert {m.group(4) for m in parsed} == {"the cap (nothing measured yet)"}
    seconds = [float(m.group(2)) for m in parsed]
    # every 0.5 s from the 1 s delay until the kill at 3 s (slack for a loaded machine)
    assert seconds == sorted(seconds) and 1.0 <= seconds[0] < 2.5 and seconds[-1] <= 6.0 and 2 <= len(seconds) <= 11


def test_quiet_shows_no_wait(tmp_path):
    err = io.StringIO()
    bench = LiveWorkbench(campaign(), tmp_path, progress=None, worker_argv=SCRIPT, timeouts=Timeouts(check=2.0),
                          wait_options={"stream": err, "every_s": 0.2, "tick_s": 0.05})
    try:
        assert bench.show_waits is False
        k = _candidate(bench, 64)
        _route(bench, "hang", pidfile=str(tmp_path / "h.pid"))
        assert not bench._gate(k, bench.dest(k.key)).passed
    finally:
        bench.close()
    assert err.getvalue() == ""


def test_a_bad_progress_display_is_one_line_before_anything_runs(tmp_path, monkeypatch):
    from mosaic.errors import BadInput

    monkeypatch.setenv(ENV, "fancy")
    with pytest.raises(BadInput, match="unknown progress display 'fancy'"):
        LiveWorkbench(campaign(), tmp_path, progress=lambda line: None, worker_argv=SCRIPT)


def test_a_campaign_shows_its_gate_wait_on_stderr_and_nothing_on_stdout(tmp_path, capsys):
    """The convergence loop over test_request_timeouts' budget campaign (its step-1 gate asked of a real
    LiveWorkbench whose worker hangs): stderr carries the loop's lines and the gate's wait, naming the step-1
    candidate and the device budget it was cut at (the kernel is left unjudged, not failed)."""
    import json

    from mosaic.run.journal import Journal
    from mosaic.run.loop import run_campaign, stderr_progress

    c, bench, live = budget_campaign(tmp_path, progress=stderr_progress,
                                     wait_options={"every_s": 0.5, "tick_s": 0.1})
    try:
        outcome = run_campaign(c, bench, Journal.create(tmp_path / "out"))
    finally:
        live.close()
    out, err = capsys.readouterr()
    assert outcome.stop == "budget" and out == ""
    events = [json.loads(line) for line in (tmp_path / "out" / "journal.jsonl").read_text().splitlines()]
    step1 = next(e["key"] for e in events if e["event"] == "verdict" and e["step"] == 1)
    waits = [ln for ln in err.splitlines() if ln.startswith("[mosaic] waiting on ")]
    assert waits and all(ln.startswith(f"[mosaic] waiting on the numerics gate of {step1}: ") for ln in waits), err
    assert all("of at most 3.0 s (what is left of the 0.75 device-minute budget): the worker" in ln for ln in waits)
    loop_lines = [ln for ln in err.splitlines() if not ln.startswith("[mosaic] ")]
    assert any(f"step 1: {step1} not judged: budget: killed after 3 s" in ln for ln in loop_lines)  # how it ended
    assert "stop: budget" in loop_lines[-1]
