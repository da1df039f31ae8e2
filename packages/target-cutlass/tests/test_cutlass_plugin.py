"""The cutlass plugin: conformance kit, knob validation, buildability rules, and (slow) nvcc lowering of
two real configurations into bundles, one through `mosaic capture --lower-only`."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from mosaic.backend import Unbuildable
from mosaic.capture import CaptureOptions, capture
from mosaic.errors import RecordError
from mosaic.records import KernelSpec
from mosaic.testing import LanguagePluginTests
from mosaic_target_cutlass import build, gemm
from mosaic_target_cutlass.backend import CutlassBackend, from_words, to_words
from mosaic_target_cutlass.plugin import LANGUAGE


class TestCutlassPlugin(LanguagePluginTests):
    plugin = "cutlass"
    languages = {"cutlass"}


@pytest.fixture(scope="module")
def h200():
    from mosaic_gpu_hopper.targets import H200

    return H200


def spec(shape=(4096, 4096, 4096), dtype="bf16", **knobs):
    return KernelSpec(family="gemm", shape=dict(zip("mnk", shape, strict=True)), dtype=dtype, language="cutlass",
                      knobs=knobs)


def test_language_is_honest():
    assert LANGUAGE.families == ("gemm", "attention")
    # attention: lowered on the CPU, and captured on a GPU by the device runner (backend.AttentionRunnable)
    assert LANGUAGE.capabilities == {"cpu-lowering", "gemm:cpu-lowering", "gemm:gpu-capture", "attention:cpu-lowering",
                                     "attention:gpu-capture"}
    assert isinstance(LANGUAGE.backend, CutlassBackend)


def test_knobs_validate_at_construction():
    k = gemm.GemmKnobs(tile_m="256", tile_n="192", stages="4", kernel_schedule="pingpong", epilogue_schedule="tma")
    assert (k.tile_m, k.tile_n, k.stages) == (256, 192, 4)
    for bad, field in ((dict(tile_m=96), "tile_m"), (dict(tile_n=100), "tile_n"), (dict(tile_k=16), "tile_k"),
                       (dict(cluster_m=3), "cluster_m"), (dict(stages=1), "stages"), (dict(stages="many"), "stages"),
                       (dict(kernel_schedule="persistent-magic"), "kernel_schedule"),
                       (dict(epilogue_schedule="smem"), "epilogue_schedule")):
        with pytest.raises(RecordError, match=f"GemmKnobs.{field}="):
            gemm.GemmKnobs(**bad)
    with pytest.raises(RecordError, match="known knobs"):
        CutlassBackend()._knobs(spec(tile=128))


@pytest.mark.parametrize("knobs,code", [
    (dict(kernel_schedule="cooperative", tile_m=64), "CUTLASS-COOP-TILE"),
    (dict(kernel_schedule="pingpong", epilogue_schedule="tma-cooperative"), "CUTLASS-EPILOGUE"),
    (dict(kernel_schedule="auto", epilogue_schedule="tma"), "CUTLASS-EPILOGUE"),
    (dict(kernel_schedule="tma-ws", epilogue_schedule="tma", tile_scheduler="persistent"), "CUTLASS-SCHEDULER"),
    (dict(kernel_schedule="pingpong", epilogue_schedule="tma", tile_scheduler="stream-k"), "CUTLASS-STREAMK"),
    (dict(tile_n=256, stages=12), "CUTLASS-SMEM"),
])
def test_unbuildable_combinations_are_reported_without_compiling(knobs, code, h200):
    with pytest.raises(Unbuildable, match=code):
        CutlassBackend().source(spec(**knobs), h200)


def test_shape_dtype_and_cluster_rules(h200):
    import attrs

    probs = gemm.problems(gemm.GemmKnobs(cluster_m=4, cluster_n=4), spec((4096, 4100, 4096), "f32"),
                          attrs.evolve(h200, max_cluster_size=8))
    assert {d.code for d in probs} == {"CUTLASS-DTYPE", "CUTLASS-ALIGN", "CUTLASS-CLUSTER"}


def test_render_substitutes_every_knob(h200):
    src = CutlassBackend().source(spec(tile_n=256, cluster_m=2, stages=3, kernel_schedule="pingpong",
                                       epilogue_schedule="tma", tile_m=64), h200)
    assert not re.search(r"\{\{[A-Z_]+\}\}", src)
    assert "Shape<_64, _256, _64>" in src and "Shape<_2, _1, _1>" in src
    assert "KernelTmaWarpSpecializedPingpong" in src and "StageCount<3>" in src
    assert "using Element = cutlass::bfloat16_t" in src
    half = CutlassBackend().source(spec(dtype="f16"), h200)
    assert "using Element = cutlass::half_t" in half and "StageCountAutoCarveout" in half
    assert "KernelTmaWarpSpecializedCooperative" in half and "TmaWarpSpecializedCooperative;" in half


def test_ptxas_log_parsing():
    log = ("ptxas info    : Compiling entry function '_Zk' for 'sm_90a'\n"
           "    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 2 barriers, 16 bytes smem, 904 bytes cmem[0]\n")
    r = build.parse_ptxas(log)
    assert (r.registers, r.spill_stores, r.spill_loads, r.static_smem, r.constant_bytes) == (168, 8, 4, 16, 904)
    with pytest.raises(Unbuildable):
        build.parse_ptxas("nothing here")


def test_16_bit_words_round_trip():
    x = np.array([[1.0, -2.5, 0.0078125, 2.0**127]], np.float32)
    for dt in ("bf16", "f16"):
        vals = x if dt == "bf16" else x[:, :3]
        assert np.array_equal(from_words(to_words(vals, dt), dt), vals)
    assert to_words(np.array([1.0], np.float32), "bf16").tolist() == [0x3F80]
    with pytest.raises(Exception, match="not representable in bf16"):
        to_words(np.array([1.001], np.float32), "bf16")


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA 12.3+) is not on PATH")


@needs_nvcc
def test_compile_error_is_unbuildable_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    with pytest.raises(Unbuildable, match="nvcc failed: .*error"):
        build.build("this is not C++;\n")
    with pytest.raises(Unbuildable, match=r"nvcc failed \(cached\)"):
        build.build("this is not C++;\n")


def _check_lowered(bundle_path, tile):
    from mosaic.bundle import load_bundle

    b = load_bundle(bundle_path)
    assert b.manifest["capture"]["status"] == "lowered"
    ptx, sass = b.read_text("ptx"), b.read_text("sass")
    assert ".target sm_90a" in ptx and ".entry _ZN7cutlass13device_kernel" in ptx
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx  # WGMMA fed by TMA
    assert "HGMMA" in sass and "UTMALDG" in sass
    assert f"Shape<_{tile[0]}, _{tile[1]}, _{tile[2]}>" in b.read_text("source")
    low = b.read_json("metrics")
    assert 0 < low["resources"]["registers"] <= 255 and low["resources"]["spill_stores"] == 0
    notes = dict(n.split(" ", 1) for n in low["notes"] if n.split(" ")[0] in ("smem_bytes", "threads_per_block"))
    assert 0 < int(notes["smem_bytes"]) <= 227 * 1024 and int(notes["threads_per_block"]) == 384
    assert b.arrays("outputs") == {} and b.read_json("timings") is None
    assert b.manifest["toolchain"]["cutlass"] == "4.2.0"


@pytest.mark.slow
@needs_nvcc
def test_lower_only_capture_cooperative(tmp_path):
    """About a minute of nvcc (cached under $MOSAIC_CACHE_DIR afterwards); the device script's first config."""
    s = spec(kernel_schedule="cooperative", epilogue_schedule="tma-cooperative", tile_m=128, tile_n=128,
             tile_k=64, cluster_m=1, cluster_n=2)
    r = capture(s, "h200", tmp_path / "coop.bundle", CaptureOptions(lower_only=True, timeout=1500))
    assert r.status == "lowered", r.message
    _check_lowered(r.bundle, (128, 128, 64))


@pytest.mark.slow
@needs_nvcc
def test_lower_only_capture_pingpong_through_the_cli(tmp_path):
    """About a minute of nvcc; through `mosaic capture --lower-only` (the device script's third config)."""
    out = tmp_path / "pp.bundle"
    knobs = dict(kernel_schedule="pingpong", epilogue_schedule="tma", tile_m=64, tile_n=128, tile_k=64,
                 cluster_m=1, cluster_n=1, stages=4)
    env = {**os.environ, "MOSAIC_LOAD_PLUGINS": "hopper,cutlass"}
    p = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "capture", "--lang", "cutlass",
                        "--family", "gemm", "--shape", "4096x4096x4096", "--dtype", "bf16", "--lower-only",
                        "-o", str(out), *[f"--knob={k}={v}" for k, v in knobs.items()]],
                       capture_output=True, text=True, env=env, timeout=1600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("lowered: ")
    _check_lowered(out, (64, 128, 64))
    from mosaic.bundle import load_bundle

    assert "StageCount<4>" in load_bundle(out).read_text("source")
