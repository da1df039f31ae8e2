"""Every recorded H200 campaign under examples/ re-decided from its bundles alone (no GPU): the offline decision must
reproduce every recorded verdict and the stop, and name the same final incumbent as the recorded report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CAMPAIGNS = sorted(p.parent for p in EXAMPLES.glob("*/journal.jsonl"))
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]


def test_there_are_recorded_campaigns():
    assert {"h200-pallas-to-cute-gemm-4096", "h200-pallas-to-cutlass-gemm-4096"} <= {p.name for p in CAMPAIGNS}


@pytest.mark.parametrize("campaign", CAMPAIGNS, ids=[p.name for p in CAMPAIGNS])
def test_offline_reproduces_every_verdict(campaign, tmp_path):
    out = tmp_path / "redecided"
    p = subprocess.run([*MOSAIC, "run", "--offline", str(campaign), "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "recorded verdicts and the stop reproduced" in p.stdout, p.stdout
    assert "MISMATCH" not in p.stdout
    recorded = json.loads((campaign / "report.json").read_text())
    redecided = json.loads((out / "report.json").read_text())
    for key in ("final", "stop"):
        assert redecided[key] == recorded[key], key
