"""The cuBLAS yardstick's Runnable contract, exercised on the CPU through torch (the GPU path is the same
object with device="cuda"; it ran on the H200 in benchmarks/gemm_capture.py and timing_aa.py)."""

import numpy as np
import pytest
from mosaic.errors import MosaicError
from mosaic.families import make_inputs
from mosaic.families.gemm import TorchMatmul
from mosaic.oracle import check
from mosaic.records import KernelSpec


def test_torch_runnable_contract_on_cpu():
    pytest.importorskip("torch")
    s = KernelSpec(family="gemm", shape={"m": 32, "n": 16, "k": 64}, dtype="bf16", language="cublas")
    inputs = make_inputs(s, 0, "int")
    r = TorchMatmul(inputs, "bf16", device="cpu")
    r.poison()
    assert np.isnan(r.output()["c"]).all()
    r.launch()
    v = check("gemm", inputs, r.output(), "bf16")
    assert v.passed and v.outputs[0].exact_checked == 32 * 16


def test_only_half_precision_inputs():
    with pytest.raises(MosaicError, match="bf16/f16, not f32"):
        TorchMatmul({}, "f32", device="cpu")
