from mosaic.testing import GpuPluginTests
from mosaic_gpu_blackwell import B200, RTX_5090


class TestBlackwellPlugin(GpuPluginTests):
    plugin = "blackwell"
    gpus = {"b200", "rtx5090"}


def test_blackwell_figures():
    assert (B200.arch, RTX_5090.arch) == ("sm_100a", "sm_120a")
    assert B200.sm_count == 148 and RTX_5090.sm_count == 170
    assert RTX_5090.smem_per_block == 101376 < B200.smem_per_block
    assert RTX_5090.max_threads_per_sm == 1536
