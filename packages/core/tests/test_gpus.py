import pytest
from mosaic.errors import BadInput
from mosaic.gpus import DEFAULT_GPU, detect, resolve_gpu
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


# -- resolve_gpu: the --gpu option of run, capture and the amk commands ------------------------------------------------

H100_SXM_DEVICE = ("NVIDIA H100 80GB HBM3", (9, 0), 132)
H200_DEVICE = ("NVIDIA H200", (9, 0), 132)


def _records():
    """The installed records (mosaic-gpu-hopper), whose device names the driver's names must match."""
    from mosaic.plugins import host

    targets = host().items("gpus")
    if not {"h100-sxm", "h200"} <= set(targets):
        pytest.skip("needs mosaic-gpu-hopper's records")
    return targets


def _probe(*devices, reason=""):
    return lambda: (list(devices), reason)


def test_resolve_picks_the_first_visible_devices_record():
    targets = _records()
    h100 = resolve_gpu(None, targets, probe=_probe(H100_SXM_DEVICE))
    assert (h100.name, h100.how, h100.line()) == ("h100-sxm", "detected",
                                                  "h100-sxm (detected: NVIDIA H100 80GB HBM3)")
    h200 = resolve_gpu(None, targets, probe=_probe(H200_DEVICE))
    assert (h200.name, h200.line()) == ("h200", "h200 (detected: NVIDIA H200)")
    # several visible devices: the first (cudart numbers them after CUDA_VISIBLE_DEVICES)
    first = resolve_gpu(None, targets, probe=_probe(H200_DEVICE, H100_SXM_DEVICE))
    assert first.name == "h200" and first.device.index == 0
    assert first.to_json() == {"gpu": "h200", "gpu_provenance": "detected: NVIDIA H200", "gpu_how": "detected",
                               "device": {"index": 0, "name": "NVIDIA H200", "compute_capability": [9, 0],
                                          "sm_count": 132, "target": "h200"}}


def test_resolve_takes_a_named_record_that_is_the_devices():
    got = resolve_gpu("h100-sxm", _records(), probe=_probe(H100_SXM_DEVICE))
    assert (got.name, got.how, got.line()) == ("h100-sxm", "given", "h100-sxm (--gpu)")


def test_resolve_refuses_a_named_record_that_contradicts_the_device():
    targets = _records()
    with pytest.raises(BadInput) as exc:
        resolve_gpu("h200", targets, probe=_probe(H100_SXM_DEVICE))
    assert exc.value.where == "--gpu"
    assert exc.value.what == ("GPU record 'h200' is not the detected device 0 (NVIDIA H100 80GB HBM3, sm_90, 132 SMs: "
                              "record 'h100-sxm'); name 'h100-sxm' or leave the GPU out to use the detected one")
    # device 1 being an H200 does not help: the commands run on device 0
    with pytest.raises(BadInput):
        resolve_gpu("h200", targets, probe=_probe(H100_SXM_DEVICE, H200_DEVICE))
    # a command that only lowers (capture --lower-only, amk lower) may target any record, and says so
    off = resolve_gpu("h200", targets, on_device=False, probe=_probe(H100_SXM_DEVICE))
    assert off.name == "h200" and off.how == "given" and "not the detected NVIDIA H100 80GB HBM3" in off.provenance


def test_resolve_without_a_gpu_is_the_default_and_says_why():
    targets = _records()
    got = resolve_gpu(None, targets, probe=_probe(reason="cuda-python is not installed"))
    assert DEFAULT_GPU == "h200"
    assert (got.name, got.how, got.device) == ("h200", "default", None)
    assert got.line() == "h200 (default; no GPU visible: cuda-python is not installed)"
    # a named record with no device: taken as asked (the preview and --lower-only of that record)
    named = resolve_gpu("h100-pcie", targets, probe=_probe(reason="no CUDA device visible"))
    assert (named.name, named.how, named.line()) == ("h100-pcie", "given", "h100-pcie (--gpu)")


def test_resolve_refuses_an_unknown_device_unless_a_record_is_named():
    targets = _records()
    slice_ = ("NVIDIA H200", (9, 0), 60)  # a MIG slice: the H200's name, fewer SMs -> no record, never a wrong one
    with pytest.raises(BadInput) as exc:
        resolve_gpu(None, targets, probe=_probe(slice_))
    assert "the detected device 0 (NVIDIA H200, sm_90, 60 SMs) matches no registered GPU record" in exc.value.what
    assert "mosaic gpus" in exc.value.what and exc.value.where == "--gpu"
    named = resolve_gpu("h200", targets, probe=_probe(slice_))
    assert named.name == "h200" and "matches no registered record" in named.provenance


def test_resolve_refuses_an_unknown_record_name():
    with pytest.raises(BadInput, match=r"unknown gpu 'h300'; known: .*h100-sxm.*h200"):
        resolve_gpu("h300", _records(), probe=_probe(H200_DEVICE))


def test_resolve_without_records_says_what_to_install():
    with pytest.raises(BadInput, match="default GPU record 'h200' is not registered"):
        resolve_gpu(None, {}, probe=_probe(reason="no CUDA device visible"))
    assert resolve_gpu(None, [H200], probe=_probe(("NVIDIA H200", (9, 0), 132))).name == "h200"  # GpuTargets work too
