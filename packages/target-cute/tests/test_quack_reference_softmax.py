"""quack-kernels' CuTe DSL softmax as a kernel file: examples/kernels/cute/quack_softmax.py builds the installed
``quack.softmax.Softmax``; its one caller choice, ``online_softmax``, is the knob. On the CPU it lowers at
16384x8192 bf16 (quack's 128 threads) and the knob reaches the compiled code: the online pass reduces the
packed (max, sum) pair once (one 64-bit shared store, one CTA barrier), the two-pass form reduces twice
(two barriers). On a GPU (marked gpu) both pass the softmax family's float64 oracle."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle

pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl")
pytest.importorskip("quack.softmax", reason="needs quack-kernels (and torch): the .venv has them")

ADAPTER = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "cute" / "quack_softmax.py"
SHAPE = "16384x8192"


def mosaic(*args, cwd, timeout=900):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def capture(online, cwd, lower_only=True):
    out = f"s-{online}.bundle"
    p = mosaic("capture", "--file", str(ADAPTER), "--lang", "cute", "--family", "softmax", "--shape", SHAPE,
               "--dtype", "bf16", "--knob", f"online_softmax={online}", *(["--lower-only"] if lower_only else
                                                                         ["--blocks", "10", "--runs", "20"]),
               "-o", out, "--force", cwd=cwd, timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    return load_bundle(cwd / out)


def test_quack_softmax_lowers_on_the_cpu_and_its_knob_reaches_the_code(tmp_path):
    online, two_pass = capture("true", tmp_path), capture("false", tmp_path)
    for b in (online, two_pass):
        assert b.manifest["capture"]["status"] == "lowered" and b.one("source").read_bytes() == ADAPTER.read_bytes()
        ptx = b.read_text("ptx")
        assert "quacksoftmaxSoftmax" in re.search(r"\.entry\s+(\w+)", ptx).group(1)
        assert ".reqntid 128, 1, 1" in ptx and "ex2.approx" in ptx  # quack's exp2(fastmath)
    a, b = online.read_text("ptx"), two_pass.read_text("ptx")
    assert len(re.findall(r"\bbar\.sync\b", a)) == 1 and len(re.findall(r"\bbar\.sync\b", b)) == 2
    assert "st.shared.b64" in a and "st.shared.b64" not in b
    lift = mosaic("lift", "s-true.bundle", "--json", cwd=tmp_path)
    assert lift.returncode == 0 and '"dialect": "sass"' in lift.stdout, lift.stderr


@pytest.mark.gpu
@pytest.mark.slow
def test_quack_softmax_passes_the_oracle_on_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for online in ("true", "false"):
        s = capture(online, tmp_path, lower_only=False).manifest["capture"]["summary"]
        assert s["numerics_pass"] and s["time_ns"] > 0
        print(f"quack softmax {SHAPE} bf16 online_softmax={online}: {s['time_ns'] / 1e3:.1f} us, "
              f"noise {s.get('noise_ns')}")
