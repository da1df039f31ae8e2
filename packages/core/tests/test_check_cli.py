"""`mosaic check`: exit 0 pass, 1 fail with the reason, 2 bad input; npz loaded without pickle."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mosaic.oracle.formats import FORMATS

BF = FORMATS["bf16"]


def mosaic(*args):
    env = {**os.environ, "MOSAIC_LOAD_PLUGINS": ""}
    env.pop("MOSAIC_DEBUG", None)
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    rng = np.random.default_rng(0)
    a = BF.round(rng.standard_normal((24, 96))).astype(np.float32)
    b = BF.round(rng.standard_normal((96, 16))).astype(np.float32)
    acc = np.zeros((24, 16), np.float32)
    for k in range(96):
        acc = (acc + a[:, k:k + 1] * b[k:k + 1]).astype(np.float32)
    np.savez(d / "in.npz", a=a, b=b)
    np.savez(d / "good.npz", c=BF.round(acc).astype(np.float32))
    np.savez(d / "zeros.npz", c=np.zeros((24, 16), np.float32))
    np.savez(d / "pickled.npz", c=np.array([{"x": 1}], dtype=object))
    (d / "junk.npz").write_bytes(b"not a zip")
    return d


def test_pass(files):
    p = mosaic("check", "--family", "gemm", "--inputs", str(files / "in.npz"), "--output", str(files / "good.npz"),
               "--dtype", "bf16")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("PASS gemm bf16 c (384 elements)")


def test_fail_with_reason_and_json(files):
    args = ["check", "--family", "gemm", "--inputs", str(files / "in.npz"), "--output", str(files / "zeros.npz"),
            "--dtype", "bf16"]
    p = mosaic(*args)
    assert p.returncode == 1 and "outside the guard band" in p.stderr
    j = mosaic(*args, "--json")
    assert j.returncode == 1
    data = json.loads(j.stdout)
    assert data["passed"] is False and data["outputs"][0]["failures"] > 300


@pytest.mark.parametrize("out,dtype,message", [
    ("pickled.npz", "bf16", "without pickle"),
    ("junk.npz", "bf16", "not a readable .npz"),
    ("good.npz", "fp4", "has no oracle format"),
    ("in.npz", "bf16", "output file lacks c"),
])
def test_bad_input_exits_2(files, out, dtype, message):
    p = mosaic("check", "--family", "gemm", "--inputs", str(files / "in.npz"), "--output", str(files / out),
               "--dtype", dtype)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and message in p.stderr
    assert "Traceback" not in p.stderr


def test_missing_file_exits_2(files):
    p = mosaic("check", "--family", "gemm", "--inputs", str(files / "nope.npz"), "--output",
               str(files / "good.npz"), "--dtype", "bf16")
    assert p.returncode == 2 and "Traceback" not in p.stderr
