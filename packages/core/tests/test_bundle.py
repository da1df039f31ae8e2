import json

import numpy as np
import pytest
from mosaic.bundle import load_bundle, save_bundle, verify_bundle
from mosaic.errors import BundleError
from mosaic.records import KernelSpec, LaunchRecord

SPEC = KernelSpec(family="gemm", shape={"m": 64, "n": 64, "k": 64}, dtype="bf16", language="cutlass")


def make(tmp_path, **kw):
    npz = tmp_path / "out.npz"
    np.savez(npz, c=np.arange(6, dtype=np.float32).reshape(2, 3))
    launch = LaunchRecord(kernel_name="gemm", grid=(4, 1, 1), block=(128, 1, 1), registers_per_thread=90)
    files = {
        "kernel.ptx": ("ptx", ".version 8.5\n"),
        "kernel.sass": ("sass", "MOV R1, c[0x0][0x28] ;\n"),
        "launch.json": ("launch", json.dumps(launch.to_json())),
        "outputs.npz": ("outputs", npz),
    }
    return save_bundle(tmp_path / "g.bundle", kernel=SPEC, language="cutlass", files=files, gpu="h200",
                       toolchain={"nvcc": "13.0"}, **kw)


def test_roundtrip(tmp_path):
    b = make(tmp_path)
    again = load_bundle(b.root)
    assert again.kernel == SPEC and again.gpu == "h200"
    assert again.launch().registers_per_thread == 90
    np.testing.assert_array_equal(again.arrays("outputs")["c"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert verify_bundle(again) == []
    assert sorted(f.role for f in again.files) == ["launch", "outputs", "ptx", "sass"]


def test_existing_bundle_is_never_overwritten_silently(tmp_path):
    make(tmp_path)
    with pytest.raises(BundleError, match="already exists"):
        make(tmp_path)
    assert make(tmp_path, overwrite=True).kernel == SPEC


def test_tampering_is_detected(tmp_path):
    b = make(tmp_path)
    (b.root / "kernel.sass").write_text("MOV R2, c[0x0][0x28] ;\n")  # same size, other bytes
    assert verify_bundle(b.root) == ["kernel.sass: SHA-256 mismatch"]
    with pytest.raises(BundleError, match="kernel.sass: SHA-256 mismatch"):
        load_bundle(b.root)
    (b.root / "kernel.ptx").unlink()
    assert verify_bundle(b.root)[0] == "kernel.ptx: missing"
    (b.root / "stray.bin").write_bytes(b"x")
    assert "stray.bin: not listed in the manifest" in verify_bundle(b.root)


@pytest.mark.parametrize("mutate, message", [
    (lambda m: m.update(schema_version=99), "schema_version is 99"),
    (lambda m: m.update(format="zip"), "format is 'zip'"),
    (lambda m: m.pop("kernel"), "lacks kernel"),
    (lambda m: m["files"].update({"../evil": {"role": "ptx", "sha256": "0", "size": 1}}), "inside the bundle"),
    (lambda m: m["kernel"].update(dtype="q7"), "kernel spec"),
])
def test_bad_manifests(tmp_path, mutate, message):
    b = make(tmp_path)
    manifest = json.loads((b.root / "manifest.json").read_text())
    mutate(manifest)
    (b.root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=message):
        load_bundle(b.root)


def test_pickled_npz_is_refused(tmp_path):
    npz = tmp_path / "evil.npz"
    np.savez(npz, c=np.array([object()], dtype=object))
    b = save_bundle(tmp_path / "e.bundle", kernel=SPEC, language="cutlass", files={"o.npz": ("outputs", npz)})
    with pytest.raises(BundleError, match="without pickle"):
        b.arrays("outputs")


def test_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match="no such bundle"):
        load_bundle(tmp_path / "nope")
    (tmp_path / "d").mkdir()
    with pytest.raises(BundleError, match="no manifest.json"):
        load_bundle(tmp_path / "d")
    (tmp_path / "d" / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(tmp_path / "d")
