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


@pytest.mark.parametrize("kernel", ["jax-hopper", "pipelined"])
def test_gemm_runs_in_the_poisoned_output_buffer(kernel, tmp_path, cuda, monkeypatch):
    """The kernel writes into the buffer the capture filled with NaN (``output_buffer.py``): the result lies at its
    address and passes the oracle."""
    from mosaic import families, oracle
    from mosaic.plugins import PluginHost
    from mosaic.records import KernelSpec
    from mosaic_target_pallas.backend import PallasBackend

    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    gpu = PluginHost(allow="hopper").load().get("gpus", "h200")
    spec = KernelSpec(family="gemm", shape={"m": 1024, "n": 1024, "k": 1024}, dtype="bf16", language="pallas",
                      knobs={"kernel": kernel})
    inputs = families.make_inputs(spec, 0, "normal")
    r = PallasBackend().prepare(spec, gpu, tmp_path, inputs)
    try:
        r.poison()
        r.launch()
        out = r.output()
        assert r.poison_effective is True, "the output buffer was not the poisoned one"
    finally:
        r.close()
    verdict = oracle.check("gemm", inputs, out, "bf16")
    assert verdict.passed, verdict.reason
