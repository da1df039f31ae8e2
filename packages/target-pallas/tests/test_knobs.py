import pytest
from mosaic.errors import RecordError
from mosaic_target_pallas.backend import PallasBackend
from mosaic_target_pallas.knobs import AttentionKnobs, GemmKnobs


def test_knob_class_per_family():
    b = PallasBackend()
    assert b.knobs("gemm") is GemmKnobs and b.knobs("attention") is AttentionKnobs


@pytest.mark.parametrize("bad, field", [
    (dict(tile_m=96), "tile_m"),
    (dict(kernel="triton"), "kernel"),
    (dict(epi_tile_n=48), "epi_tile_n"),
    (dict(tile_n=64, epi_tile_n=128), "epi_tile_n"),
    (dict(persistent=False), "persistent"),  # a pipelined-only knob on jax's kernel
    (dict(kernel="pipelined", cluster_dimension="m"), "cluster_dimension"),
    (dict(kernel="pipelined", delay_release=1, max_concurrent_steps=1), "max_concurrent_steps"),
])
def test_bad_knobs_name_the_field(bad, field):
    with pytest.raises(RecordError, match=rf"GemmKnobs\.{field}="):
        GemmKnobs(**bad)


def test_cta_and_cluster_tiles_follow_jax_semantics():
    k = GemmKnobs(tile_m=128, tile_n=128, wg_dimension="n", cluster_dimension="m")
    assert k.cta_tile() == (128, 256) and k.cluster_tile() == (256, 256) and k.cluster_size() == 2
    assert GemmKnobs(kernel="pipelined", tile_m=64, tile_n=128).cta_tile() == (64, 128)


def test_mosaic_gpu_dump_is_collected_with_resources(tmp_path):
    """What lower() picks from a MOSAIC_GPU_DUMP_TO directory (the GPU path), here from planted files."""
    import os

    from mosaic_target_pallas.backend import collect_dump

    (tmp_path / "old_0.ptx").write_text("old")
    os.utime(tmp_path / "old_0.ptx", (1, 1))
    (tmp_path / "mosaic_gpu_module_1.ptx").write_text(".version 8.8")
    (tmp_path / "mosaic_gpu_module_1.sass").write_text("HGMMA.64x128x16.F32.BF16")
    (tmp_path / "mosaic_gpu_module_1.sass_ctrl").write_text("ctrl")
    (tmp_path / "mosaic_gpu_module_1.ptxas").write_text(
        "ptxas info    : Used 168 registers, used 1 barriers\n"
        "    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n")
    ptx, sass, ptxas, res = collect_dump(tmp_path)
    assert ptx.name == "mosaic_gpu_module_1.ptx" and sass.name == "mosaic_gpu_module_1.sass"
    assert ptxas.name == "mosaic_gpu_module_1.ptxas"
    assert (res.registers, res.spill_stores, res.spill_loads) == (168, 8, 4)
