"""A live Pallas -> CuTe convergence campaign on the GPU (marked ``gpu``; skipped without the Pallas and CuTe plugins'
jax >= 0.11.2 and CuTe DSL, or without torch on a CUDA device): the acceptance check of benchmarks/gemm_campaign.py
at test scale. `mosaic run` (the command users type) on bf16 GEMM 4096^3 with a small budget ends with a report and
a stop, and `mosaic run --offline` on its directory reproduces every recorded verdict and the stop from the bundles
alone (exit 0)."""

import importlib
import json
import subprocess

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12) for the Pallas plugin")
    pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl (Python >= 3.12) for the CuTe plugin")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")


def test_live_campaign_is_reproduced_offline(tmp_path, cuda):
    gc = importlib.import_module("gemm_campaign")  # benchmarks/ is on pytest's pythonpath
    env = gc.environment("cute")
    d = tmp_path / "campaign"
    rc = gc.run_capped(gc.campaign_command("cute", "4096x4096x4096", 2, 3, "worker", d), 420, env,
                       tmp_path / "run.stdout", tmp_path / "run.log")
    assert rc == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert (d / "report.md").is_file() and (d / "journal.jsonl").is_file()
    events = [json.loads(x) for x in (d / "journal.jsonl").read_text().splitlines() if x.strip()]
    assert [e["event"] for e in events].count("stop") == 1 and any(e["event"] == "verdict" for e in events)
    off = subprocess.run(gc.offline_command(d), capture_output=True, text=True, env=env, timeout=300)
    assert off.returncode == 0, off.stdout[-2000:] + off.stderr[-2000:]
    assert "recorded verdicts and the stop reproduced" in off.stdout
    lines = gc.summary_lines(d)
    assert any(x.startswith("reference: ") for x in lines) and any(x.startswith("stop: ") for x in lines)
