"""The CUTLASS build caches under attack (issue #35): a cached ``libkernel.so`` whose bytes changed is rebuilt,
never loaded; a cached failure is believed only while intact; and ``capture --lower-only`` (no GPU) never loads
a kernel library into its process: the shim's compile-time facts are recorded with the build, the kernel file's
``mosaic_geometry`` runs in a child process.

The template tests stand a C compiler in for nvcc (a shim library with the three facts functions, a PTX with
one entry): seconds, no CUTLASS compile. The kernel-file test runs the real nvcc (marked slow)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from mosaic.backend import Unbuildable
from mosaic.plugins import PluginHost
from mosaic.toolchain import nvcc as N
from mosaic.toolchain.nvcc import find_nvcc
from mosaic_target_cutlass import backend, build

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "cuda"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not on PATH")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
FACTS = {"smem_bytes": 123456, "threads_per_block": 384, "stages": 5}
SHIM_C = (f"int mosaic_smem_bytes(void) {{ return {FACTS['smem_bytes']}; }}\n"
          f"int mosaic_block_threads(void) {{ return {FACTS['threads_per_block']}; }}\n"
          f"int mosaic_stages(void) {{ return {FACTS['stages']}; }}\n")
LOG = ("ptxas info    : Compiling entry function 'mosaic_fake_gemm' for 'sm_90a'\n"
       "ptxas info    : Function properties for mosaic_fake_gemm\n"
       "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
       "ptxas info    : Used 168 registers, used 1 barriers\n")


def mapped(needle: str) -> list[str]:
    """Files mapped into this process whose path holds ``needle`` (a dlopened library is one)."""
    with open("/proc/self/maps") as fh:
        return sorted({ln.split()[-1] for ln in fh if needle in ln})


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """MOSAIC_CACHE_DIR in tmp_path; nvcc's run replaced by a C compile of the shim's facts functions. Its
    ``calls`` counts compiles; ``fail`` makes the next ones fail."""
    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MOSAIC_CACHE_MAX", raising=False)
    state = {"calls": 0, "fail": False}

    def run_nvcc(exe, args, *, timeout=600, cwd=None):
        state["calls"] += 1
        if state["fail"]:
            return N.NvccRun(tuple(args), 1, "kernel.cu(1): error: no instance of the template", 0.1)
        out = args[args.index("-o") + 1]
        keep = Path(next(a.split("=", 1)[1] for a in args if a.startswith("--keep-dir=")))
        subprocess.run(["cc", "-shared", "-fPIC", "-x", "c", "-", "-o", out], input=SHIM_C, text=True, check=True)
        (keep / "kernel.ptx").write_text(".visible .entry mosaic_fake_gemm(\n)\n{\n}\n")
        (keep / "kernel.cubin").write_bytes(b"not a cubin: no SASS for this build")
        return N.NvccRun(tuple(args), 0, LOG, 0.5)

    monkeypatch.setattr(build._nvcc, "run_nvcc", run_nvcc)
    return state


def _warnings(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


@needs_nvcc
@needs_cc
def test_lowering_checks_budgets_from_the_recorded_facts_without_loading_the_library(fake_nvcc):
    b = build.build("// template one\n")
    assert not b.cached and fake_nvcc["calls"] == 1 and b.library.name == "libkernel.so"
    assert b.facts == FACTS  # the shim's own answers, recorded with the build
    h200 = PluginHost(allow="hopper").load().get("gpus", "h200")
    assert backend.check_budgets(b, h200) == FACTS
    hit = build.build("// template one\n")
    assert hit.cached and hit.facts == FACTS and fake_nvcc["calls"] == 1
    assert backend.check_budgets(hit, h200) == FACTS
    assert mapped(str(b.dir)) == [] and mapped("libkernel.so") == []  # never dlopened by this process


@needs_nvcc
@needs_cc
def test_a_tampered_cached_libkernel_so_is_rebuilt_not_loaded(fake_nvcc, capsys):
    first = build.build("// template two\n")
    good = first.library.read_bytes()
    assert build.build("// template two\n").cached and _warnings(capsys) == []  # the normal hit
    assert (first.dir.stat().st_mode & 0o777) == 0o700
    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF
    first.library.write_bytes(bytes(data))

    again = build.build("// template two\n")
    assert not again.cached and fake_nvcc["calls"] == 2, "a tampered library was a cache hit"
    assert again.library == first.library and again.library.read_bytes() != bytes(data)
    (line,) = _warnings(capsys)
    assert str(first.library) in line and "SHA-256" in line
    assert mapped("libkernel.so") == []


@needs_nvcc
@needs_cc
def test_a_cached_failure_is_believed_only_while_intact(fake_nvcc, capsys):
    fake_nvcc["fail"] = True
    with pytest.raises(Unbuildable, match="nvcc failed: "):
        build.build("// template three\n")
    with pytest.raises(Unbuildable, match=r"nvcc failed \(cached\)"):
        build.build("// template three\n")
    assert fake_nvcc["calls"] == 1 and _warnings(capsys) == []
    (entry,) = (Path(os.environ["MOSAIC_CACHE_DIR"]) / "cutlass").iterdir()
    failed = entry / "failed.json"
    failed.write_text(json.dumps({**json.loads(failed.read_text()), "error": "planted"}))
    fake_nvcc["fail"] = False
    b = build.build("// template three\n")  # the changed record is not believed: built again, and it builds
    assert not b.cached and fake_nvcc["calls"] == 2 and b.facts == FACTS
    (line,) = _warnings(capsys)
    assert str(failed) in line


@needs_nvcc
@pytest.mark.slow
def test_capture_lower_only_never_loads_the_kernel_library_and_a_tampered_one_is_rebuilt(tmp_path, monkeypatch,
                                                                                          capsys):
    from mosaic import kernel_files as kf
    from mosaic.capture import CaptureOptions, capture_in_process
    from mosaic.records import KernelSpec

    cache = tmp_path / "cache"
    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(cache))
    kfile = kf.read_kernel_file(EXAMPLES / "rmsnorm.cu")
    spec = KernelSpec(family="rmsnorm", shape={"rows": 64, "cols": 256}, dtype="bf16", language="cutlass",
                      knobs=kfile.knob_values({}), name=kfile.name)
    backend = kf.file_backend(kfile, "cutlass")

    def capture(name):  # what the capture child of `mosaic capture --file ... --lower-only` does
        r = capture_in_process(spec, "h200", tmp_path / name, CaptureOptions(lower_only=True), backend=backend)
        assert r.status == "lowered", r
        assert mapped("libkernel") == [] and mapped(str(cache)) == [], "the capture loaded a kernel library"
        build_note = next(n for n in json.loads((r.bundle / "lowering.json").read_text())["notes"]
                          if n.startswith("build "))
        return json.loads((r.bundle / "launch.json").read_text()), build_note, _warnings(capsys)

    first, note, said = capture("a.bundle")
    assert (first["grid"], first["block"]) == ([64, 1, 1], [256, 1, 1]) and not note.endswith("(cached)")
    assert said == []
    (entry,) = (cache / "kernel-file").iterdir()
    lib = entry / "libkernel.so"
    assert (entry / "integrity.json").is_file()
    hit, note, said = capture("b.bundle")  # the normal hit: the same launch record, nothing said
    assert hit == first and note.endswith("(cached)") and said == []
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    again, note, said = capture("c.bundle")
    assert again == first and not note.endswith("(cached)") and lib.read_bytes() != bytes(data)
    assert len(said) == 1 and str(lib) in said[0] and "SHA-256" in said[0]
