import pytest
from mosaic.errors import RecordError
from mosaic.records import Discrepancy, GpuTarget, KernelSpec, LaunchRecord, ResourceUsage

GPU = dict(name="testgpu", display_name="Test GPU", arch="sm_90a", compute_capability=(9, 0), sm_count=4,
           smem_per_sm=1000, smem_per_block=900, regs_per_sm=65536, l2_bytes=1 << 20,
           hbm_bandwidth_gbs=100.0, memory_bytes=1 << 30, peak_bf16_tflops=1.0, peak_fp8_tflops=2.0,
           max_cluster_size=8, device_names=("Test GPU",))


def test_gpu_target_roundtrip_and_validation():
    t = GpuTarget(**GPU)
    assert GpuTarget.from_json(t.to_json()) == t
    with pytest.raises(RecordError, match=r"GpuTarget.arch"):
        GpuTarget(**{**GPU, "arch": "hopper"})
    with pytest.raises(RecordError, match=r"smem_per_block=2000 is invalid: must be <= smem_per_sm \(1000\)"):
        GpuTarget(**{**GPU, "smem_per_block": 2000})
    with pytest.raises(RecordError, match="sm_count"):
        GpuTarget(**{**GPU, "sm_count": 0})
    with pytest.raises(RecordError, match="name"):
        GpuTarget(**{**GPU, "name": "Bad Name"})


def test_kernel_spec_validates_shape_dtype_and_knobs():
    k = KernelSpec(family="gemm", shape={"m": 128, "n": 64, "k": 32}, dtype="bf16", language="cute",
                   knobs={"stages": 4, "tile_mn": [128, 128]})
    assert KernelSpec.from_json(k.to_json()) == k
    assert hash(k) == hash(KernelSpec.from_json(k.to_json()))
    with pytest.raises(RecordError, match=r"dtype='bf17'.*one of"):
        KernelSpec(family="gemm", shape={"m": 1}, dtype="bf17", language="cute")
    with pytest.raises(RecordError, match="shape"):
        KernelSpec(family="gemm", shape={"m": 0}, dtype="bf16", language="cute")
    with pytest.raises(RecordError, match="knobs"):
        KernelSpec(family="gemm", shape={"m": 1}, dtype="bf16", language="cute", knobs={"f": object()})


def test_from_json_rejects_unknown_and_missing_fields():
    with pytest.raises(RecordError, match="unknown field"):
        ResourceUsage.from_json({"registers": 1, "bogus": 2})
    with pytest.raises(RecordError, match="ResourceUsage"):
        ResourceUsage.from_json({})
    with pytest.raises(RecordError, match="JSON object"):
        ResourceUsage.from_json([1])


def test_launch_record_dims():
    r = LaunchRecord(kernel_name="k", grid=132, block=[384], cluster={"x": 2})
    assert r.grid == (132, 1, 1) and r.block == (384, 1, 1) and r.cluster == (2, 1, 1)
    assert r.threads_per_block == 384 and r.blocks == 132
    with pytest.raises(RecordError, match="grid"):
        LaunchRecord(kernel_name="k", grid=(0, 1, 1), block=1)
    with pytest.raises(RecordError, match="source"):
        LaunchRecord(kernel_name="k", grid=1, block=1, source="wallclock")


def test_discrepancy_layers_and_edit_classes():
    d = Discrepancy(layer="control", key="stages", reference=4, candidate=2, rank=1, edit="knob",
                    where="loop L1", why="fewer stages expose load latency")
    assert d.to_json()["layer"] == "control"
    with pytest.raises(RecordError, match="layer='timing'"):
        Discrepancy(layer="timing", key="x", reference=1, candidate=2, rank=1, edit="knob")
    with pytest.raises(RecordError, match="edit"):
        Discrepancy(layer="launch", key="x", reference=1, candidate=2, rank=1, edit="tweak")


def test_kernel_spec_from_json_refuses_a_shape_or_knobs_that_is_no_mapping():
    import re

    import pytest
    from mosaic.errors import RecordError

    good = {"family": "gemm", "shape": {"m": 8}, "dtype": "bf16", "language": "cute"}
    for field, bad, allowed in (("shape", "ab", "a mapping of dimension name to positive integer"),
                                ("shape", 5, "a mapping of dimension name to positive integer"),
                                ("knobs", "xy", "a mapping of knob name to a JSON scalar or list"),
                                ("knobs", [1, 2], "a mapping of knob name to a JSON scalar or list")):
        with pytest.raises(RecordError, match="^" + re.escape(f"KernelSpec.{field}={bad!r} is invalid: must be {allowed}")):
            KernelSpec.from_json({**good, field: bad})
    assert KernelSpec(family="gemm", shape=[("m", 8)], dtype="bf16", language="cute").shape == {"m": 8}
