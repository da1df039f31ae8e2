"""`mosaic run` on the command line: live without a GPU, campaign files, offline, resume."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402

MOSAIC = str(Path(sys.executable).parent / "mosaic")


def mosaic(*args, cwd=None):
    return subprocess.run([MOSAIC, "run", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def _has_gpu():
    from mosaic.gpus import probe_devices

    return bool(probe_devices()[0])


@pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU message; this machine has a GPU")
def test_live_run_without_a_gpu_runs_the_preview_and_says_what_it_skipped(tmp_path):
    done = mosaic("--source", "pallas", "--target", "cute", "--family", "gemm", "--shape", "4096x4096x4096",
                  "--dtype", "bf16", "--out", str(tmp_path / "d"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("no GPU here: running what needs none, gpu: h200 (default; no GPU visible: "), first
    assert first.endswith("); a full campaign needs a CUDA device") and "Traceback" not in done.stderr
    data = json.loads((tmp_path / "d" / "preview.json").read_text())
    assert data["gpu"] == "h200" and data["gpu_provenance"].startswith("default; no GPU visible: ")
    skipped = {s["step"]: s["why"] for s in data["skipped"]}
    for step in ("reference capture", "numerics gate", "timing", "acceptance", "yardstick"):
        assert skipped[step].endswith("needs a CUDA device")
    assert [d["step"] for d in data["done"]][:2] == ["campaign", "reference"]  # the pallas plugin ships it
    assert "## Skipped" in done.stdout and not (tmp_path / "d" / "journal.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (["--source", "pallas", "--target", "cute"], "needs --family, --shape, --dtype"),
    (["--source", "pallas", "--target", "cute", "--family", "gemm", "--shape", "4096x4096", "--dtype", "bf16"],
     "needs 3 dimensions"),
    (["--source", "pallas", "--target", "cute", "--family", "gemm", "--shape", "8x8x8", "--dtype", "bf17"],
     "dtype='bf17' is invalid"),
    (["--source", "pallas", "--target", "cute", "--family", "gemm", "--shape", "8x8x8", "--dtype", "bf16",
      "--proposer", "command"], "needs command"),
    (["--offline", "x", "--resume", "y"], "choose one"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    done = mosaic(*args, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_campaign_file_errors(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text(rf.CAMPAIGN_TOML + "beems = 3\n")
    done = mosaic(str(bad))
    assert done.returncode == 2 and "unknown campaign setting(s) beems" in done.stderr
    bad.write_text("source = \n")
    assert "not valid TOML" in mosaic(str(bad)).stderr
    bad.write_text(rf.CAMPAIGN_TOML.replace("beam = 3", "beam = 0"))
    assert "beam=0 is invalid" in mosaic(str(bad)).stderr


def test_campaign_file_parses_like_flags():
    from mosaic.run.campaign import Campaign, load_campaign

    path = Path(__file__).parent / "_campaign.toml"
    try:
        path.write_text(rf.CAMPAIGN_TOML)
        c = load_campaign(path)
    finally:
        path.unlink()
    flags = Campaign.from_json({"source": "pallas", "target": "cute", "family": "gemm", "shape": "4096x4096x4096",
                                "dtype": "bf16", "reference_knobs": {"kernel": "jax-hopper"},
                                "start_knobs": {"kernel": "naive"}})
    assert c == flags and c.shape == {"m": 4096, "n": 4096, "k": 4096} and c.beam == 3


def test_offline_then_resume_of_a_finished_campaign(tmp_path):
    src = rf.build_campaign(tmp_path / "c")
    done = mosaic("--offline", str(src), "--out", str(tmp_path / "o"), "--quiet")
    assert done.returncode == 0 and done.stdout.startswith("converged: incumbent")
    again = mosaic("--resume", str(tmp_path / "o"))
    assert again.returncode == 0 and "had finished" in again.stdout
    missing = mosaic("--offline", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "campaign" in missing.stderr
    exists = mosaic("--offline", str(src), "--out", str(tmp_path / "o"))
    assert exists.returncode == 2 and "journal exists already" in exists.stderr
