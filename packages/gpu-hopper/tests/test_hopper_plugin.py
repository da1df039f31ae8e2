from mosaic.testing import GpuPluginTests
from mosaic_gpu_hopper import H100_PCIE, H100_SXM, H200


class TestHopperPlugin(GpuPluginTests):
    plugin = "hopper"
    gpus = {"h100-sxm", "h100-pcie", "h200"}


def test_hopper_figures():
    assert H200.sm_count == 132 and H100_PCIE.sm_count == 114 and H100_SXM.sm_count == 132
    assert H200.smem_per_block == 232448 and H200.smem_per_sm == 233472
    assert H200.hbm_bandwidth_gbs > H100_SXM.hbm_bandwidth_gbs > H100_PCIE.hbm_bandwidth_gbs
    assert {t.arch for t in (H100_SXM, H100_PCIE, H200)} == {"sm_90a"}
    assert H200.l2_bytes == 62914560 and H100_SXM.l2_bytes == 52428800  # read on the devices


def test_detection_tells_h100_variants_apart():
    assert H100_SXM.matches("NVIDIA H100 80GB HBM3", (9, 0), 132)
    assert not H100_PCIE.matches("NVIDIA H100 80GB HBM3", (9, 0), 132)
    assert H100_PCIE.matches("NVIDIA H100 PCIe", (9, 0), 114)
    assert H200.matches("NVIDIA H200", (9, 0), 132)
    assert not H200.matches("NVIDIA H200", (10, 0), 132)
