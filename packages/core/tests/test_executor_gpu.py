"""The Ray executor on the GPU (marked ``gpu``; skipped without Ray, the Pallas and CuTe plugins, or a CUDA device):
`mosaic run --executor ray` on bf16 GEMM 4096^3 with a small budget — lowering as Ray tasks, the live workbench in a
GPU-pinned actor — ends with a report and a stop, every timing record names the GPU (UUID, clocks at the start),
and `mosaic run --offline` reproduces every recorded verdict and the stop from its bundles."""

import importlib
import json
import subprocess

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    pytest.importorskip("ray", reason="needs Ray for --executor ray")
    pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12) for the Pallas plugin")
    pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl (Python >= 3.12) for the CuTe plugin")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")


def test_a_ray_campaign_names_its_gpu_and_is_reproduced_offline(tmp_path, cuda):
    gc = importlib.import_module("gemm_campaign")  # benchmarks/ is on pytest's pythonpath
    env = gc.environment("cute")
    d = tmp_path / "campaign"
    cmd = [*gc.campaign_command("cute", "4096x4096x4096", 3, 3, "worker", d), "--executor", "ray"]
    rc = gc.run_capped(cmd, 480, env, tmp_path / "run.stdout", tmp_path / "run.log")
    log = (tmp_path / "run.log").read_text()
    assert rc == 0, log[-3000:]
    assert "ray: " in log and "evaluation actor(s) on GPU-" in log  # the actor holds a GPU
    events = [json.loads(x) for x in (d / "journal.jsonl").read_text().splitlines() if x.strip()]
    assert events[0]["executor"] == "ray" and [e["event"] for e in events].count("stop") == 1
    timed = [e for e in events if e["event"] == "timed"]
    assert timed and all(e["gpu"]["uuid"].startswith("GPU-") and e["gpu"]["clocks"]["sm_mhz"] for e in timed)
    assert len({e["gpu"]["uuid"] for e in timed}) == 1  # one GPU: every comparison on the same device
    off = subprocess.run(gc.offline_command(d), capture_output=True, text=True, env=env, timeout=300)
    assert off.returncode == 0, off.stdout[-2000:] + off.stderr[-2000:]
    assert "recorded verdicts and the stop reproduced" in off.stdout
