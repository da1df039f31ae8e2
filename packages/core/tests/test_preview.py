"""`mosaic run` on a machine without a GPU: the preview (mosaic.run.preview) runs what needs no device and lists
the rest. The full path (CuTe lowering + diff + proposals) is in packages/target-cute/tests/test_preview_cute.py
(Python 3.12, CuTe DSL)."""

from __future__ import annotations

import json
import shutil

import pytest
from mosaic.bundle import restore
from mosaic.errors import BundleError
from mosaic.plugins import host
from mosaic.records import KernelSpec
from mosaic.run.campaign import Campaign
from mosaic.run.preview import DEVICE_STEPS, find_reference, run_preview


def campaign(**more) -> Campaign:
    return Campaign.from_json({"source": "pallas", "target": "cute", "family": "gemm", "shape": "4096x4096x4096",
                               "dtype": "bf16", **more})


def pallas():
    return host().items("languages")["pallas"]


def test_the_pallas_plugin_ships_a_verified_h200_reference_and_it_is_matched_exactly():
    spec = KernelSpec("gemm", {"m": 4096, "n": 4096, "k": 4096}, "bf16", "pallas", {})
    path, shipped = find_reference(pallas(), spec, "h200")
    assert path is not None and path.name == "gemm-4096x4096x4096-bf16-h200.bundle"
    assert shipped == ["gemm 4096x4096x4096 bf16 on h200"]
    for other, gpu in ((KernelSpec("gemm", {"m": 4096, "n": 4096, "k": 2048}, "bf16", "pallas", {}), "h200"),
                       (KernelSpec("gemm", {"m": 4096, "n": 4096, "k": 4096}, "f16", "pallas", {}), "h200"),
                       (KernelSpec("gemm", {"m": 4096, "n": 4096, "k": 4096}, "bf16", "pallas", {"tile_m": 64}),
                        "h200"),
                       (spec, "h100-sxm")):
        assert find_reference(pallas(), other, gpu)[0] is None


def test_no_shipped_reference_is_said_with_what_the_plugin_ships(tmp_path):
    p = run_preview(campaign(shape="1024x1024x1024"), tmp_path, "test: no device", lambda line: None)
    skipped = dict(p.skipped)
    assert "gemm 1024x1024x1024 bf16 on h200" in skipped["reference"]
    assert "it ships: gemm 4096x4096x4096 bf16 on h200" in skipped["reference"]
    assert "need both the reference and the naive translation" in skipped["diff and proposals"]
    for step, _ in DEVICE_STEPS:
        assert skipped[step].endswith("needs a CUDA device")
    assert skipped["yardstick"].startswith("cuBLAS timed in the same run")  # gemm's first yardstick
    data = json.loads((tmp_path / "preview.json").read_text())
    assert data["format"] == "mosaic-run-preview" and data["no_gpu"] == "test: no device" and data["rows"] == []
    assert not (tmp_path / "journal.jsonl").exists()  # never mistaken for a campaign to resume


def test_reference_is_copied_verified_and_an_unlowerable_target_is_reported_in_one_line(tmp_path, monkeypatch):
    """The target's toolchain is missing: the CUTLASS headers the cutlass plugin's build reads from
    $MOSAIC_CUTLASS_INCLUDE are not there (an empty directory), so its naive translation cannot be lowered."""
    pytest.importorskip("mosaic_target_cutlass")
    if "cutlass" not in host().items("languages"):
        pytest.skip("the cutlass plugin is not loaded here")
    missing = tmp_path / "no-cutlass-headers"
    missing.mkdir()
    monkeypatch.setenv("MOSAIC_CUTLASS_INCLUDE", str(missing))  # read by the lowering's own process too
    p = run_preview(campaign(target="cutlass"), tmp_path, "test", lambda line: None)
    ref = tmp_path / "bundles" / "reference.bundle"
    assert (ref / "manifest.json").is_file() and p.reference["recorded_time_ns"] == 177088.0
    assert p.reference["gpu"] == "h200" and p.reference["timer"] == "cupti"
    md = (tmp_path / "preview.md").read_text()
    assert "recorded 177.09 us, noise 1.00 us on h200" in md
    why = dict(p.skipped).get("naive translation")
    assert why is not None and "\n" not in why  # the lowering says why, in one line
    assert f"no cutlass/cutlass.h under {missing}" in why, why
    assert "naive translation" not in dict(p.done)


def test_a_tampered_shipped_reference_is_refused_not_used(tmp_path):
    src = pallas().references[0]
    bad = tmp_path / "refs" / "gemm-4096x4096x4096-bf16-h200.bundle"
    shutil.copytree(src, bad)
    restore(bad, compress=False)  # the shipped bundle stores its SASS xz-compressed; edit its plain text
    sass = bad / "kernel.sass"
    sass.write_text(sass.read_text().replace("HMMA", "HMMX", 1) + "\n// edited\n")
    import attrs

    tampered = attrs.evolve(pallas(), references=(str(bad),))
    langs = {**host().items("languages"), "pallas": tampered}
    with pytest.raises(BundleError, match="kernel.sass"):
        run_preview(campaign(), tmp_path / "out", "test", lambda line: None, languages=langs)


def test_a_lowering_that_lacks_a_python_module_points_at_mosaic_doctor(tmp_path):
    """Where the Pallas plugin is installed without jax (the Python 3.11 environment), the naive translation's
    skip names the missing module and where to look; elsewhere the message is left as it is."""
    from mosaic.run.preview import DOCTOR_HINT, with_doctor_hint

    assert with_doctor_hint("lowering failed: no cutlass/cutlass.h under /x") == "lowering failed: no cutlass/cutlass.h under /x"
    try:
        import jax  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("jax is installed here: the Pallas lowering does not lack it")
    p = run_preview(campaign(source="cute", target="pallas"), tmp_path, "test: no device", lambda line: None)
    why = dict(p.skipped)["naive translation"]
    assert "No module named 'jax'" in why and why.endswith(f"({DOCTOR_HINT})") and "\n" not in why, why
