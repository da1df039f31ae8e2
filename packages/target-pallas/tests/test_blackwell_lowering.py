"""Pallas for Blackwell (issue 37): a kernel is "lowered" only for the architecture its Mosaic GPU module
targets. jax's Hopper kernels (wgmma) with the B200 record were reported "lowered" from StableHLO and shared
memory alone: now refused by rule PALLAS-ARCH-WGMMA. jax's Blackwell matmul (blackwell_matmul_mgpu, tcgen05)
lowers to StableHLO for sm_100a; its PTX step needs jax's CUDA plugin and a device, so on a CPU-only machine the
lowering stops with that exact reason (never "lowered"); with a GPU it must yield PTX assembled for sm_100a."""

import pytest
from mosaic.backend import Unbuildable
from mosaic.errors import ToolMissing
from mosaic.records import KernelSpec

pytest.importorskip("jax", minversion="0.11.2",
                    reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")


@pytest.fixture(scope="module")
def gpus():
    from mosaic.plugins import PluginHost

    h = PluginHost(allow="hopper,blackwell").load()
    return {"b200": h.get("gpus", "b200"), "h200": h.get("gpus", "h200")}


def _spec(**knobs):
    return KernelSpec(family="gemm", shape={"m": 1024, "n": 1024, "k": 1024}, dtype="bf16", language="pallas",
                      knobs=knobs, name="g")


@pytest.mark.parametrize("kernel", ["jax-hopper", "pipelined"])
def test_hopper_kernel_is_not_lowered_for_b200(tmp_path, gpus, kernel):
    from mosaic_target_pallas.backend import PallasBackend

    with pytest.raises(Unbuildable) as got:
        PallasBackend().lower(_spec(kernel=kernel), gpus["b200"], tmp_path)
    line = got.value.line()
    assert "[PALLAS-ARCH-WGMMA]" in line and "sm_100a" in line and "wgmma" in line and "\n" not in line
    assert not list(tmp_path.glob("*.stablehlo.mlir"))  # nothing written that could pass for a lowering


def test_hopper_kernel_still_lowers_for_h200(tmp_path, gpus):
    from mosaic_target_pallas.backend import PallasBackend

    low = PallasBackend().lower(_spec(), gpus["h200"], tmp_path)
    assert any("target sm_90a" in n for n in low.notes), low.notes


def test_blackwell_matmul_on_b200(tmp_path, gpus):
    from mosaic_target_pallas import arch_rules
    from mosaic_target_pallas.backend import PallasBackend, jax_has_gpu

    spec = _spec(kernel="jax-blackwell", tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4)
    if jax_has_gpu():
        low = PallasBackend().lower(spec, gpus["b200"], tmp_path)
        assert low.ptx is not None and "tcgen05" in low.ptx.read_text()
        return
    with pytest.raises(ToolMissing) as got:
        PallasBackend().lower(spec, gpus["b200"], tmp_path)
    line = got.value.line()
    print("\npallas jax-blackwell on b200:", line)
    assert "cannot lower to PTX for sm_100a here" in line and "CUDA" in line and "sm_100a" in line
    assert arch_rules.ptx_step_missing() in line


def test_blackwell_matmul_is_not_lowered_for_h200(tmp_path, gpus):
    from mosaic_target_pallas.backend import PallasBackend

    with pytest.raises(Unbuildable, match=r"\[PALLAS-ARCH-TCGEN05\].*cannot lower for sm_90a"):
        PallasBackend().lower(_spec(kernel="jax-blackwell"), gpus["h200"], tmp_path)


def test_capture_reports_no_false_lowered(tmp_path):
    """The end-to-end path `mosaic capture --lang pallas --gpu b200 --lower-only` took: status is no longer
    'lowered' for jax's Hopper kernel, and the bundle's message names the rule."""
    from mosaic.capture import CaptureOptions, capture_in_process

    spec = KernelSpec(family="gemm", shape={"m": 1024, "n": 1024, "k": 1024}, dtype="bf16", language="pallas",
                      knobs={}, name="g")
    res = capture_in_process(spec, "b200", tmp_path / "b", CaptureOptions(lower_only=True))
    assert res.status == "unbuildable" and "PALLAS-ARCH-WGMMA" in res.message, (res.status, res.message)


def test_rules_are_data():
    from mosaic_target_pallas import arch_rules as R

    assert R.refusal("wgmma.mma_async.sync.aligned.m64n128k16", "sm_100a", "k").startswith("[PALLAS-ARCH-WGMMA]")
    assert R.refusal("wgmma.mma_async.sync.aligned.m64n128k16", "sm_90a", "k") is None
    assert R.refusal("tcgen05.mma.cta_group::1", "sm_90a", "k").startswith("[PALLAS-ARCH-TCGEN05]")
    assert R.target_arches("tcgen05.alloc.cta_group::1") == ("sm_100a", "sm_103a")
    assert R.target_arches("no tensor core here") == ()
    assert {m.code for m in R.MARKERS} == {"PALLAS-ARCH-WGMMA", "PALLAS-ARCH-TCGEN05"}


def test_a_hopper_gemm_refused_for_b200_names_jaxs_blackwell_matmul(tmp_path, gpus):
    """The refusal of a wgmma GEMM for an sm_100a GPU says which kernel is jax's Blackwell matmul and whether it
    lowers here (the preview's reference line carries it: the Pallas reference on a B200 is jax-blackwell)."""
    from mosaic_target_pallas import arch_rules
    from mosaic_target_pallas.backend import PallasBackend

    with pytest.raises(Unbuildable) as got:
        PallasBackend().lower(_spec(kernel="jax-hopper"), gpus["b200"], tmp_path)
    line = got.value.line()
    assert "[PALLAS-ARCH-WGMMA]" in line and "kernel=jax-blackwell" in line and "\n" not in line
    missing = arch_rules.ptx_step_missing()
    assert (missing in line) if missing else ("it lowers here" in line)
    with pytest.raises(Unbuildable) as h200:  # a tcgen05 kernel refused for Hopper gets no such pointer
        PallasBackend().lower(_spec(kernel="jax-blackwell"), gpus["h200"], tmp_path)
    assert "kernel=jax-blackwell is" not in h200.value.line()
