"""benchmarks/amk_real_checkpoint.py, the one bounded run of issue 21's H200 figures, on the CPU: a step that fails
records its error and the run goes on; a step past its budget is killed (its process group) and recorded as such;
the summary and the run log name every step. The figures themselves need the H200 (`--vm cuda`, the default)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "amk_real_checkpoint.py"


def _run(out: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--vm", "reference", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_failing_steps_record_their_error_and_the_run_goes_on(tmp_path):
    r = _run(tmp_path / "amk", "--only", "bench,gpu-tests", "--work", str(tmp_path / "work"))
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "amk" / "summary.json").read_text())
    assert list(summary["steps"]) == ["bench", "gpu-tests"]
    for step, why in (("bench", "amk bench times the CUDA VM"), ("gpu-tests", "GPU tests: not run")):
        s = summary["steps"][step]
        assert s["status"] == "failed" and why in s["errors"]["step"], s
        assert json.loads((tmp_path / "amk" / f"{step}.json").read_text())["status"] == "failed"
    log = (tmp_path / "amk" / "run.log").read_text()
    assert "step bench: failed" in log and "step gpu-tests: failed" in log and "done in" in log


@pytest.mark.slow
def test_a_step_past_its_budget_is_killed_and_recorded(tmp_path, smollm2_checkpoint):
    """prepare (int8 copy, GGUF import, nvcc builds: well over a minute on the CPU) cut at 11 s (--scale 0.11 of
    its 100 s); the run still ends with its summary, figures absent."""
    t = time.time()
    r = _run(tmp_path / "amk", "--only", "prepare", "--scale", "0.11", "--work", str(tmp_path / "work"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert time.time() - t < 60
    summary = json.loads((tmp_path / "amk" / "summary.json").read_text())
    s = summary["steps"]["prepare"]
    assert s["status"] == "killed at its budget (11 s)", s
    assert 10 <= s["wall_s"] < 30
    assert summary["figures"]["(3) float32"] is None
    assert "step prepare: killed at its budget (11 s)" in (tmp_path / "amk" / "run.log").read_text()


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--prompts", "9"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "--prompts 1..8" in r.stderr
