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


@pytest.fixture
def cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")


def _passed(r: dict) -> dict:
    assert not BENCH.problems(r, exact=BENCH.SMALL["m"] * BENCH.SMALL["n"]), (r.get("summary"), r.get("tail"))
    return r["summary"]


@pytest.mark.parametrize("name", list(BENCH.CONFIGS))
def test_cutlass_configuration_captures_exact(name, tmp_path, cuda, monkeypatch):
    from mosaic.bundle import verify_bundle
    from mosaic.capture import CaptureOptions, capture

    inc = Path(os.environ.get("MOSAIC_CUTLASS_INCLUDE", "/tmp/site/cutlass_library/source/include"))
    if not (inc / "cutlass" / "cutlass.h").is_file():
        pytest.skip(f"needs the CUTLASS headers ($MOSAIC_CUTLASS_INCLUDE, {inc})")
    monkeypatch.setenv("MOSAIC_CUTLASS_INCLUDE", str(inc))
    dest = tmp_path / f"{name}.bundle"
    r = capture(BENCH.spec("cutlass", BENCH.SMALL, BENCH.CONFIGS[name], name), "h200", dest,
                CaptureOptions(timeout=540, values="int", runs=10, blocks=3)).to_json()
    s = _passed(r)
    assert s["launch"]["grid"] and s["resources"]["registers"] > 0
    assert verify_bundle(dest) == []


def test_cublas_captures_exact(tmp_path, cuda):
    from mosaic.capture import CaptureOptions, capture_in_process
    from mosaic.families.gemm import runnable_factory

    r = capture_in_process(BENCH.spec("cublas", BENCH.SMALL, name="torch.matmul"), "h200", tmp_path / "c.bundle",
                           CaptureOptions(values="int", runs=10, blocks=3), runnable_factory=runnable_factory)
    _passed(r.to_json())
