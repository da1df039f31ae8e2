"""Pallas Mosaic GPU kernel files through `mosaic capture --file --lang pallas` on the CPU: the shipped example
(examples/kernels/pallas/rmsnorm.py) traces and lowers for the cuda platform (the Mosaic GPU module is built)
into a bundle holding the file and its SHA-256, its shared memory checked against the H200 record; a knob
reaches the kernel (the pipeline's shared memory scales with block_cols); a refused knob, a shape the file
refuses and a kernel Mosaic GPU cannot lower are one error line, exit 2. On a GPU (marked gpu) it passes the
rmsnorm oracle and is timed, with PTX/SASS from the GPU compile."""

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle

pytest.importorskip("jax", reason="needs jax 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "pallas" / "rmsnorm.py"


def mosaic(*args, cwd, timeout=900):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def lower(path, *knobs, cwd, out="p.bundle", shape="4096x8192"):
    return mosaic("capture", "--file", str(path), "--lang", "pallas", "--family", "rmsnorm", "--shape", shape,
                  "--dtype", "bf16", *knobs, "--lower-only", "-o", out, "--force", cwd=cwd)


def smem(bundle: Path) -> int:
    log = (bundle / "capture.log").read_text()
    return int(re.search(r"smem_bytes=(\d+)", log).group(1))


def test_pallas_rmsnorm_file_lowers_on_the_cpu(tmp_path):
    for cols in (128, 256):
        p = lower(EXAMPLE, "--knob", f"block_cols={cols}", cwd=tmp_path, out=f"p{cols}.bundle")
        assert p.returncode == 0, p.stdout + p.stderr
        b = load_bundle(tmp_path / f"p{cols}.bundle")
        assert b.manifest["capture"]["status"] == "lowered" and b.kernel.knobs["block_cols"] == cols
        assert b.one("source").read_bytes() == EXAMPLE.read_bytes()
        assert b.manifest["kernel_file"]["sha256"] == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
        assert 0 < smem(tmp_path / f"p{cols}.bundle") <= 232448


def test_knobs_reach_the_lowered_module(tmp_path):
    """The backend (as the child runs it): each block_cols gives another Mosaic GPU module."""
    from mosaic.kernel_files import read_kernel_file
    from mosaic.plugins import PluginHost
    from mosaic.records import KernelSpec
    from mosaic_target_pallas.kernel_file import PallasFileBackend

    gpu = PluginHost(allow="hopper").load().get("gpus", "h200")
    texts = {}
    for cols in (128, 256):
        spec = KernelSpec(family="rmsnorm", shape={"rows": 64, "cols": 1024}, dtype="bf16", language="pallas",
                          knobs={"block_cols": cols}, name="rmsnorm.py")
        backend = PallasFileBackend(read_kernel_file(EXAMPLE))
        backend.check(spec)
        lowered = backend.lower(spec, gpu, tmp_path / str(cols))
        assert lowered.source.read_bytes() == EXAMPLE.read_bytes()
        texts[cols] = (tmp_path / str(cols) / "rmsnorm.stablehlo.mlir").read_text()
        assert "mosaic_gpu" in texts[cols]
    assert texts[128] != texts[256]


def test_broken_pallas_files_are_one_line(tmp_path):
    text = EXAMPLE.read_text()
    (tmp_path / "nolower.py").write_text(text.replace("return total + jnp.sum(xf * xf)",
                                                      "return total + jnp.sum(xf * xf, axis=-1)[0]"))
    cases = [(str(EXAMPLE), ["--knob", "block_cols=300"], "8x1024", r"knob class Knobs refused .*1\.\.256"),
             (str(EXAMPLE), [], "8x1000", r"not a multiple of block_cols=256"),
             ("nolower.py", [], "8x1024", r"Mosaic GPU lowering failed")]
    for name, knobs, shape, pattern in cases:
        p = lower(name, *knobs, cwd=tmp_path, out="bad.bundle", shape=shape)
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), (name, lines)
        assert re.search(pattern, lines[0]) and "Traceback" not in p.stderr, lines[0]


@pytest.mark.gpu
@pytest.mark.slow
def test_pallas_rmsnorm_file_passes_the_oracle_on_the_gpu(tmp_path):
    import jax

    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("needs jax with a CUDA backend and a GPU")
    p = mosaic("capture", "--file", str(EXAMPLE), "--lang", "pallas", "--family", "rmsnorm", "--shape", "4096x8192",
               "--dtype", "bf16", "--blocks", "10", "--runs", "20", "-o", "gpu.bundle", cwd=tmp_path, timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    b = load_bundle(tmp_path / "gpu.bundle")
    s = b.manifest["capture"]["summary"]
    assert s["numerics_pass"] and s["deterministic"] and s["time_ns"] > 0 and b.one("ptx") is not None
    print(f"pallas rmsnorm.py 4096x8192 bf16: {s['time_ns'] / 1e3:.1f} us, noise {s.get('noise_ns')}")
