"""Pallas captures on the GPU (marked ``gpu``; skipped without jax >= 0.11.2, or without torch on a CUDA device): the
acceptance checks of benchmarks/gemm_capture.py --part pallas at test scale. jax's Hopper matmul (128x128x64, 4
steps) and the project's own pipelined kernel, bf16 GEMM 4096^3, capture ok through core's capture
(gemm_capture.problems: the float64 oracle passes with zero failures, a device time); the bundle verifies and holds
the machine code."""

import importlib

import pytest

pytestmark = pytest.mark.gpu
BENCH = importlib.import_module("gemm_capture")  # benchmarks/ is on pytest's pythonpath


@pytest.fixture
def cuda():
    pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")


@pytest.mark.parametrize("name", ["pallas-jax-128x128x64-s4", "pallas-own-128x128x64-s4"])
def test_configuration_captures_and_passes_the_oracle(name, tmp_path, cuda, monkeypatch):
    from mosaic.capture import CaptureOptions

    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # jax must not take 75% of the GPU
    r, problems = BENCH.capture_checked("pallas", name, BENCH.PALLAS[name], BENCH.BIG, tmp_path / f"{name}.bundle",
                                        CaptureOptions(timeout=300, runs=5, blocks=2), files=("kernel.ptx", "kernel.sass"))
    assert not problems, (problems, r.get("summary"), r.get("tail"))
