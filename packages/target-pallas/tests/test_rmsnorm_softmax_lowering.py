"""The Pallas rmsnorm and softmax kernels lowered on the CPU for the cuda platform (no GPU): every value of the
knob table, made buildable by the dependency table, lowers through the backend at the issue's shape (16384 x
8192 bf16) or, for blocks that do not fit 8192 columns, at the first narrower shape where they fit; the
shared-memory count of the knob class equals Mosaic GPU's; knobs that cannot run are one line; and
`mosaic capture --lower-only` writes a bundle. PTX and SASS exist only after the GPU compile (jax's CPU
jaxlib carries no Mosaic GPU -> PTX passes): test_rmsnorm_gpu.py checks those on the device."""

import json
import subprocess
import sys

import pytest
from mosaic.backend import Unbuildable
from mosaic.records import KernelSpec
from mosaic_target_pallas.rowwise_knobs import ROWWISE_KNOBS, table_configs

pytest.importorskip("jax", minversion="0.11.2",
                    reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")

MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
COLS = (8192, 2048, 512)


@pytest.fixture(scope="module")
def h200():
    from mosaic.plugins import PluginHost

    return PluginHost(allow="hopper").load().get("gpus", "h200")


def _spec(family, cols, knobs, rows=16384, dtype="bf16"):
    return KernelSpec(family=family, shape={"rows": rows, "cols": cols}, dtype=dtype, language="pallas",
                      knobs=knobs, name=f"{family}_t")


def _table(family, gpu):
    """(knob, value, cols, knobs): each table value at the widest shape where it fits."""
    out = {}
    for cols in COLS:
        for knob, value, knobs in table_configs(family, _spec(family, cols, {}), gpu):
            if knobs is not None and (knob, value) not in out:
                out[(knob, value)] = (cols, knobs)
    return [(k, v, cols, knobs) for (k, v), (cols, knobs) in out.items()]


def _cases():
    from mosaic.plugins import PluginHost

    gpu = PluginHost(allow="hopper").load().get("gpus", "h200")
    return [pytest.param(f, k, v, c, kn, id=f"{f}-{k}={v}") for f in ("rmsnorm", "softmax")
            for k, v, c, kn in _table(f, gpu)]


CASES = _cases()


def test_every_table_value_has_a_shape():
    from mosaic_target_pallas.rowwise_knobs import values

    for family in ("rmsnorm", "softmax"):
        found = {(k, v) for f, k, v, *_ in (c.values for c in CASES) if f == family}
        assert found == {(k, v) for k, vals in values(family).items() for v in vals}


@pytest.mark.parametrize("family,knob,value,cols,knobs", CASES)
def test_table_value_lowers_for_cuda(family, knob, value, cols, knobs, tmp_path, h200):
    from mosaic_target_pallas.backend import PallasBackend

    low = PallasBackend().lower(_spec(family, cols, knobs), h200, tmp_path)
    text = low.source.read_text()
    assert "mosaic_gpu" in text and "stablehlo.custom_call" in text
    smem = int(next(n for n in low.notes if n.startswith("smem_bytes=")).split("=")[1])
    assert smem == ROWWISE_KNOBS[family](**knobs).smem_bytes(cols, 2, weight=family == "rmsnorm") <= h200.smem_per_block
    assert low.ptx is None and any("MOSAIC_GPU_DUMP_TO" in n for n in low.notes)


def test_f16_lowers_and_f32_is_refused(tmp_path, h200):
    from mosaic_target_pallas.backend import PallasBackend

    assert PallasBackend().lower(_spec("rmsnorm", 4096, {}, dtype="f16"), h200, tmp_path).source.is_file()
    with pytest.raises(Unbuildable, match="supports dtypes bf16, f16, not f32"):
        PallasBackend().lower(_spec("softmax", 4096, {}, dtype="f32"), h200, tmp_path)


@pytest.mark.parametrize("family,knobs,cols,match", [
    ("rmsnorm", {"block_rows": 8}, 8192, r"^\[smem-per-block\] rmsnorm_t: shared memory 411672 B exceeds h200's 232448 B per block "
     r"\(block_rows=8 x cols=8192, 2 stages \+ 1 output slots\)"),
    ("softmax", {}, 8000, r"^\[PALLAS-ROWS\] cols=8000 is not divisible by tma_cols=256 \(softmax\)$"),
    ("softmax", {"tma_cols": 64}, 8192, r"^\[vector-tiles-box\] vector=8: 32 lanes x vector must divide tma_cols=64"),
    ("rmsnorm", {"blocks_per_cta": 1}, 8192, r"^\[steps-within-cta\] max_concurrent_steps=2 exceeds blocks_per_cta=1"),
])
def test_knobs_that_cannot_run_are_one_line(family, knobs, cols, match, tmp_path, h200):
    from mosaic_target_pallas.backend import PallasBackend

    with pytest.raises(Unbuildable, match=match) as exc:
        PallasBackend().lower(_spec(family, cols, knobs), h200, tmp_path)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("family", ["rmsnorm", "softmax"])
def test_capture_lower_only_at_the_issue_shape(family, tmp_path):
    out = tmp_path / f"{family}.bundle"
    p = subprocess.run([*MOSAIC, "capture", "--lang", "pallas", "--family", family, "--shape", "16384x8192",
                        "--dtype", "bf16", "--lower-only", "--knob", "max_concurrent_steps=1", "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kernel"]["family"] == family and manifest["kernel"]["knobs"] == {"max_concurrent_steps": "1"}
    assert any(f.endswith(".stablehlo.mlir") for f in manifest["files"])  # stored plain or as .xz
    notes = json.loads((out / "lowering.json").read_text())["notes"]
    assert {"block=4x8192 as 32 TMA boxes of 256", "grid=1024 CTAs x 4 blocks", "stages=1", "out_slots=1"} <= set(notes)
    # one stage + one output slot of 4 x 8192 bf16 (+ the weight row for rmsnorm), scratch, barriers
    assert f"smem_bytes={2 * 65536 + 2048 + (16384 + 16 if family == 'rmsnorm' else 8)}" in notes


def test_capture_bad_knob_is_one_line_exit_2(tmp_path):
    p = subprocess.run([*MOSAIC, "capture", "--lang", "pallas", "--family", "softmax", "--shape", "1024x1024",
                        "--dtype", "bf16", "--lower-only", "--knob", "vector=3", "-o", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "error: knobs not valid for pallas softmax: SoftmaxKnobs.vector=3 is invalid: must be a power of two "
        "in [1, 8] (--knob)"]
