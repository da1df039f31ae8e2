"""The recorded H200 campaign in examples/ (Pallas -> CuTe, bf16 4096^3, converged) must re-decide from its bundles
with every verdict and the stop unchanged: a change to lifting, diffing, the noise statistic or the acceptance
predicate that would have decided that real campaign differently fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "h200-pallas-to-cute-gemm-4096"


def test_recorded_h200_campaign_redecides_identically(tmp_path):
    mosaic = str(Path(sys.executable).parent / "mosaic")
    done = subprocess.run([mosaic, "run", "--offline", str(EXAMPLE), "--out", str(tmp_path / "r"), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "offline re-decision: all 4 recorded verdicts and the stop reproduced" in done.stdout
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    final = rep["final"]
    assert final["incumbent"] == "658d8bd7ae3ee513" and rep["stop"]["code"] == "converged"
    assert final["knobs"]["tile_mn"] == [128, 256] and final["within_noise_or_faster"]
    assert (final["t_incumbent_ns"], final["t_reference_ns"]) == (180544.0, 180416.0)
    assert final["timed_candidates"] == 3 and 0.97 < final["fraction_of_yardstick"] < 0.975
