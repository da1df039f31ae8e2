"""kill -9 of a running `mosaic run` (offline workbench, a slow agent) mid-campaign, then --resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import test_proposers as tp  # noqa: E402

MOSAIC = str(Path(sys.executable).parent / "mosaic")


def events(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.endswith("}")]


def test_kill_9_mid_campaign_then_resume_loses_nothing(tmp_path):
    src = tp.agent_campaign(tmp_path / "c")
    reference = tp.run_agent(src, tmp_path / "ref.log", out=tmp_path / "uninterrupted")
    assert reference.returncode == 0, reference.stderr
    want = [(e["step"], e["key"], e["decision"], e["reason_code"])
            for e in events(tmp_path / "uninterrupted" / "journal.jsonl") if e["event"] == "verdict"]

    out = tmp_path / "run"
    env = {"AGENT_LOG": str(tmp_path / "agent.log"), "AGENT_DELAY": "0.4", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([MOSAIC, "run", "--offline", str(src), "--out", str(out), "--quiet",
                             "--command", tp.agent_command()], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    journal = out / "journal.jsonl"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # wait for two accepted edits past the naive translation
            if journal.is_file() and sum(e["event"] == "incumbent" for e in events(journal)) >= 3:
                break
            assert proc.poll() is None, "the run finished before it could be killed"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its agent: our own process group
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = events(journal)
    assert not any(e["event"] == "stop" for e in before)
    accepted_before = [(e["key"], e["step"]) for e in before if e["event"] == "verdict" and e["decision"] == "accepted"]
    assert len(accepted_before) >= 3
    with open(journal, "ab") as fh:  # and what a kill during a write leaves behind
        fh.write(b'{"event": "timed", "key": "trunc')

    done = subprocess.run([MOSAIC, "run", "--resume", str(out), "--quiet", "--command", tp.agent_command()], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "torn" in done.stderr
    after = events(journal)
    assert after[: len(before)] == before  # history kept line for line
    got = [(e["step"], e["key"], e["decision"], e["reason_code"]) for e in after if e["event"] == "verdict"]
    assert got == want
    assert after[-1]["event"] == "stop" and after[-1]["stop"] == "converged"
    assert (out / "report.html").is_file()
    # nothing measured twice: one timed record per (candidate, incumbent) pair
    pairs = [(e["key"], e["against"]) for e in after if e["event"] == "timed"]
    assert len(pairs) == len(set(pairs))
