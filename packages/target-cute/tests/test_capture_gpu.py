"""CuTe DSL captures on the GPU (marked ``gpu``; skipped without CuTe DSL, or without torch on a CUDA device): the
acceptance checks of benchmarks/gemm_capture.py --part cute at test scale. The naive CuTe DSL gemm and the two
tuned configurations of the re-check (128x128 s4; 128x256 s4 persistent 2x1 cluster), bf16 GEMM 4096^3, capture ok
through core's capture (gemm_capture.problems: the float64 oracle passes with zero failures, a device time); the
bundle verifies and holds the machine code."""

import importlib

import pytest

pytestmark = pytest.mark.gpu
BENCH = importlib.import_module("gemm_capture")  # benchmarks/ is on pytest's pythonpath


@pytest.fixture
def cuda():
    pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl (Python >= 3.12)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")


@pytest.mark.parametrize("name", ["cute-naive", "cute-128x128-s4", "cute-128x256-s4-persistent-c2x1-sw8"])
def test_configuration_captures_and_passes_the_oracle(name, tmp_path, cuda, monkeypatch):
    from mosaic.capture import CaptureOptions

    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # jax must not take 75% of the GPU
    r, problems = BENCH.capture_checked("cute", name, BENCH.CUTE[name], BENCH.BIG, tmp_path / f"{name}.bundle",
                                        CaptureOptions(timeout=300, runs=5, blocks=2), files=("kernel.ptx", "kernel.cubin", "kernel.sass"))
    assert not problems, (problems, r.get("summary"), r.get("tail"))
