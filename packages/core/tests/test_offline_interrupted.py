"""``mosaic run --offline`` on an interrupted journal (no stop event): the H200 pallas -> cutlass 8192^3 campaign
killed at the wall cap while step 5's numerics gate hung (results/2026-12-01/session8/cutlass-8192/). Only the
steps with a recorded verdict are re-decided; the interrupted step is named, not re-decided; exit 0 when every
recorded verdict reproduces, and a changed recorded verdict is still a mismatch."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from mosaic.run.offline import interruption, redecide

ROOT = Path(__file__).resolve().parents[3]
TARBALL = ROOT / "results" / "2026-12-01" / "session8" / "cutlass-8192" / "campaign.tar.xz"
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
INTERRUPTED = "interrupted at step 5 (93aad744f83e8e9e: no verdict recorded); not re-decided"


@pytest.fixture
def campaign(tmp_path):
    if not TARBALL.is_file():
        pytest.skip(f"{TARBALL} is not in this checkout")
    with tarfile.open(TARBALL) as tar:
        tar.extractall(tmp_path, filter="data")
    d = tmp_path / "gemm-campaign"
    events = [json.loads(line) for line in (d / "journal.jsonl").read_text().splitlines()]
    assert not any(e["event"] == "stop" for e in events) and events[-1]["event"] == "proposal"
    return d


def _events(d):
    return [json.loads(line) for line in (d / "journal.jsonl").read_text().splitlines()]


def _write(d, events):
    (d / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_the_hung_8192_campaign_is_redecided_up_to_its_last_verdict(campaign, tmp_path):
    out = tmp_path / "redecided"
    p = subprocess.run([*MOSAIC, "run", "--offline", str(campaign), "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert INTERRUPTED in p.stderr and "MISMATCH" not in p.stdout + p.stderr
    assert "all 5 recorded verdicts reproduced; the recorded run was interrupted" in p.stdout
    assert "and the stop reproduced" not in p.stdout  # no stop was recorded, so none is claimed
    redecided = _events(out)
    verdicts = [(e["step"], e["key"], e["decision"], e["reason_code"]) for e in redecided if e["event"] == "verdict"]
    assert verdicts == [(0, "cfdc1fd6d59df9f1", "accepted", "naive"), (1, "32e34023b05b2bb8", "rejected", "slower"),
                        (2, "ec8202a2e86fa42f", "accepted", "faster"), (3, "abbd717d18f9799e", "rejected", "slower"),
                        (4, "359e42f5b422e2d3", "rejected", "slower")]
    # the step that hung is never built nor gated offline, and nothing is proposed past the recorded steps
    assert not any(e.get("key") == "93aad744f83e8e9e" and e["event"] != "proposal" for e in redecided)
    assert all(not e["ok"] for e in redecided if e["event"] == "proposal" and e["step"] >= 5)


def test_a_changed_recorded_verdict_is_still_a_mismatch(campaign, tmp_path):
    events = _events(campaign)
    for e in events:
        if e["event"] == "verdict" and e["step"] == 3:
            e["decision"], e["reason_code"] = "accepted", "faster"
    _write(campaign, events)
    r = redecide(campaign, tmp_path / "out", quiet=True)
    assert r.interrupted == INTERRUPTED and r.recorded_verdicts == 5
    assert r.problems == ("verdict 4: recorded step 3 abbd717d18f9799e accepted (faster), re-decided step 3 "
                          "abbd717d18f9799e rejected (slower)",)


def test_interrupted_between_steps_and_finished_journals(campaign):
    events = _events(campaign)
    at = next(i for i, e in enumerate(events) if e["event"] == "proposal" and e["step"] == 5)
    kept, line = interruption(events)
    assert kept == events[:at] and line == INTERRUPTED
    kept, line = interruption(events[:at])  # killed after step 4's verdict: every recorded step is re-decided
    assert kept == events[:at] and line == "interrupted after step 4 (no stop recorded); every recorded step re-decided"
    refused = [*events[:at], {**events[at], "ok": False, "key": None}]  # a refused proposal has no verdict
    assert interruption(refused)[1].startswith("interrupted after step 5")
    finished = [*events[:at], {"event": "stop", "stop": "budget"}]
    assert interruption(finished) == (finished, None)


def test_a_journal_killed_in_the_naive_step_compares_nothing_it_did_not_record(campaign, tmp_path):
    events = _events(campaign)
    at = next(i for i, e in enumerate(events) if e["event"] == "proposal" and e["step"] == 0)
    _write(campaign, events[:at + 2])  # the naive kernel proposed and built, killed in its gate
    r = redecide(campaign, tmp_path / "out", quiet=True)
    assert r.interrupted == "interrupted at step 0 (cfdc1fd6d59df9f1: no verdict recorded); not re-decided"
    assert r.recorded_verdicts == 0 and r.problems == ()
