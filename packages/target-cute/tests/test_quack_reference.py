"""A third-party CuTe DSL kernel as a kernel file: examples/kernels/cute/quack_rmsnorm.py is our adapter whose
entry builds quack-kernels' own ``quack.rmsnorm.RMSNorm`` (the installed package) with the knobs as quack's
``RmsNormFwdConfig`` fields. On the CPU it lowers through `mosaic capture --file --lower-only` at the issue's
16384x8192 bf16 into a bundle `mosaic lift` reads; quack's heuristic launch (128 threads, no cluster, for
N = 8192) is what the defaults build, a knob replaces one of quack's choices in the compiled code, and a value
quack refuses is one error line, exit 2. On a GPU (marked gpu) it passes the rmsnorm family's float64 oracle
and is timed."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle

pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl")
pytest.importorskip("quack.rmsnorm", reason="needs quack-kernels (and torch): the .venv has them")

ADAPTER = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "cute" / "quack_rmsnorm.py"
SHAPE = "16384x8192"


def mosaic(*args, cwd, timeout=900):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def lower(*knobs, cwd, out="q.bundle"):
    return mosaic("capture", "--file", str(ADAPTER), "--lang", "cute", "--family", "rmsnorm", "--shape", SHAPE,
                  "--dtype", "bf16", *knobs, "--lower-only", "-o", out, "--force", cwd=cwd)


def test_quack_rmsnorm_lowers_on_the_cpu_and_lifts(tmp_path):
    p = lower(cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    b = load_bundle(tmp_path / "q.bundle")
    assert b.manifest["capture"]["status"] == "lowered"
    assert b.kernel.family == "rmsnorm" and b.kernel.shape == {"rows": 16384, "cols": 8192}
    assert b.one("source").read_bytes() == ADAPTER.read_bytes()
    assert b.manifest["kernel_file"]["sha256"] == hashlib.sha256(ADAPTER.read_bytes()).hexdigest()
    ptx = b.read_text("ptx")
    entry = re.search(r"\.entry\s+(\w+)", ptx).group(1)
    assert "quackrmsnormRMSNorm" in entry, entry  # quack's class compiled, not a kernel of ours
    assert ".reqntid 128, 1, 1" in ptx  # quack's _for_hopper_fwd: 128 threads up to N = 16k
    assert "cluster_ctarank" not in ptx  # and cluster_n = 1 for bf16 up to N = 16k
    assert b.read_text("sass") and b.manifest["capture"]["summary"]["resources"]["registers"] > 0
    lift = mosaic("lift", "q.bundle", "--json", cwd=tmp_path)
    assert lift.returncode == 0, lift.stderr
    doc = json.loads(lift.stdout)
    assert doc["dialect"] == "sass" and doc["kernel"] == entry and doc["instructions"] > 100
    launch = {f["key"]: f["value"] for f in doc["layers"]["launch"]}
    assert launch["block"] == [128, 1, 1] and launch["registers"] > 0


def test_a_knob_replaces_quacks_choice(tmp_path):
    p = lower("--knob", "num_threads=256", "--knob", "cluster_n=2", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    b = load_bundle(tmp_path / "q.bundle")
    assert b.kernel.knobs["num_threads"] == 256 and b.kernel.knobs["cluster_n"] == 2
    ptx = b.read_text("ptx")
    assert ".reqntid 256, 1, 1" in ptx and "cluster_ctarank" in ptx and "mapa.shared::cluster" in ptx


def test_values_quack_refuses_are_one_line(tmp_path):
    cases = [(["--knob", "num_threads=64"], r"knob class Knobs refused .*quack builds 128 or 256"),
             (["--knob", "threads_per_row=256"], r"cute\.compile failed: ValueError: threads_per_row=256 must "
                                                 r"divide num_threads=128"),
             (["--knob", "reload_from=l2"], r"reload_from='l2'"),
             (["--knob", "tile=4"], r"unknown knob\(s\) tile .*known: num_threads, threads_per_row")]
    for knobs, pattern in cases:
        p = lower(*knobs, cwd=tmp_path, out="bad.bundle")
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), (knobs, lines)
        assert re.search(pattern, lines[0]) and "Traceback" not in p.stderr, lines[0]


@pytest.mark.gpu
@pytest.mark.slow
def test_quack_rmsnorm_passes_the_oracle_on_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    p = mosaic("capture", "--file", str(ADAPTER), "--lang", "cute", "--family", "rmsnorm", "--shape", SHAPE,
               "--dtype", "bf16", "--blocks", "10", "--runs", "20", "-o", "gpu.bundle", cwd=tmp_path, timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    s = load_bundle(tmp_path / "gpu.bundle").manifest["capture"]["summary"]
    assert s["numerics_pass"] and s["deterministic"] and s["time_ns"] > 0
    print(f"quack rmsnorm {SHAPE} bf16 (quack's heuristic config): {s['time_ns'] / 1e3:.1f} us, "
          f"noise {s.get('noise_ns')}")
