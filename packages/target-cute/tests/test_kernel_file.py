"""CuTe DSL kernel files through `mosaic capture --file --lang cute` on the CPU: the shipped example
(examples/kernels/cute/rmsnorm.py) compiles ahead of time for sm_90a into a bundle holding the file (and its
SHA-256), PTX, cubin, SASS, ptxas log; a knob value reaches the compiled code; a file whose import raises,
whose knob class refuses a value, or whose entry does not compile is one error line, exit 2; `mosaic lift`
reads the bundle. On a GPU (marked gpu) it passes the rmsnorm oracle and is timed."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle

pytest.importorskip("cutlass.cute",
                    reason="needs nvidia-cutlass-dsl (Python >= 3.12): run in .venv312 (make test does)")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "cute" / "rmsnorm.py"


def mosaic(*args, cwd, timeout=900):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def lower(path, *knobs, cwd, out="r.bundle", shape="4096x8192"):
    return mosaic("capture", "--file", str(path), "--lang", "cute", "--family", "rmsnorm", "--shape", shape,
                  "--dtype", "bf16", *knobs, "--lower-only", "-o", out, "--force", cwd=cwd)


def test_cute_rmsnorm_file_lowers_into_a_bundle(tmp_path):
    p = lower(EXAMPLE, "--knob", "threads=512", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    b = load_bundle(tmp_path / "r.bundle")
    assert b.manifest["capture"]["status"] == "lowered" and b.kernel.knobs == {"threads": 512, "eps": 1e-6}
    assert b.one("source").read_bytes() == EXAMPLE.read_bytes()
    assert b.manifest["kernel_file"]["sha256"] == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    ptx = b.read_text("ptx")
    assert ".reqntid 512, 1, 1" in ptx and len(re.findall(r"shfl\.sync\.bfly", ptx)) >= 10
    assert "rsqrt" in ptx and b.read_text("sass") and "SHFL.BFLY" in b.read_text("sass")
    assert b.manifest["capture"]["summary"]["resources"]["registers"] > 0
    other = lower(EXAMPLE, "--knob", "threads=128", cwd=tmp_path, out="r128.bundle")
    assert other.returncode == 0, other.stderr
    assert ".reqntid 128, 1, 1" in load_bundle(tmp_path / "r128.bundle").read_text("ptx")
    lift = mosaic("lift", "r.bundle", "--json", cwd=tmp_path)
    assert lift.returncode == 0, lift.stderr
    assert json.loads(lift.stdout)["dialect"] == "sass"


def test_broken_cute_files_are_one_line(tmp_path):
    text = EXAMPLE.read_text()
    (tmp_path / "imports.py").write_text("import no_such_module_here\n" + text)
    (tmp_path / "wrong.py").write_text(text.replace("acc += v * v", "acc += v * undefined_name"))
    cases = [("imports.py", [], r"importing the kernel file raised ModuleNotFoundError"),
             (str(EXAMPLE), ["--knob", "threads=100"], r"knob class Knobs refused .*a multiple of 32"),
             ("wrong.py", [], r"cute\.compile failed"),
             (str(EXAMPLE), ["--knob", "warps=4"], r"unknown knob\(s\) warps .*known: threads, eps")]
    for name, knobs, pattern in cases:
        p = lower(name, *knobs, cwd=tmp_path, out="bad.bundle", shape="64x256")
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), (name, lines)
        assert re.search(pattern, lines[0]) and "Traceback" not in p.stderr, lines[0]


@pytest.mark.gpu
@pytest.mark.slow
def test_cute_rmsnorm_file_passes_the_oracle_on_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    p = mosaic("capture", "--file", str(EXAMPLE), "--lang", "cute", "--family", "rmsnorm", "--shape", "4096x8192",
               "--dtype", "bf16", "--blocks", "10", "--runs", "20", "-o", "gpu.bundle", cwd=tmp_path, timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    s = load_bundle(tmp_path / "gpu.bundle").manifest["capture"]["summary"]
    assert s["numerics_pass"] and s["deterministic"] and s["time_ns"] > 0
    print(f"cute rmsnorm.py 4096x8192 bf16: {s['time_ns'] / 1e3:.1f} us, noise {s.get('noise_ns')}")
