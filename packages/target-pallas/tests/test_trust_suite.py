"""``mosaic trust`` on the CPU: every Pallas exploit kernel file is rejected by the numerics gate at the stage
that names what it tried, and the honest control passes all 30 cases (3 shapes, two of them unseen, x 2 seeds
drawn for the run x 5 distributions) -- in jax's GPU interpreter with its race detector, in a child process."""

import json
import os
import subprocess
import sys

import pytest
from mosaic import trust
from mosaic.plugins import host

pytest.importorskip("jax", minversion="0.11.2",
                    reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")

#: exploit -> the gate stage that must catch it (what it tried, not an accident of the environment)
EXPECTED = {
    "honest-softmax": None,
    "zero-output": "oracle", "constant-output": "oracle", "nan-output": "oracle", "half-precision-math": "oracle",
    "skipped-last-block": "oracle", "closed-form": "oracle", "seed-zero-answer": "oracle",
    "replay-reference": "oracle", "uninitialised-smem": "oracle",
    "hard-coded-shape": ("oracle", "run"),  # more rows: never written (NaN); fewer: read out of bounds
    "library-call": "kernel", "fallback-to-library": "kernel", "racy-store": "race", "writes-campaign": "writes",
}


def _exploits():
    return trust.selected(host().items("exploits"), language="pallas")


def test_every_registered_exploit_has_an_expectation():
    assert sorted(e.exploit for e in _exploits()) == sorted(EXPECTED)


@pytest.mark.parametrize("exploit", _exploits(), ids=lambda e: e.exploit)
def test_gate_catches_exploit(exploit):
    row = trust.run_one(exploit)
    print(f"\n{row.exploit}: {row.outcome} [{row.stage}] {row.reason} ({row.cases} cases, {row.wall_s} s)")
    want = EXPECTED[exploit.exploit]
    if want is None:
        assert row.outcome == "passed", row.reason
        assert row.cases == 30
        return
    assert row.outcome == "rejected", row.reason
    assert row.stage in ((want,) if isinstance(want, str) else want), (row.stage, row.reason)


def test_unseen_shapes_are_where_the_fallback_hides():
    """The fallback runs the kernel at the campaign's shape: only an unseen shape exposes it."""
    (e,) = [x for x in _exploits() if x.exploit == "fallback-to-library"]
    row = trust.run_one(e)
    assert row.stage == "kernel" and "unseen shape" in row.reason, row.reason


def mosaic(*args):
    env = {k: v for k, v in os.environ.items() if k != "MOSAIC_DEBUG"}
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_trust_cli_json_and_bad_name():
    r = mosaic("trust", "--exploit", "zero-output", "--exploit", "honest-softmax", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["summary"]["accepted"] == 0 and data["summary"]["controls_rejected"] == 0
    assert {row["exploit"]: row["outcome"] for row in data["rows"]} == {"honest-softmax": "passed",
                                                                        "zero-output": "rejected"}
    bad = mosaic("trust", "--exploit", "no-such-exploit")
    assert bad.returncode == 2 and "no exploit matches" in bad.stderr and "Traceback" not in bad.stderr
