"""``mosaic doctor`` on this machine: real tool lookups and versions, real imports, the real device query.

This machine has nvcc 13.0 and ptxas on PATH, the pip nvdisasm/cuobjdump wheels, no GPU; .venv has no CuTe DSL,
.venv312 has CuTe DSL 4.8.1 and jax 0.11.2. The expectations below are derived from independent probes
(mosaic.toolchain, mosaic.gpus, importlib), so they hold on a GPU machine too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic import doctor as doc
from mosaic.cli import main
from mosaic.toolchain.tools import find_tool, version_number

ROOT = Path(__file__).resolve().parents[3]
VENV312 = ROOT / ".venv312" / "bin" / "mosaic"


def _doctor(capsys, *args: str) -> tuple[int, str, str]:
    """``mosaic doctor ARGS`` through the real entry point: (exit code, stdout, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["doctor", *args])
    out, err = capsys.readouterr()
    return done.value.code, out, err


def _report(capsys, *args: str) -> tuple[int, dict]:
    code, out, _ = _doctor(capsys, "--json", *args)
    return code, json.loads(out)


def _by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_the_toolchain_rows_name_the_tool_found_and_its_version(capsys):
    code, report = _report(capsys)
    assert code == 0
    checks = _by_name(report)
    for tool in ("nvcc", "ptxas", "nvdisasm", "cuobjdump"):
        exe = find_tool(tool)
        row = checks[tool]
        assert row["section"] == "tool"
        if exe is None:
            assert not row["ok"] and row["fix"].startswith("pip install 'nvidia-cuda-")
            assert row["fix"] in report["install"]
        else:
            assert row["ok"], row
            assert row["data"]["path"] == exe and row["data"]["version"] == version_number(exe)
            assert row["detail"] == f"{version_number(exe)} at {exe}"


def test_nvcc_13_and_ptxas_are_found_here():
    if find_tool("nvcc") is None:
        pytest.skip("no nvcc on this machine")
    checks = {c.name: c for c in doc.diagnose()}
    assert checks["nvcc"].ok and checks["nvcc"].data["version"].split(".")[0] in ("12", "13")
    assert checks["ptxas"].ok and checks["ptxas"].data["version"] == version_number(find_tool("ptxas"))


def test_a_tool_missing_from_every_place_gets_its_pip_line(tmp_path, monkeypatch):
    # a fresh interpreter where none of the places the toolchain searches holds nvcc: PATH empty of it, CUDA_HOME
    # an empty directory; /usr/local/cuda and the nvidia wheels are still searched, so skip when they hold it
    script = ("import json; from mosaic import doctor as d; c = d.tool_check('nvcc'); "
              "print(json.dumps(c.to_json()))")
    env = {**os.environ, "PATH": str(tmp_path), "CUDA_HOME": str(tmp_path), "CUDA_PATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    row = json.loads(out.stdout)
    left = [Path(p) / "cu13" / "bin" / "nvcc" for p in _nvidia_paths()] + [Path("/usr/local/cuda/bin/nvcc")]
    left = [str(p) for p in left if p.is_file() and os.access(p, os.X_OK)]
    if left:  # the remaining places, in the toolchain's order (toolkit before wheels for nvcc)
        assert row["ok"] and row["data"]["path"] in left, row
        assert row["data"]["path"] == left[-1] if "/usr/local/cuda/bin/nvcc" in left else left[0]
        return
    assert not row["ok"] and row["fix"].startswith("pip install 'nvidia-cuda-nvcc>=13,<14'")


def _nvidia_paths() -> list[str]:
    try:
        import nvidia
    except ImportError:
        return []
    return list(nvidia.__path__)


def test_the_gpu_row_agrees_with_the_device_probe():
    from mosaic.gpus import probe_devices

    devices, reason = probe_devices()
    rows = [c for c in doc.diagnose() if c.section == "gpu"]
    if not devices:
        assert len(rows) == 1 and not rows[0].ok and rows[0].detail.startswith("none: ")
        assert rows[0].fix
    else:
        assert [r.data["name"] for r in rows] == [d[0] for d in devices]
        assert [r.data["sm_count"] for r in rows] == [d[2] for d in devices]
        assert all(r.ok for r in rows)


def test_cupti_row_matches_whether_cupti_python_imports():
    row = doc.cupti_check()
    try:
        from cupti import cupti  # noqa: F401
    except Exception:  # noqa: BLE001
        assert not row.ok and "cupti-python" in row.fix and "13.4" in row.fix
    else:
        try:
            cupti.get_timestamp()
        except Exception:  # noqa: BLE001 - no driver here: it imports but cannot load
            assert not row.ok and "imports but CUPTI does not load" in row.detail and row.fix
        else:
            assert row.ok and row.data["timestamp_ns"] > 0


def test_cute_readiness_is_whether_cute_dsl_imports_here():
    row = next(c for c in doc.language_checks() if c.name == "cute")
    if importlib.util.find_spec("cutlass") is None:
        assert not row.ok and row.detail == "nvidia-cutlass-dsl is not installed"
        assert row.fix.startswith("pip install 'nvidia-cutlass-dsl>=4.8.1,<5'")
    else:
        import cutlass.cute  # noqa: F401

        assert row.ok and row.detail.startswith("nvidia-cutlass-dsl 4.")


def test_pallas_on_python_311_names_the_312_environment():
    row = next(c for c in doc.language_checks() if c.name == "pallas")
    if sys.version_info < (3, 12):
        assert not row.ok and "needs Python >= 3.12" in row.detail and row.detail.count("needs Python") == 1
        assert row.fix == doc.PY312_FIX
    else:
        ok = importlib.util.find_spec("jax") is not None
        assert row.ok == ok


@pytest.mark.skipif(not VENV312.exists(), reason="needs .venv312 (make test builds it): CuTe DSL and jax there")
def test_in_the_312_environment_cute_and_pallas_are_ready():
    out = subprocess.run([str(VENV312), "doctor", "--json", "--require", "cute", "--require", "pallas"],
                         capture_output=True, text=True, timeout=300)
    report = json.loads(out.stdout)
    langs = {c["name"]: c for c in report["checks"] if c["section"] == "language"}
    assert out.returncode == 0, (langs, out.stderr)
    assert langs["cute"]["ok"] and "nvidia-cutlass-dsl 4.8.1" in langs["cute"]["detail"]
    assert langs["pallas"]["ok"] and "jax 0.11.2" in langs["pallas"]["detail"]
    assert report["required"] == {"cute": True, "pallas": True}


def test_cutlass_headers_are_found_where_the_cutlass_plugin_finds_them():
    build = pytest.importorskip("mosaic_target_cutlass.build")
    row = next(c for c in doc.language_checks() if c.name == "cutlass")
    try:
        inc, _ = build.cutlass_include()
    except Exception:  # noqa: BLE001 - ToolMissing: then doctor must say it is not ready
        assert not row.ok and row.fix
        return
    found, _ = doc.header_location(doc.LANGUAGE_NEEDS["cutlass"].needs[0])
    assert row.ok and found == inc and f"headers {build.cutlass_version(inc)} at {inc}" in row.detail


def test_a_bad_cutlass_include_makes_cutlass_unready_with_the_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOSAIC_CUTLASS_INCLUDE", str(tmp_path))
    code, report = _report(capsys)
    row = _by_name(report)["cutlass"]
    assert code == 0 and not row["ok"]
    assert row["detail"] == f"no {tmp_path / 'cutlass' / 'cutlass.h'} (from $MOSAIC_CUTLASS_INCLUDE)"
    assert "nvidia-cutlass==4.2.0.0" in row["fix"]
    build = pytest.importorskip("mosaic_target_cutlass.build")
    with pytest.raises(Exception, match="cutlass.h"):  # the plugin refuses the same directory
        build.cutlass_include()


def test_plugins_and_distributions_are_listed_with_what_they_register(capsys):
    from mosaic.plugins import host

    h = host()
    _, report = _report(capsys)
    plugins = {c["name"]: c for c in report["checks"] if c["section"] == "plugin"}
    assert set(plugins) == set(h.plugins)
    for kind in ("languages", "gpus", "families", "proposers"):
        for name, reg in h.registries[kind].items():
            assert name in plugins[reg.plugin]["data"][kind]
    dists = {c["name"] for c in report["checks"] if c["section"] == "distribution"}
    assert "mosaic-core" in dists and {p["data"]["distribution"] for p in plugins.values()} <= dists


def test_text_report_has_every_section_and_the_install_lines(capsys):
    code, out, _ = _doctor(capsys)
    assert code == 0
    for title in ("Python:", "CUDA toolchain:", "GPU:", "CUPTI:", "Kernel languages:"):
        assert title in out
    fixes = doc.missing_fixes(doc.diagnose())
    if fixes:
        assert "To install what is missing:" in out
        assert all(f"  {line}" in out for line in fixes)


def test_require_exits_1_when_missing_0_when_usable_2_when_unknown(capsys):
    checks = doc.diagnose()
    if next(c for c in checks if c.name == "nvcc").ok:
        assert _doctor(capsys, "--require", "nvcc")[0] == 0
    gpu_ok = any(c.ok for c in checks if c.section == "gpu")
    code, _, err = _doctor(capsys, "--require", "gpu")
    assert code == (0 if gpu_ok else 1)
    if not gpu_ok:
        assert err == "required 'gpu' is not usable here\n"
    tools_ok = all(c.ok for c in checks if c.section == "tool")
    assert _doctor(capsys, "--require", "tools", "--json")[0] == (0 if tools_ok else 1)


def test_an_unknown_require_or_option_is_one_error_line_exit_2():
    for args in (["--require", "warp-drive"], ["--frobnicate"]):
        out = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "doctor", *args],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 2, out
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ") and not out.stdout
    assert "unknown 'warp-drive'; known: " in subprocess.run(
        [sys.executable, "-c", "from mosaic.cli import main; main()", "doctor", "--require", "warp-drive"],
        capture_output=True, text=True, timeout=300).stderr


@pytest.mark.gpu
def test_on_a_gpu_machine_the_device_driver_record_and_cupti_are_reported_usable():
    from mosaic.gpus import probe_devices
    from mosaic.plugins import host

    devices, reason = probe_devices()
    if not devices:
        pytest.skip(f"needs a CUDA device ({reason})")
    rows = [c for c in doc.diagnose() if c.section == "gpu"]
    assert [r.data["name"] for r in rows] == [d[0] for d in devices] and all(r.ok for r in rows)
    assert rows[0].data["via"] == "cuda-python" and rows[0].data["driver"].startswith("CUDA ")
    if "H200" in rows[0].data["name"] and "hopper" in host().plugins:
        assert rows[0].data["record"] == "h200" and rows[0].data["sm_count"] == 132
    pytest.importorskip("cupti", reason="needs cupti-python (pip install 'mosaic-core[gpu]')")
    row = doc.cupti_check()
    assert row.ok, row.detail
    assert row.data["timestamp_ns"] > 0


def test_a_plugin_that_fails_to_load_is_listed_broken_with_its_reason(capsys):
    from importlib.metadata import EntryPoint

    from mosaic.plugins import PluginHost

    host = PluginHost([EntryPoint("ghost", "mosaic_no_such_plugin_module", "mosaic")]).load()
    capsys.readouterr()  # the host's one warning line on stderr
    rows = doc.plugin_checks(host)
    assert [(r.name, r.ok) for r in rows] == [("ghost", False)]
    assert "ModuleNotFoundError" in rows[0].detail and "mosaic_no_such_plugin_module" in rows[0].detail
    assert rows[0].fix.startswith("# repair or remove")
    checks = doc.diagnose(host)
    assert {c.section for c in checks} == set(doc.SECTIONS)  # mosaic-core itself is an installed distribution
    langs = {c.name: c for c in checks if c.section == "language"}
    assert set(langs) == set(doc.LANGUAGE_NEEDS) and not any(c.ok for c in langs.values())
    assert all("plugin not installed" in c.detail for c in langs.values())


def test_optional_packages_follow_their_metadata_and_stay_out_of_the_install_list(capsys):
    import importlib.metadata as md

    code, report = _report(capsys)
    rows = {c["name"]: c for c in report["checks"] if c["section"] == "optional"}
    assert set(rows) == set(doc.OPTIONAL)
    for dist, row in rows.items():
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            version = None
        assert row["ok"] == (version is not None) and row["data"]["version"] == version
        if version is None:
            assert row["fix"] == doc.OPTIONAL[dist][1] and row["fix"] not in report["install"]
    code, _, _ = _doctor(capsys, "--require", "torch")
    assert code == (0 if rows["torch"]["ok"] else 1)


def test_module_rules_check_the_installed_version_range_then_import():
    import importlib.metadata as md

    have = md.version("pytest")
    major = int(have.split(".")[0])
    ok = doc.Module("pytest", "pytest", minimum=str(major), below=str(major + 1))
    assert doc._module_problem(ok) == (None, f"pytest {have}")
    old = doc.Module("pytest", "pytest", minimum=str(major + 1))
    assert doc._module_problem(old) == (f"pytest {have} is older than {major + 1}", have)
    new = doc.Module("pytest", "pytest", below=str(major))
    assert doc._module_problem(new) == (f"pytest {have} is not supported (needs < {major})", have)
    broken = doc.Module("pytest.no_such_submodule", "pytest")
    problem, _ = doc._module_problem(broken)
    assert problem.startswith("import pytest.no_such_submodule failed: ModuleNotFoundError")
    assert doc._module_problem(doc.Module("x", "mosaic-no-such-dist"))[0] == "mosaic-no-such-dist is not installed"
