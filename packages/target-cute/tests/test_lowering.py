"""CuTe DSL ahead-of-time lowering for sm_90a on the CPU, checked against the H200 record."""

import re

import pytest
from mosaic.backend import Unbuildable
from mosaic.plugins import PluginHost
from mosaic.records import KernelSpec
from mosaic.toolchain.tools import find_tool
from mosaic_target_cute.backend import CuteBackend

pytest.importorskip("cutlass.cute",
                    reason="needs nvidia-cutlass-dsl (Python >= 3.12): run in .venv312 (make test does)")


@pytest.fixture(scope="module")
def h200():
    return PluginHost(allow="hopper").load().get("gpus", "h200")


def _spec(**knobs):
    return KernelSpec(family="gemm", shape={"m": 4096, "n": 4096, "k": 4096}, dtype="bf16", language="cute",
                      knobs=knobs, name="g")


def _ops(text: str, pattern: str) -> int:
    return len(re.findall(pattern, text))


def test_tuned_gemm_lowers_with_tma_wgmma_pipeline_and_multicast(tmp_path, h200):
    low = CuteBackend().lower(_spec(tile_mn=[128, 256], stages=4, persistent=True, cluster_mn=[2, 1],
                                    swizzle=8, raster="n", epi_tile=[64, 64]), h200, tmp_path)
    ptx = low.ptx.read_text()
    assert ".target sm_90a" in ptx
    assert _ops(ptx, r"wgmma\.mma_async") > 0
    assert _ops(ptx, r"cp\.async\.bulk\.tensor") > 0 and "multicast::cluster" in ptx
    assert _ops(ptx, r"setmaxnreg\.(inc|dec)") == 2
    assert _ops(ptx, r"mbarrier\.try_wait") > 0
    assert 0 < low.resources.registers <= h200.max_regs_per_thread
    dyn = int(next(n for n in low.notes if n.startswith("dynamic_smem=")).split("=")[1])
    # A+B slots, 2 epilogue slots per consumer warpgroup (64-row sub-tiles: one group each), barriers
    assert dyn == 4 * (128 * 64 + 256 * 64) * 2 + 2 * 2 * 64 * 64 * 2 + 1024
    assert "grid_ctas=132" in low.notes and "cluster=(2, 1, 1)" in low.notes
    if find_tool("nvdisasm"):
        sass = low.sass.read_text()
        for op in ("HGMMA", "UTMALDG", "UTMASTG", "USETMAXREG", "SYNCS.PHASECHK", "STSM"):
            assert op in sass, op
    if find_tool("ptxas"):
        assert f"Used {low.resources.registers} registers" in low.ptxas_log.read_text()


def test_naive_gemm_has_no_tma_no_wgmma_no_smem(tmp_path, h200):
    low = CuteBackend().lower(_spec(kernel="naive"), h200, tmp_path)
    ptx = low.ptx.read_text()
    assert _ops(ptx, r"ld\.global") >= 2 and _ops(ptx, r"fma\.rn\.f32") >= 1
    for absent in ("wgmma", "cp.async", "mbarrier", ".shared"):
        assert absent not in ptx, absent
    assert low.resources.static_smem == 0


def test_config_over_budget_is_unbuildable_with_the_figures(tmp_path, h200):
    # 6 x (A 16 KiB + B 32 KiB) + 2 epilogue slots x 2 warpgroups x 4 KiB + 1 KiB barriers = 312320 B
    with pytest.raises(Unbuildable, match=r"\[smem-per-block\].*312320"):
        CuteBackend().lower(_spec(tile_mn=[128, 256], stages=6), h200, tmp_path)


def test_shape_the_tiles_do_not_divide_is_unbuildable(tmp_path, h200):
    spec = KernelSpec(family="gemm", shape={"m": 4096, "n": 4000, "k": 4096}, dtype="bf16", language="cute",
                      knobs={"tile_mn": [128, 128]})
    with pytest.raises(Unbuildable, match="n=4000"):
        CuteBackend().lower(spec, h200, tmp_path)


def test_sweep_records_built_and_unbuildable(h200):
    from mosaic_target_cute.knobs import GemmKnobs
    from mosaic_target_cute.sweep import sweep

    rows = sweep([GemmKnobs(), GemmKnobs(tile_mn=(128, 256), stages=6)], h200, m=1024, n=1024, k=512)
    assert [r["status"] for r in rows] == ["built", "unbuildable"]
    assert rows[0]["grid_ctas"] == 64 and rows[0]["threads"] == 384
    assert "smem-per-block" in rows[1]["problems"][0]


@pytest.mark.parametrize("knobs", [dict(tile_mn=(128, 128)),  # 64-row sub-tiles: one per consumer warpgroup
                                   dict(tile_mn=(128, 128), epi_tile=(128, 32))])  # one sub-tile over both
def test_epilogue_stores_every_accumulator_where_it_belongs(knobs):
    from mosaic_target_cute.epilogue import epilogue_map
    from mosaic_target_cute.knobs import GemmKnobs

    m = epilogue_map(GemmKnobs(**knobs))
    assert m.ok, m.problems
    assert m.threads == 256 and m.values == 128 * 128  # every accumulator of the 128x128 tile checked


def test_epilogue_map_catches_the_h200_illegal_address_bug():
    """Before the fix: a 64-row sub-tile under the copy of both warpgroups (128 rows), one group."""
    from mosaic_target_cute.epilogue import epilogue_map
    from mosaic_target_cute.knobs import GemmKnobs

    m = epilogue_map(GemmKnobs(tile_mn=(128, 128), epi_tile=(64, 32)), groups=1, limit=2)
    assert not m.ok and "reads 8 x 16 values, the thread holds 64" in m.problems[0]
