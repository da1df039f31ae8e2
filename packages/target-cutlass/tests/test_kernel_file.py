"""CUDA kernel files through `mosaic capture --file --lang cutlass` with the real nvcc: the shipped examples
(examples/kernels/cuda) lower on a machine without a GPU into bundles holding the file (and its SHA-256),
PTX, cubin, SASS, ptxas log and the launch record from the file's own mosaic_geometry; knob values reach
the compiled code; a file that fails nvcc or breaks the calling convention is one error line, exit 2;
`mosaic lift` reads the bundles. On a GPU (marked gpu) both examples pass the oracle and are timed."""

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle
from mosaic.records import KernelSpec
from mosaic.toolchain.cubin import read_cubin
from mosaic.toolchain.nvcc import find_nvcc

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "cuda"
RMSNORM, GEMM = EXAMPLES / "rmsnorm.cu", EXAMPLES / "gemm.cu"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not on PATH")


def mosaic(*args, cwd, timeout=900):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def one_error_line(p) -> str:
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), (p.returncode, lines)
    assert "Traceback" not in p.stderr
    return lines[0]


@needs_nvcc
@pytest.mark.slow
def test_rmsnorm_file_lowers_into_a_bundle(tmp_path):
    p = mosaic("capture", "--file", str(RMSNORM), "--lang", "cutlass", "--family", "rmsnorm", "--shape", "4096x8192",
               "--dtype", "bf16", "--knob", "threads=512", "--lower-only", "-o", "rms.bundle", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    b = load_bundle(tmp_path / "rms.bundle")
    assert b.manifest["capture"]["status"] == "lowered"
    kept = b.one("source")
    assert kept.name == "rmsnorm.cu" and kept.read_bytes() == RMSNORM.read_bytes()
    section = b.manifest["kernel_file"]
    assert section["sha256"] == hashlib.sha256(RMSNORM.read_bytes()).hexdigest() == \
        b.manifest["files"]["source/rmsnorm.cu"]["sha256"]
    assert section["path"] == "rmsnorm.cu" and section["entry"] == "rmsnorm" and section["knob_values"] == {"threads": 512, "unroll": 4, "eps": 1e-6}
    assert b.kernel.knobs == {"threads": 512, "unroll": 4, "eps": 1e-6} and b.kernel.family == "rmsnorm"
    ptx = b.read_text("ptx")
    assert re.search(r"\.entry\s+rmsnorm\(", ptx) and ".maxntid 512" in ptx  # __launch_bounds__(Knobs::threads)
    assert [k.name for k in read_cubin(b.one("cubin").read_bytes())] == ["rmsnorm"]
    assert "SHFL.BFLY" in b.read_text("sass") and "rmsnorm" in b.read_text("ptxas_log")
    launch = b.launch()
    assert (launch.grid, launch.block, launch.dynamic_smem, launch.source) == ((4096, 1, 1), (512, 1, 1), 0, "cubin")
    assert launch.static_smem == 16 * 4 and launch.registers_per_thread > 0  # 16 warps' partial sums
    lift = mosaic("lift", "rms.bundle", "--json", cwd=tmp_path)
    assert lift.returncode == 0, lift.stderr
    fingerprint = json.loads(lift.stdout)
    assert fingerprint["kernel"] == "rmsnorm" and fingerprint["dialect"] == "sass" and fingerprint["loops"]


@needs_nvcc
@pytest.mark.slow
def test_gemm_file_knobs_reach_the_build(tmp_path):
    results = {}
    for label, knobs in (("default", []), ("wide", ["--knob", "tile_m=128", "--knob", "thread_m=8"])):
        p = mosaic("capture", "--file", str(GEMM), "--lang", "cutlass", "--family", "gemm", "--shape", "4096x2048x512",
                   "--dtype", "f16", *knobs, "--lower-only", "-o", f"{label}.bundle", cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        results[label] = load_bundle(tmp_path / f"{label}.bundle")
    d, w = results["default"].launch(), results["wide"].launch()
    assert (d.grid, d.block) == ((32, 64, 1), (256, 1, 1))  # 2048/64 x 4096/64 tiles, 16x16 threads
    assert (w.grid, w.block) == ((32, 32, 1), (256, 1, 1))  # 128-row tiles, 8 rows per thread
    assert d.static_smem == 16 * 65 * 4 * 2 and w.static_smem == 16 * (129 + 65) * 4
    assert results["default"].one("cubin").read_bytes() != results["wide"].one("cubin").read_bytes()
    assert results["wide"].manifest["kernel_file"]["knob_values"]["tile_m"] == 128
    sass = results["default"].read_text("sass")
    assert "FFMA" in sass and "HMMA" not in sass and "HGMMA" not in sass  # float FMAs, no tensor cores


@needs_nvcc
@pytest.mark.slow
def test_files_that_do_not_build_are_one_line(tmp_path):
    text = RMSNORM.read_text()
    (tmp_path / "broken.cu").write_text(text.replace("rsqrtf(partial[0]", "rsqrtf(partial_sum[0]"))
    (tmp_path / "badsig.cu").write_text(text.replace("int rows, int cols) {", "int rows) {\n  int cols = rows;"))
    cases = [("broken.cu", [], r"nvcc failed: broken\.cu\(\d+\): error: identifier \"partial_sum\" is undefined"),
             ("badsig.cu", [], r"does not match the contract .*too many arguments"),
             (str(RMSNORM), ["--knob", "threads=100"], r"static assertion failed .*multiple of 32")]
    for name, knobs, pattern in cases:
        p = mosaic("capture", "--file", name, "--lang", "cutlass", "--family", "rmsnorm", "--shape", "64x256",
                   "--dtype", "bf16", *knobs, "--lower-only", "-o", "x.bundle", "--force", cwd=tmp_path)
        line = one_error_line(p)
        assert re.search(pattern, line), line
        assert "mosaic_shim.cu\"" not in line  # nvcc's "1 error detected in ..." trailer is dropped
        assert json.loads((tmp_path / "x.bundle" / "manifest.json").read_text())["capture"]["status"] == "unbuildable"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("path, family, shape, dtype", [(RMSNORM, "rmsnorm", "4096x8192", "bf16"),
                                                        (GEMM, "gemm", "2048x2048x2048", "bf16")])
def test_file_kernels_pass_the_oracle_on_the_gpu(tmp_path, path, family, shape, dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    p = mosaic("capture", "--file", str(path), "--lang", "cutlass", "--family", family, "--shape", shape,
               "--dtype", dtype, "--blocks", "10", "--runs", "20", "-o", "gpu.bundle", cwd=tmp_path, timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    b = load_bundle(tmp_path / "gpu.bundle")
    s = b.manifest["capture"]["summary"]
    assert s["numerics_pass"] and s["deterministic"] and s["time_ns"] > 0
    print(f"{path.name} {family} {shape} {dtype}: {s['time_ns'] / 1e3:.1f} us, noise {s.get('noise_ns')}, "
          f"launch {s.get('launch')}")


@needs_nvcc
@pytest.mark.slow
def test_source_candidates_build_like_their_file(tmp_path):
    """A proposer's edit of rmsnorm.cu (a unified diff applied strictly) lowers through the same backend; a
    broken edit and a contract-breaking edit are unbuildable candidates with one line, their text kept."""
    from mosaic.capture import CaptureOptions
    from mosaic.kernel_files import lower_source
    from mosaic.records import KernelSpec
    from mosaic.unified_diff import apply_unified_diff, make_unified_diff

    original = RMSNORM.read_text()
    edited = original.replace("static constexpr int unroll = 4;", "static constexpr int unroll = 8;").replace(
        "  float sum = 0.0f;", "  float sum = 0.0f;  // edited by a proposer")
    diff = make_unified_diff(original, edited, "rmsnorm.cu")
    assert apply_unified_diff(original, diff) == edited
    spec = KernelSpec(family="rmsnorm", shape={"rows": 64, "cols": 1024}, dtype="bf16", language="cutlass",
                      name="rmsnorm.cu")
    r = lower_source(spec, apply_unified_diff(original, diff), "h200", tmp_path / "edit.bundle",
                     CaptureOptions(lower_only=True, timeout=600))
    assert r.status == "lowered", r.message
    b = load_bundle(r.bundle)
    assert b.one("source").read_text() == edited and b.kernel.knobs["unroll"] == 8
    assert b.manifest["kernel_file"]["sha256"] == hashlib.sha256(edited.encode()).hexdigest()
    base = lower_source(spec, original, "h200", tmp_path / "base.bundle", CaptureOptions(lower_only=True))
    assert base.status == "lowered" and load_bundle(base.bundle).one("cubin").read_bytes() != b.one("cubin").read_bytes()
    for label, text, pattern in (("broken", edited.replace("rsqrtf(", "rsqrtff("), r'identifier "rsqrtff" is undefined'),
                                 ("contract", edited.replace("// mosaic:entry rmsnorm\n", ""), "no '// mosaic:entry")):
        bad = lower_source(spec, text, "h200", tmp_path / f"{label}.bundle", CaptureOptions(lower_only=True))
        assert bad.status == "unbuildable" and "\n" not in bad.message and re.search(pattern, bad.message), bad.message
        kept = load_bundle(bad.bundle)
        assert kept.one("source").read_text() == text and kept.manifest["capture"]["status"] == "unbuildable"


@needs_nvcc
@pytest.mark.slow
def test_live_build_lowers_a_source_edit(tmp_path):
    """The live workbench's build step (no GPU needed to lower): a proposer's edited gemm.cu is built by the
    kernel-file backend into the candidate's bundle, its text kept, its build recorded ok for the offline
    re-decision; the gate (a GPU step) is not reached here."""
    from mosaic.run.campaign import Campaign
    from mosaic.run.live.parent import LiveWorkbench
    from mosaic.run.workbench import Checked, Kernel, candidate_key

    c = Campaign.from_json({"source": "cutlass", "target": "cutlass", "family": "gemm", "shape": "256x256x128",
                            "dtype": "bf16", "budget_min": 1})
    bench = LiveWorkbench(c, tmp_path, progress=lambda line: None)
    bench._gate = lambda kernel, dest: Checked(kernel.key, False, "the gate runs on a GPU")  # not reached here
    edited = GEMM.read_text().replace("static constexpr int tile_k = 16;", "static constexpr int tile_k = 32;")
    spec = KernelSpec("gemm", {"m": 256, "n": 256, "k": 128}, "bf16", "cutlass",
                      {"tile_m": 128, "kernel_schedule": "pingpong"}, name="gemm.cu")
    k = Kernel(candidate_key(spec, edited), spec, edited)
    assert bench.build(k).ok
    b = load_bundle(bench.dest(k.key))
    assert b.manifest["mosaic_run"]["build"]["ok"] is True and b.one("source").read_text() == edited
    assert b.manifest["kernel_file"]["knob_values"]["tile_m"] == 128 and \
        b.manifest["kernel_file"]["ignored_knobs"] == ["kernel_schedule"]
    assert b.launch() is not None and b.launch().grid == (4, 2, 1)  # 256/64 x 256/128 tiles


@needs_nvcc
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a machine with a GPU runs it for real")
def test_a_file_that_builds_but_cannot_run_here_is_exit_1(tmp_path):
    p = mosaic("capture", "--file", str(RMSNORM), "--lang", "cutlass", "--family", "rmsnorm", "--shape", "64x1024",
               "--dtype", "bf16", "-o", "run.bundle", cwd=tmp_path)
    assert p.returncode == 1 and p.stdout.startswith("unbuildable: ") and "Traceback" not in p.stderr, p.stdout
    b = load_bundle(tmp_path / "run.bundle")
    assert b.one("cubin") is not None and b.one("source").read_bytes() == RMSNORM.read_bytes()
    assert b.manifest["capture"]["lower_only"] is False and b.read_json("timings") is None
