from mosaic.gpus import detect
from mosaic.records import GpuTarget

H = dict(display_name="X", arch="sm_90a", compute_capability=(9, 0), smem_per_sm=10, smem_per_block=10,
         regs_per_sm=10, l2_bytes=10, hbm_bandwidth_gbs=1.0, memory_bytes=10, peak_bf16_tflops=1.0,
         peak_fp8_tflops=1.0, max_cluster_size=1)
H200 = GpuTarget(name="h200", sm_count=132, device_names=("H200",), **H)
PCIE = GpuTarget(name="h100-pcie", sm_count=114, device_names=("H100 PCIe",), **H)


def test_detect_matches_name_cc_and_sm_count():
    d = detect([PCIE, H200], probe=lambda: ([("NVIDIA H200", (9, 0), 132), ("NVIDIA H100 PCIe", (9, 0), 114)], ""))
    assert [x.target.name for x in d.devices] == ["h200", "h100-pcie"]
    assert d.devices[0].to_json() == {"index": 0, "name": "NVIDIA H200", "compute_capability": [9, 0],
                                      "sm_count": 132, "target": "h200"}


def test_detect_says_when_nothing_matches():
    # a MIG slice or a cut-down part: same name, fewer SMs -> no record, never a wrong one
    d = detect([H200], probe=lambda: ([("NVIDIA H200", (9, 0), 60)], ""))
    assert d.devices[0].target is None
    none = detect([H200], probe=lambda: ([], "no CUDA device visible"))
    assert none.devices == () and none.reason == "no CUDA device visible"


def test_real_probe_reports_a_reason_without_a_gpu():
    from mosaic.gpus import probe_devices

    devices, reason = probe_devices()
    assert devices or reason  # either a device answered, or we are told why not
