"""The `mosaic` command end to end, through the installed console script."""

import json

import numpy as np
import pytest
from mosaic import __version__
from mosaic.bundle import save_bundle
from mosaic.records import KernelSpec

ALL_PLUGINS = {"amk", "blackwell", "cute", "cutlass", "hopper", "pallas"}


def test_version(mosaic):
    out = mosaic("--version", check=0).stdout
    assert out.strip() == f"mosaic {__version__}"


def test_plugins_json_lists_all_six(mosaic):
    data = json.loads(mosaic("plugins", "--json", check=0).stdout)
    by_name = {p["name"]: p for p in data["plugins"]}
    assert ALL_PLUGINS <= set(by_name)
    assert by_name["hopper"]["distribution"] == "mosaic-gpu-hopper"
    assert by_name["hopper"]["hooks"] == ["register_gpus"]
    assert set(by_name["hopper"]["provides"]) == {"gpu:h100-sxm", "gpu:h100-pcie", "gpu:h200"}
    assert "command:amk" in by_name["amk"]["provides"]
    assert all(p["status"] == "ok" for p in by_name.values())


def test_allow_list(mosaic):
    data = json.loads(mosaic("plugins", "--json", env={"MOSAIC_LOAD_PLUGINS": "hopper"}, check=0).stdout)
    assert [p["name"] for p in data["plugins"]] == ["hopper"]
    bad = mosaic("plugins", env={"MOSAIC_LOAD_PLUGINS": "hopper,nosuch"}, check=2)
    assert len(bad.stderr.strip().splitlines()) == 1 and "unknown plugin(s) nosuch" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_gpus_lists_records_and_says_when_nothing_detected(mosaic):
    out = mosaic("gpus", check=0).stdout
    for name in ("h100-sxm", "h100-pcie", "h200", "b200", "rtx5090"):
        assert name in out
    assert "Detected:" in out
    data = json.loads(mosaic("gpus", "--json", check=0).stdout)
    h200 = next(t for t in data["targets"] if t["name"] == "h200")
    assert h200["sm_count"] == 132 and h200["arch"] == "sm_90a"


def test_amk_group_comes_from_the_plugin(mosaic):
    assert "AutoMegaKernel" in mosaic("amk", "--help", check=0).stdout
    missing = mosaic("amk", "--help", env={"MOSAIC_LOAD_PLUGINS": "hopper"}, check=2)
    assert "No such command 'amk'" in missing.stderr


@pytest.fixture
def bundle_dir(tmp_path):
    spec = KernelSpec(family="gemm", shape={"m": 8, "n": 8, "k": 8}, dtype="bf16", language="cutlass",
                      knobs={"stages": 4})
    npz = tmp_path / "o.npz"
    np.savez(npz, c=np.ones((8, 8), np.float32))
    b = save_bundle(tmp_path / "x.bundle", kernel=spec, language="cutlass", gpu="h200",
                    files={"k.sass": ("sass", "NOP ;\n"), "out.npz": ("outputs", npz),
                           "launch.json": ("launch", json.dumps({"kernel_name": "k", "grid": [2, 1, 1],
                                                                 "block": [128, 1, 1]}))})
    return b.root


def test_bundle_show_and_verify(mosaic, bundle_dir):
    out = mosaic("bundle", "show", str(bundle_dir), check=0).stdout
    assert "gemm 8x8x8 bf16" in out and "stages=4" in out and "grid (2, 1, 1)" in out
    assert mosaic("bundle", "verify", str(bundle_dir), check=0).stdout.startswith("OK")
    (bundle_dir / "k.sass").write_text("NOP ; \n")
    bad = mosaic("bundle", "verify", str(bundle_dir), check=1)
    assert "k.sass" in bad.stderr and "size" in bad.stderr


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "no such bundle"),
    (lambda p: p.mkdir(), "bundle has no manifest.json"),
    (lambda p: (p.mkdir(), (p / "manifest.json").write_text("[1, 2")), "not valid JSON"),
    (lambda p: (p.mkdir(), (p / "manifest.json").write_text('{"format": "mosaic-bundle", "schema_version": 7, '
                                                            '"kernel": {}, "language": "x", "files": {}}')),
     "schema_version is 7"),
])
@pytest.mark.parametrize("verb", ["show", "verify"])
def test_bad_bundles_one_line_exit_2(mosaic, tmp_path, setup, message, verb):
    path = tmp_path / "b.bundle"
    setup(path)
    proc = mosaic("bundle", verb, str(path), check=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr


def test_bad_arguments_one_line_exit_2(mosaic):
    proc = mosaic("plugins", "--jsn", check=2)
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("error: No such option '--jsn'. Did you mean '--json'?")
    assert mosaic("nosuch", check=2).stderr.startswith("error: No such command 'nosuch'")


def test_debug_shows_traceback(mosaic, tmp_path):
    proc = mosaic("--debug", "bundle", "show", str(tmp_path / "nope"))
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "BundleError" in proc.stderr


def test_broken_third_party_plugin_is_reported_and_skipped(mosaic, tmp_path):
    info = tmp_path / "broken_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-dist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[mosaic]\nbroken = broken_mod\n")
    (tmp_path / "broken_mod.py").write_text("import nonexistent_dependency_xyz\n")
    proc = mosaic("plugins", "--json", env={"PYTHONPATH": str(tmp_path)}, check=0)
    broken = next(p for p in json.loads(proc.stdout)["plugins"] if p["name"] == "broken")
    assert broken["status"] == "broken" and "nonexistent_dependency_xyz" in broken["error"]
    assert "plugin 'broken' (broken-dist) failed to load" in proc.stderr
    # everything else still works
    assert mosaic("gpus", env={"PYTHONPATH": str(tmp_path)}, check=0).stdout.count("sm_90a") == 3


def test_plugins_table_counts_long_lists(mosaic):
    out = mosaic("plugins", check=0).stdout
    row = next(line for line in out.splitlines() if line.startswith("hopper"))
    assert row.rstrip().endswith("gpu:h100-pcie, gpu:h100-sxm, gpu:h200")  # few: named
    cute = next(line for line in out.splitlines() if line.startswith("cute"))
    assert "constructs" in cute and "construct:" not in cute and "language:cute" in cute  # many: counted
