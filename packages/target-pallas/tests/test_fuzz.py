"""`mosaic fuzz` on the CPU (jax's GPU interpreter through the gate's child): a kernel that hard-codes its grid
fails, the failure is shrunk to the smallest row count that still fails (16: its grid covers 8 rows) and written
as a verifiable bundle; the honest control survives a batch of random cases."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312")
EXPLOITS = Path(__file__).resolve().parents[1] / "src" / "mosaic_target_pallas" / "exploits"


def mosaic(*args):
    env = {k: v for k, v in os.environ.items() if k != "MOSAIC_DEBUG"}
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=900)


def test_fuzz_finds_shrinks_and_writes_the_hard_coded_grid(tmp_path):
    r = mosaic("fuzz", str(EXPLOITS / "hard_coded_shape.py"), "--lang", "pallas", "--family", "softmax",
               "--minutes", "5", "--seed", "7", "--out", str(tmp_path), "--json")
    assert r.returncode == 1, r.stderr[-2000:]
    res = json.loads(r.stdout)
    small = res["smallest"]
    assert small["finding"]["stage"] == "oracle" and small["case"]["shape"]["rows"] == 16, small
    assert small["case"]["shape"]["cols"] == 64  # the file's granule: nothing smaller is drawn
    from mosaic.bundle import load_bundle

    b = load_bundle(res["bundle"])  # verified on load
    rec = json.loads(b.read_bytes("fuzz.json"))
    assert rec["reproduced"] is True and sorted(b.arrays("inputs")) == ["x"]
    v = mosaic("fuzz", res["bundle"], "--minutes", "5", "--json", "--out", str(tmp_path / "again"))  # a bundle of a kernel file fuzzes again
    assert v.returncode == 1 and json.loads(v.stdout)["smallest"] is not None


def test_fuzz_honest_kernel_passes_and_bad_target_is_one_line(tmp_path):
    from mosaic.fuzz import fuzz
    from mosaic.kernel_files import read_kernel_file

    r = fuzz(read_kernel_file(EXPLOITS / "honest_softmax.py"), "pallas", "softmax", ["bf16", "f16"], minutes=5,
             out=tmp_path, seed=3, max_cases=16)
    assert r.smallest is None and r.cases >= 16 and not r.unavailable
    bad = mosaic("fuzz", str(tmp_path / "nothing.py"), "--lang", "pallas", "--family", "softmax")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
