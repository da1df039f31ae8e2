"""The families' yardsticks: declared data (name, library, formats, the call it times) and a Runnable that
passes the float64 oracle. The torch ones run here on torch's CPU build (the same objects run with
device="cuda" on the GPU); cuDNN and flash-attn-4 exist only on a CUDA device (the ``gpu`` tests below)."""

import numpy as np
import pytest
from mosaic.errors import MosaicError
from mosaic.families import (
    YardstickUnavailable,
    first_yardstick,
    flops,
    get,
    make_inputs,
    run_yardstick,
    yardstick_names,
    yardstick_problem,
    yardstick_runnable,
)
from mosaic.oracle import check
from mosaic.records import KernelSpec, Yardstick

CASES = [
    ("rmsnorm", {"rows": 8, "cols": 256}, "torch"),
    ("softmax", {"rows": 8, "cols": 200}, "torch"),
    ("attention", {"batch": 2, "seq": 32, "heads": 4, "head_dim": 32}, "torch-sdpa"),
    ("attention", {"batch": 1, "seq": 48, "heads": 8, "head_dim": 32, "kv_heads": 2, "causal": 1}, "torch-sdpa"),
    ("attention", {"batch": 1, "seq": 48, "heads": 8, "head_dim": 32, "kv_heads": 2, "causal": 1}, "sdpa-flash"),
    ("gemm", {"m": 32, "n": 16, "k": 64}, "cublas"),
]


def test_yardsticks_are_declared_by_name_with_their_library():
    gemm = first_yardstick("gemm")
    assert (gemm.name, gemm.call, gemm.title, gemm.library) == ("cublas", "torch.matmul", "cuBLAS", "torch")
    assert {y.name: y.library for y in get("attention").yardsticks} == \
        {"torch-sdpa": "torch", "sdpa-flash": "torch", "cudnn": "torch", "flash-attn-4": "flash-attn-4"}
    assert first_yardstick("attention").name == "torch-sdpa"  # the campaign's primary yardstick stays torch's pick
    assert first_yardstick("rmsnorm").call == "torch.nn.functional.rms_norm"
    assert first_yardstick("softmax").call == "torch.softmax"
    assert yardstick_names() == {"cublas", "torch-sdpa", "sdpa-flash", "cudnn", "flash-attn-4", "torch"}
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


def test_sdpa_flash_is_pinned_to_the_flash_backend():
    """On torch's CPU build SDPA has a flash implementation and no cuDNN one: the pinned flash yardstick runs
    torch's flash op, and the cuDNN pin finds no backend (the pins are enforced, not advice)."""
    pytest.importorskip("torch")
    from torch.profiler import profile

    shape = {"batch": 2, "seq": 32, "heads": 4, "head_dim": 32}
    inputs = make_inputs(KernelSpec("attention", shape, "bf16", "sdpa-flash"), 0, "normal")
    r = yardstick_runnable(KernelSpec("attention", shape, "bf16", "sdpa-flash"), inputs, device="cpu")
    with profile() as prof:
        r.launch()
    ops = {e.name for e in prof.events()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops, sorted(o for o in ops if "attention" in o)
    cudnn = yardstick_runnable(KernelSpec("attention", shape, "bf16", "cudnn"), inputs, device="cpu")
    with pytest.raises(RuntimeError, match="No viable backend"):
        cudnn.launch()


def _needs_a_missing_library(inputs, dtype, device="cuda"):
    import mosaic_no_such_yardstick_library  # noqa: F401 - the import a missing library fails

    raise AssertionError("unreachable")


def test_a_yardstick_whose_library_does_not_import_is_one_unavailable_line():
    yard = Yardstick("absent-lib", "a library nobody installed", "absent-lib-dist", ("bf16",), _needs_a_missing_library)
    with pytest.raises(YardstickUnavailable) as err:
        run_yardstick(yard, {}, "bf16")
    assert err.value.code == "unavailable"
    assert err.value.line() == ("the absent-lib yardstick needs absent-lib-dist, which does not import here "
                                "(ModuleNotFoundError: No module named 'mosaic_no_such_yardstick_library') (yardstick)")


def test_a_capture_records_the_unavailable_yardstick_by_its_code(tmp_path):
    """What the live workbench reads to say why a yardstick has no figure: the capture's summary carries the
    error's code beside its line (no string matching on the message)."""
    from mosaic.capture import CaptureOptions, capture_in_process

    yard = Yardstick("absent-lib", "a library nobody installed", "absent-lib-dist", ("bf16",), _needs_a_missing_library)
    spec = KernelSpec("attention", {"batch": 1, "seq": 8, "heads": 1, "head_dim": 8}, "bf16", "torch-sdpa")
    r = capture_in_process(spec, "h200", tmp_path / "y.bundle", CaptureOptions(),
                           runnable_factory=lambda s, g, inputs: run_yardstick(yard, inputs, "bf16"))
    assert r.status == "failed" and r.summary["error_code"] == "unavailable"
    assert r.summary["error"].startswith("the absent-lib yardstick needs absent-lib-dist, which does not import")


def test_a_format_a_yardstick_does_not_take_is_named_before_it_runs():
    fa4 = get("attention").yardstick("flash-attn-4")
    assert yardstick_problem(fa4, "f32") == "the flash-attn-4 yardstick takes bf16, f16, not f32"
    assert yardstick_problem(fa4, "bf16") is None
    assert yardstick_problem(get("attention").yardstick("torch-sdpa"), "f32") is None


def test_flops_is_the_familys_work():
    assert flops("gemm", {"m": 4096, "n": 2048, "k": 1024}, "bf16") == 2.0 * 4096 * 2048 * 1024
    causal = {"batch": 1, "seq": 4, "heads": 2, "head_dim": 8, "causal": 1}
    assert flops("attention", causal, "bf16") == 4.0 * 1 * 2 * (4 * 5 / 2) * 8
    assert flops("conv2d", {"n": 1}, "bf16") is None


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
@pytest.mark.parametrize("name", ["torch-sdpa", "sdpa-flash", "cudnn", "flash-attn-4"])
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
