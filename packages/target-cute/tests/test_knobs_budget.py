from pathlib import Path

import pytest
from mosaic.backend import Unbuildable
from mosaic.errors import RecordError
from mosaic.plugins import PluginHost
from mosaic_target_cute import budget
from mosaic_target_cute.knobs import GemmKnobs
from mosaic_target_cute.lowering import CuteBuild


@pytest.fixture(scope="module")
def h200():
    return PluginHost(allow="hopper").load().get("gpus", "h200")


@pytest.mark.parametrize("bad, field", [
    (dict(tile_mn=(96, 128)), "tile_mn"),
    (dict(cluster_mn=(4, 1)), "cluster_mn"),
    (dict(stages=1), "stages"),
    (dict(epi_tile=(64, 48)), "epi_tile"),
    (dict(tile_mn=(64, 64), epi_tile=(128, 32)), "epi_tile"),
    (dict(tile_mn=(128, 128), epi_tile=(32, 32)), "epi_tile"),  # neither 64 rows nor the tile's 128
    (dict(raster="n"), "raster"),  # raster order without swizzle does nothing
    (dict(kernel="naive", stages=6), "stages"),
    (dict(block_mn=(8, 8)), "block_mn"),
])
def test_bad_knobs_name_the_field(bad, field):
    with pytest.raises(RecordError, match=rf"GemmKnobs\.{field}="):
        GemmKnobs(**bad)


def test_knobs_accept_lists_from_json():
    k = GemmKnobs(tile_mn=[128, 256], cluster_mn=[2, 1], swizzle=4, raster="n")
    assert k.tile_mn == (128, 256) and k.consumer_warpgroups == 2 and k.threads == 384


def _build(**kw):
    base = dict(kernel_name="k", ptx=Path("x"), cubin=Path("y"), registers=168, static_smem=1024,
                dynamic_smem=140288, threads=384, cluster=(1, 1, 1), grid_ctas=132, compile_seconds=0.1)
    return CuteBuild(**{**base, **kw})


def test_budget_rules(h200):
    assert budget.diagnose(_build(), h200) == []
    codes = {d.code for d in budget.diagnose(
        _build(dynamic_smem=300_000, registers=256, threads=1024, cluster=(4, 4, 2)), h200)}
    assert codes == {"smem-per-block", "regs-per-thread", "regs-per-block", "cluster-size"}
    # 168 registers x 384 threads fit; 168 x 512 (4 warpgroups) do not fit 64K registers
    assert [d.code for d in budget.diagnose(_build(threads=512), h200)] == ["regs-per-block"]
    with pytest.raises(Unbuildable, match=r"\[smem-per-block\]"):
        budget.check(_build(dynamic_smem=232448), h200)
