"""The CPU-testable part of benchmarks/gemm_capture.py: --lower-only lowers every Pallas and CuTe
configuration through core's capture (child processes), records the unbuildable one, and writes the JSON
summary and the bundle tarball that the H200 run also writes."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("jax", minversion="0.11.2",
                    reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")
pytest.importorskip("cutlass.cute",
                    reason="needs nvidia-cutlass-dsl (Python >= 3.12): run in .venv312 (make test does)")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gemm_capture.py"


@pytest.mark.slow
def test_lower_only_on_cpu(tmp_path):
    env = {**os.environ, "GEMM_CAPTURE_WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--lower-only"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "gemm_capture-all-lowered.json").read_text())
    statuses = {name: c["status"] for name, c in summary["captures"].items()}
    assert statuses.pop("pallas-jax-128x256x64-s4") == "unbuildable"
    assert set(statuses.values()) == {"lowered"}, statuses
    assert len(statuses) == 10
    regs = summary["captures"]["cute-128x128-s4"]["summary"]["resources"]["registers"]
    assert 0 < regs <= 255
    with tarfile.open(tmp_path / "out" / "gemm_capture-all-lowered.tar.gz") as tar:
        names = tar.getnames()
    def stored(n):  # a member is stored plain or, when xz shrinks it, as NAME.xz
        return n in names or f"{n}.xz" in names

    assert stored("cute-128x128-s4.bundle/kernel.ptx") and stored("cute-naive.bundle/kernel.cubin")
    assert any(n.startswith("pallas-jax-128x128x64-s4.bundle/source/") for n in names)


def test_quick_recheck_lowers_its_subset(tmp_path):
    env = {**os.environ, "GEMM_CAPTURE_WORK": str(tmp_path / "work")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--part", "all", "--quick", "--lower-only",
                           "--json", str(tmp_path / "out" / "quick.json")], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "quick.json").read_text())
    assert {n: c["status"] for n, c in summary["captures"].items()} == {
        "pallas-jax-128x128x64-s4": "lowered", "cute-128x128-s4": "lowered",
        "cute-128x256-s4-persistent-c2x1-sw8": "lowered"}
    assert summary["quick"] is True
