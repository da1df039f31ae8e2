"""SASS for Pallas bundles from the PTX that jax dumped on the H200 (jax 0.11.2 dumped PTX + ptxas log only).

The PTX is the real one from the first device session (bf16 4096^3, jax's hopper matmul 128x128x64, 4 steps);
ptxas assembles it for sm_90a and core's nvdisasm helper disassembles the cubin.
"""

import shutil
from pathlib import Path

import pytest
from mosaic.plugins import PluginHost
from mosaic.toolchain.tools import find_tool

DATA = Path(__file__).resolve().parents[2] / "core" / "tests" / "data" / "h200" / "pallas-jax-128x128x64-s4.bundle"
FALLBACK = Path("/work/.device/7/x/pallas-jax-128x128x64-s4.bundle")
BUNDLE = DATA if (DATA / "kernel.ptx").is_file() else FALLBACK

needs_tools = pytest.mark.skipif(find_tool("ptxas") is None or find_tool("nvdisasm") is None,
                                 reason="needs ptxas (CUDA toolkit on PATH) and nvdisasm (pip nvidia-cuda-nvdisasm)")
needs_capture = pytest.mark.skipif(not (BUNDLE / "kernel.ptx").is_file(),
                                   reason=f"the H200 Pallas capture is not at {DATA}")


@pytest.fixture(scope="module")
def h200():
    return PluginHost(allow="hopper").load().get("gpus", "h200")


@needs_tools
@needs_capture
def test_captured_ptx_assembles_to_a_cubin_with_hopper_sass(tmp_path, h200):
    from mosaic_target_pallas.backend import assemble_ptx

    asm = assemble_ptx(BUNDLE / "kernel.ptx", h200.arch, tmp_path, runtime_log=BUNDLE / "ptxas.log")
    assert asm.cubin.read_bytes()[:4] == b"\x7fELF"
    sass = asm.sass.read_text()
    assert "anonymous_mosaic_gpu_kernel" in sass
    for op in ("HGMMA", "UTMALDG", "UTMASTG", "USETMAXREG", "SYNCS.PHASECHK"):
        assert op in sass, op
    # the reassembly agrees with the register count of jax's own ptxas run on the H200 (168)
    assert asm.registers == 168
    assert any("registers: reassembly 168, jax's runtime ptxas log 168" == n for n in asm.notes)
    assert asm.ptxas_version and asm.ptxas_version[0].isdigit()
    assert any(f"assembled from the captured PTX by ptxas {asm.ptxas_version} (-arch=sm_90a)" in n
               and "not taken from jax's runtime" in n for n in asm.notes)


@needs_tools
def test_broken_ptx_gives_a_note_not_an_error(tmp_path):
    from mosaic_target_pallas.backend import assemble_ptx

    bad = tmp_path / "kernel.ptx"
    bad.write_text(".version 9.0\n.target sm_90a\n.address_size 64\n.visible .entry k() { bogus.op; }\n")
    asm = assemble_ptx(bad, "sm_90a", tmp_path / "out")
    assert asm.cubin is None and asm.sass is None
    assert asm.notes[0].startswith("no SASS: ptxas") and "failed on the captured PTX" in asm.notes[0]


@needs_tools
@needs_capture
def test_lower_fills_sass_and_cubin_when_the_dump_has_ptx_only(tmp_path, h200, monkeypatch):
    """lower() on a GPU machine: the dump step is replaced by the real H200 dump (PTX + ptxas log)."""
    pytest.importorskip("jax", minversion="0.11.2",
                        reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")
    from mosaic.records import KernelSpec
    from mosaic_target_pallas import backend as be

    dump = tmp_path / "dump"
    dump.mkdir()
    shutil.copy(BUNDLE / "kernel.ptx", dump / "mosaic_gpu_module.ptx")
    shutil.copy(BUNDLE / "ptxas.log", dump / "mosaic_gpu_module.ptxas_log")
    monkeypatch.setattr(be, "jax_has_gpu", lambda: True)
    monkeypatch.setattr(be, "gpu_compile_dump", lambda fn, args, d: be.collect_dump(dump))
    spec = KernelSpec(family="gemm", shape={"m": 4096, "n": 4096, "k": 4096}, dtype="bf16", language="pallas",
                      knobs=dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4), name="g")
    low = be.PallasBackend().lower(spec, h200, tmp_path / "lower")
    assert low.ptx.name == "mosaic_gpu_module.ptx" and low.ptxas_log is not None
    assert low.cubin is not None and "HGMMA" in low.sass.read_text()
    assert "ptxas" in low.toolchain and any("not taken from jax's runtime" in n for n in low.notes)
