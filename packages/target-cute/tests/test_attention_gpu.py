"""The project's CuTe DSL attention on the GPU (marked ``gpu``; skipped without CuTe DSL or without torch on a CUDA
device): each configuration captured through `mosaic capture --family attention` must pass the float64 oracle and
be timed. The configurations are those of the first GPU run (results/2026-12-07/session20/check_a.sh, all passed on
an H100): the naive kernel, the hopper default in f16 and bf16, causal, causal GQA, a seq that is no multiple of
the key block (with and without causal), P staged through shared memory with 64-key blocks and 3 stages,
ping-pong, persistent, head_dim 64 with one consumer warpgroup, causal without block skipping.

    python3 -m pytest -q -s -m gpu packages/target-cute/tests/test_attention_gpu.py
"""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
D128 = "batch=1,seq=512,heads=2,head_dim=128"
CONFIGS = {
    "naive": ("batch=1,seq=256,heads=2,head_dim=128", ("kernel=naive",), "f16"),
    "default": (D128, (), "f16"),
    "default-bf16": (D128, (), "bf16"),
    "causal": (D128 + ",causal=1", (), "f16"),
    "gqa-causal": ("batch=2,seq=384,heads=4,head_dim=128,kv_heads=2,causal=1", (), "f16"),
    "tail300": ("batch=1,seq=300,heads=2,head_dim=128", (), "f16"),
    "causal-tail300": ("batch=1,seq=300,heads=2,head_dim=128,causal=1", (), "f16"),
    "psmem-n64-s3": (D128 + ",causal=1", ("p_in=smem", "block_n=64", "stages=3"), "f16"),
    "pingpong": (D128, ("pingpong=true",), "f16"),
    "persistent": ("batch=2,seq=512,heads=4,head_dim=128,causal=1", ("persistent=true",), "f16"),
    "d64-1wg": ("batch=1,seq=512,heads=2,head_dim=64,kv_heads=1", ("consumer_warpgroups=1", "block_m=128",
                                                                   "block_n=64"), "f16"),
    "noskip-causal": (D128 + ",causal=1", ("causal_skip=false",), "f16"),
}


@pytest.fixture(autouse=True)
def cuda(monkeypatch):
    pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl (Python >= 3.12)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_configuration_passes_the_oracle_and_is_timed(name, tmp_path):
    shape, knobs, dtype = CONFIGS[name]
    args = [a for k in knobs for a in ("--knob", k)]
    p = subprocess.run([*MOSAIC, "capture", "--lang", "cute", "--family", "attention", "--shape", shape, "--dtype",
                        dtype, *args, "--runs", "5", "--blocks", "2", "--timeout", "300", "--json",
                        "-o", str(tmp_path / f"{name}.bundle")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    r = json.loads(p.stdout)
    s = r["summary"]
    assert r["status"] == "ok" and s["numerics_pass"] is True, r
    assert s["oracle"]["o"]["failures"] == 0 and s["time_ns"] > 0, s
    print(f"\n{name}: {s['time_ns'] / 1e3:.2f} us, error/band {s['oracle']['o']['max_error_over_band']:.3f}")
