"""The families' yardsticks: declared data (name, library, formats, the call it times) and a Runnable that
passes the float64 oracle. The torch ones run here on torch's CPU build (the same objects run with
device="cuda" on the GPU); cuDNN and flash-attn-4 exist only on a CUDA device (the ``gpu`` tests below)."""

import numpy as np
import pytest
from mosaic.errors import MosaicError
from mosaic.families import first_yardstick, get, make_inputs, yardstick_names, yardstick_runnable
from mosaic.oracle import check
from mosaic.records import KernelSpec

CASES = [
    ("rmsnorm", {"rows": 8, "cols": 256}, "torch"),
    ("softmax", {"rows": 8, "cols": 200}, "torch"),
    ("attention", {"batch": 2, "seq": 32, "heads": 4, "head_dim": 32}, "torch-sdpa"),
    ("attention", {"batch": 1, "seq": 48, "heads": 8, "head_dim": 32, "kv_heads": 2, "causal": 1}, "torch-sdpa"),
    ("gemm", {"m": 32, "n": 16, "k": 64}, "cublas"),
]


def test_yardsticks_are_declared_by_name_with_their_library():
    gemm = first_yardstick("gemm")
    assert (gemm.name, gemm.call, gemm.title, gemm.library) == ("cublas", "torch.matmul", "cuBLAS", "torch")
    assert {y.name: y.library for y in get("attention").yardsticks} == \
        {"torch-sdpa": "torch", "cudnn": "torch", "flash-attn-4": "flash-attn-4"}
    assert first_yardstick("rmsnorm").call == "torch.nn.functional.rms_norm"
    assert first_yardstick("softmax").call == "torch.softmax"
    assert yardstick_names() == {"cublas", "torch-sdpa", "cudnn", "flash-attn-4", "torch"}
    with pytest.raises(MosaicError, match="unknown family 'conv2d'"):
        first_yardstick("conv2d")


@pytest.mark.parametrize("family, shape, name", CASES)
@pytest.mark.parametrize("values", ["normal", "large", "equal-rows"])
def test_torch_yardsticks_pass_the_oracle_on_the_cpu(family, shape, name, values):
    pytest.importorskip("torch")
    spec = KernelSpec(family, shape, "bf16", name)
    inputs = make_inputs(spec, 5, values)
    r = yardstick_runnable(spec, inputs, device="cpu")
    r.launch()
    r.poison()
    assert all(np.isnan(v).all() for v in r.output().values())  # poison reaches the output it reads
    r.launch()
    out = r.output()
    verdict = check(family, inputs, out, "bf16")
    assert verdict.passed, verdict.reason
    r.close()


def test_a_wrong_mask_through_the_yardstick_fails_the_oracle():
    pytest.importorskip("torch")
    shape = {"batch": 1, "seq": 32, "heads": 4, "head_dim": 16, "causal": 1}
    spec = KernelSpec("attention", shape, "bf16", "torch-sdpa")
    inputs = make_inputs(spec, 0, "normal")
    r = yardstick_runnable(spec, {k: v for k, v in inputs.items() if k != "causal"}, device="cpu")
    r.launch()
    assert not check("attention", inputs, r.output(), "bf16").passed


def test_a_yardstick_the_family_lacks_names_what_it_has():
    spec = KernelSpec("softmax", {"rows": 2, "cols": 8}, "bf16", "cublas")
    with pytest.raises(MosaicError, match=r"covers gemm, not softmax \(whose yardsticks are torch\)"):
        yardstick_runnable(spec, {})


@pytest.fixture
def cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["torch-sdpa", "cudnn", "flash-attn-4"])
@pytest.mark.parametrize("shape", [{"batch": 2, "seq": 1024, "heads": 16, "head_dim": 128},
                                   {"batch": 1, "seq": 2048, "heads": 32, "head_dim": 128, "kv_heads": 8, "causal": 1}])
def test_attention_yardsticks_pass_the_oracle_on_the_gpu(cuda, name, shape):
    if name == "flash-attn-4":
        pytest.importorskip("flash_attn.cute", reason="needs flash-attn-4 (and nvidia-cutlass-dsl)")
    spec = KernelSpec("attention", shape, "bf16", name)
    inputs = make_inputs(spec, 0, "normal")
    r = yardstick_runnable(spec, inputs)
    r.poison()
    r.launch()
    verdict = check("attention", inputs, r.output(), "bf16")
    print(f"{name} {shape}: passed={verdict.passed} worst/band={verdict.outputs[0].max_error_over_band:.3f}")
    assert verdict.passed, verdict.reason
    r.close()


@pytest.mark.gpu
@pytest.mark.parametrize("family, shape", [("rmsnorm", {"rows": 16384, "cols": 8192}),
                                           ("softmax", {"rows": 16384, "cols": 8192})])
def test_torch_yardsticks_pass_the_oracle_on_the_gpu(cuda, family, shape):
    spec = KernelSpec(family, shape, "bf16", "torch")
    for values in ("normal", "large", "denormal"):
        inputs = make_inputs(spec, 0, values)
        r = yardstick_runnable(spec, inputs)
        r.launch()
        verdict = check(family, inputs, r.output(), "bf16")
        print(f"{family} {values}: passed={verdict.passed} worst/band={verdict.outputs[0].max_error_over_band:.3f}")
        assert verdict.passed, verdict.reason
        r.close()
