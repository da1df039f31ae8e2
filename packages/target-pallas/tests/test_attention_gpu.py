"""jax's shipped Pallas attention (attention_mgpu) captured through `mosaic capture --family attention` on the GPU
(marked ``gpu``; skipped without jax >= 0.11.2 or without a CUDA device): the family's inputs are in the oracle's
layout (batch, heads, seq, head_dim), the backend hands jax its (batch, seq, heads, head_dim) layout and transposes the
output back, and the float64 oracle must pass — non-causal, causal, and with grouped KV heads."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]


@pytest.fixture
def cuda(monkeypatch):
    pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@pytest.mark.parametrize("extra", ["", ",causal=1", ",kv_heads=2", ",kv_heads=2,causal=1"])
def test_attention_mgpu_passes_the_oracle(extra, tmp_path, cuda):
    shape = "batch=2,seq=1024,heads=4,head_dim=128" + extra
    p = subprocess.run([*MOSAIC, "capture", "--lang", "pallas", "--family", "attention", "--shape", shape,
                        "--dtype", "bf16", "--runs", "5", "--blocks", "2", "--timeout", "600", "--json",
                        "-o", str(tmp_path / "attn.bundle")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    r = json.loads(p.stdout)
    assert r["status"] == "ok", r
    assert r["summary"]["numerics_pass"] is True and r["summary"]["time_ns"] > 0, r["summary"]


def test_causal_knob_contradicting_the_problem_is_refused(tmp_path, cuda):
    p = subprocess.run([*MOSAIC, "capture", "--lang", "pallas", "--family", "attention", "--shape",
                        "batch=1,seq=256,heads=2,head_dim=64", "--dtype", "bf16", "--knob", "causal=true",
                        "--runs", "2", "--blocks", "2", "--json", "-o", str(tmp_path / "a.bundle")],
                       capture_output=True, text=True, timeout=600)
    r = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"status": None, "message": p.stderr}
    assert p.returncode != 0 and "contradicts the problem" in (r.get("message") or "") + p.stderr, (p.stdout, p.stderr)
