"""CPU lowering for the cuda platform with the shared-memory budget from the GpuTarget record."""

import pytest
from mosaic.backend import Unbuildable
from mosaic.plugins import host
from mosaic.records import KernelSpec

pytest.importorskip("jax", minversion="0.11.2",
                    reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")


@pytest.fixture(scope="module")
def h200():
    from mosaic.plugins import PluginHost

    return PluginHost(allow="hopper").load().get("gpus", "h200")


def _spec(**knobs):
    return KernelSpec(family="gemm", shape={"m": 4096, "n": 4096, "k": 4096}, dtype="bf16", language="pallas",
                      knobs=knobs, name="g")


def test_lower_writes_mosaic_module_and_records_smem(tmp_path, h200):
    from mosaic_target_pallas.backend import PallasBackend

    low = PallasBackend().lower(_spec(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4), h200, tmp_path)
    text = low.source.read_text()
    assert "mosaic_gpu" in text and "stablehlo.custom_call" in text
    smem = int(next(n for n in low.notes if n.startswith("smem_bytes=")).split("=")[1])
    # 4 stages x (A 256x64 + B 64x128... jax's CTA tile is 128x256 with wg_dimension=n) of bf16 + epilogue
    assert 4 * (128 * 64 + 64 * 256) * 2 < smem <= h200.smem_per_block
    assert low.ptx is None and any("MOSAIC_GPU_DUMP_TO" in n for n in low.notes)


def test_config_over_the_smem_budget_is_unbuildable(tmp_path, h200):
    from mosaic_target_pallas.backend import PallasBackend

    with pytest.raises(Unbuildable, match=r"smem-per-block.*360512.*232448"):
        PallasBackend().lower(_spec(tile_m=128, tile_n=256, tile_k=64, max_concurrent_steps=4), h200, tmp_path)


def test_tiling_that_does_not_divide_is_unbuildable_and_own_kernel_lowers(tmp_path, h200):
    from mosaic_target_pallas.backend import PallasBackend

    spec = KernelSpec(family="gemm", shape={"m": 4096, "n": 4000, "k": 4096}, dtype="bf16", language="pallas",
                      knobs={"tile_n": 128})
    with pytest.raises(Unbuildable, match="n=4000"):
        PallasBackend().lower(spec, h200, tmp_path)
    low = PallasBackend().lower(_spec(kernel="pipelined", tile_m=128, tile_n=128, max_concurrent_steps=3,
                                      persistent=False), h200, tmp_path)
    assert "mosaic_gpu" in low.source.read_text()


def test_prepare_without_a_gpu_is_unbuildable_not_a_crash(tmp_path, h200):
    from mosaic_target_pallas.backend import PallasBackend

    with pytest.raises(Unbuildable, match="CUDA"):
        PallasBackend().prepare(_spec(), h200, tmp_path, {})


def test_registered_language_carries_the_backend():
    lang = host().get("languages", "pallas")
    from mosaic.backend import LanguageBackend

    assert isinstance(lang.backend, LanguageBackend)
