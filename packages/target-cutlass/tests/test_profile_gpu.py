"""`mosaic capture --profile` on the GPU with the real Nsight Compute: the CUDA rmsnorm example's one profiled
launch is found by its name, its metrics are stored in the bundle, the stored CSV parses back to the same
metrics, and lifting the bundle (no ncu needed) gives the machine layer's rows."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle
from mosaic.profile import parse_raw_csv

RMSNORM = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "cuda" / "rmsnorm.cu"


def mosaic(*args, cwd, timeout=900):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


@pytest.mark.gpu
def test_profiled_capture_lifts_into_machine_rows(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    p = mosaic("capture", "--file", str(RMSNORM), "--lang", "cutlass", "--family", "rmsnorm", "--shape", "4096x8192",
               "--dtype", "bf16", "--blocks", "10", "--runs", "10", "--profile", "-o", "p.bundle", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    b = load_bundle(tmp_path / "p.bundle")
    paths = {f.path for f in b.files if f.role == "profile"}
    assert {"profile.json", "profile.csv"} <= paths
    record = json.loads((b.root / "profile.json").read_text())
    assert record["kernel"] == "rmsnorm" and record["picked_by"] == "name", record["kernels"]
    assert parse_raw_csv((b.root / "profile.csv").read_text(), "rmsnorm").metrics == record["metrics"]
    q = mosaic("lift", "--json", str(tmp_path / "p.bundle"), cwd=tmp_path)
    assert q.returncode == 0, q.stderr
    machine = {f["key"]: f["value"] for f in json.loads(q.stdout)["layers"]["machine"]}
    print({k: machine[k] for k in ("stalls.top", "memory_throughput", "occupancy.achieved", "l2.hit_rate",
                                   "tensor_pipe")})
    assert machine["stalls.top"] and machine["memory_throughput"] is not None
    assert 0 < machine["occupancy.achieved"] <= 100 and 0 <= machine["l2.hit_rate"] <= 100
