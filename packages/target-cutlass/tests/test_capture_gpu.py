"""CUTLASS and cuBLAS captures on the GPU (marked ``gpu``; skipped without torch on a CUDA device and the CUTLASS
headers): the acceptance checks of benchmarks/gemm_capture.py --part cutlass at test scale. Every configuration of
the benchmark, bf16 GEMM 512x384x256 with integer inputs, captures ok through core's capture with the float64 oracle
checking every output element exactly (zero failures) and a device time; cuBLAS (torch.matmul) the same in process."""

import importlib
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
BENCH = importlib.import_module("gemm_capture")  # benchmarks/ is on pytest's pythonpath
EXACT = BENCH.SMALL["m"] * BENCH.SMALL["n"]  # integer inputs: every output checked exactly


@pytest.fixture
def cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")


@pytest.mark.parametrize("name", list(BENCH.CONFIGS))
def test_cutlass_configuration_captures_exact(name, tmp_path, cuda, monkeypatch):
    from mosaic.capture import CaptureOptions

    inc = Path(os.environ.get("MOSAIC_CUTLASS_INCLUDE", "/tmp/site/cutlass_library/source/include"))
    if not (inc / "cutlass" / "cutlass.h").is_file():
        pytest.skip(f"needs the CUTLASS headers ($MOSAIC_CUTLASS_INCLUDE, {inc})")
    monkeypatch.setenv("MOSAIC_CUTLASS_INCLUDE", str(inc))
    r, problems = BENCH.capture_checked("cutlass", name, BENCH.CONFIGS[name], BENCH.SMALL, tmp_path / f"{name}.bundle",
                                        CaptureOptions(timeout=540, values="int", runs=10, blocks=3), exact=EXACT,
                                        files=("kernel.cubin", "kernel.sass"))
    assert not problems, (problems, r.get("summary"), r.get("tail"))
    s = r["summary"]
    assert s["launch"]["grid"] and s["resources"]["registers"] > 0


def test_cublas_captures_exact(tmp_path, cuda):
    from mosaic.capture import CaptureOptions, capture_in_process
    from mosaic.families.gemm import runnable_factory

    r = capture_in_process(BENCH.spec("cublas", BENCH.SMALL, name="torch.matmul"), "h200", tmp_path / "c.bundle",
                           CaptureOptions(values="int", runs=10, blocks=3), runnable_factory=runnable_factory).to_json()
    assert not BENCH.problems(r, exact=EXACT), (r.get("summary"), r.get("tail"))
