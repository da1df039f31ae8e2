"""benchmarks/pallas_copy_ceiling.py on the CPU: the rmsnorm template's pipeline with its arithmetic removed
(``rowwise.build(block_body="copy" | "store")``) lowers for the cuda platform at the issue's shape with the
template's own shared-memory buffers (less the reduction scratch); it writes y == x bit for bit in jax's GPU
interpreter (race detector on, the output buffer poisoned with NaN) on the configurations the benchmark times;
``store`` is refused where there is no in-place stage; and the CLI refuses a bad ``--only`` in one line, exit 2,
before any GPU work. The template's own kernels (``block_body="family"``, the default) stay covered by
test_rmsnorm_softmax_lowering.py and test_rowwise_interpreter.py."""

import importlib
import subprocess
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
from mosaic.backend import Unbuildable
from mosaic_target_pallas.rowwise_knobs import REDUCTION_SCRATCH, RmsnormKnobs

pytest.importorskip("jax", minversion="0.11.2",
                    reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))
M = importlib.import_module("pallas_copy_ceiling")
BASE = attrs.asdict(RmsnormKnobs())
IN_PLACE = {**BASE, "max_concurrent_steps": 3, "out_slots": 0}


@pytest.fixture(scope="module")
def h200():
    from mosaic.plugins import PluginHost

    return PluginHost(allow="hopper").load().get("gpus", "h200")


@pytest.mark.parametrize("knobs,block_body", [(BASE, "copy"), (IN_PLACE, "copy"), (IN_PLACE, "store")],
                         ids=["defaults-copy", "in-place-copy", "in-place-store"])
def test_the_copy_variant_lowers_for_cuda_at_the_issue_shape(knobs, block_body, tmp_path, h200):
    low = M.lower_copy(knobs, 16384, 8192, h200, tmp_path, block_body=block_body)
    text = low.source.read_text()
    assert "mosaic_gpu" in text and "stablehlo.custom_call" in text
    smem = int(next(n for n in low.notes if n.startswith("smem_bytes=")).split("=")[1])
    # the rmsnorm template's buffers at these knobs (stages, output slots, the weight row, barriers), less the
    # cross-warp reduction scratch that Mosaic GPU reserves only for a kernel that reduces
    assert smem == RmsnormKnobs(**knobs).smem_bytes(8192, 2, weight=True) - REDUCTION_SCRATCH


def _interpret(knobs, block_body, rows, cols, seed=0):
    import jax.numpy as jnp
    from mosaic_target_pallas import interpret

    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((rows, cols), dtype=np.float32), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((cols,), dtype=np.float32), jnp.bfloat16)
    fn = M.copy_fn(knobs, rows, cols, jnp.bfloat16, block_body, into=True)
    res = interpret.run(fn, x, w, jnp.full((rows, cols), jnp.nan, jnp.bfloat16))
    y = np.asarray(res.outputs[0], dtype=jnp.bfloat16)
    return np.asarray(x).view(np.uint16), y.view(np.uint16), res.races_found


@pytest.mark.parametrize("edit,block_body", [
    ({}, "copy"),
    ({"max_concurrent_steps": 3, "out_slots": 0}, "copy"),
    ({"max_concurrent_steps": 3, "out_slots": 0}, "store"),
    ({"block_rows": 2, "vector": 4, "out_slots": 0}, "copy"),
    ({"block_rows": 2, "vector": 4, "out_slots": 0}, "store"),
    ({"out_slots": 2, "block_rows": 8, "tma_cols": 64, "vector": 2}, "copy"),
    ({"copy": "direct"}, "copy"),
    ({"copy": "tma_in", "block_rows": 2, "vector": 4}, "copy"),
], ids=lambda v: str(v))
def test_the_copy_writes_x_bit_for_bit_without_races(edit, block_body):
    knobs = {**BASE, **edit}
    per_cta = knobs["block_rows"] * knobs["blocks_per_cta"]
    x, y, races = _interpret(knobs, block_body, 2 * per_cta, 512)
    assert np.array_equal(x, y)
    assert races is False


def test_store_needs_an_in_place_tma_stage():
    import jax.numpy as jnp

    for knobs in (BASE, {**BASE, "copy": "direct"}):
        with pytest.raises(Unbuildable, match=r"block_body='store' stores the staged block itself") as e:
            M.copy_fn(knobs, 1024, 512, jnp.bfloat16, "store")
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown block_body"):
        M.copy_fn(BASE, 1024, 512, jnp.bfloat16, "nothing")


def test_the_default_configurations_fit_the_issue_shape(h200):
    got = M.parse_configs(M.DEFAULT_ONLY, RmsnormKnobs, 16384, 8192, h200, "bf16")
    assert got[0] == BASE and len(got) == len(M.DEFAULT_ONLY.split(";"))


@pytest.mark.parametrize("only,says", [("defaults;tma_cols=100", "tma_cols=100"),
                                       ("bogus=1", "is not knob=value"),
                                       ("block_rows=8", "[smem-per-block]")])
def test_the_cli_refuses_a_bad_only_before_any_gpu_work(only, says):
    p = subprocess.run([sys.executable, str(BENCH / "pallas_copy_ceiling.py"), "--only", only],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pallas_copy_ceiling.py: error:") and says in lines[0]


def test_overlap_count():
    from types import SimpleNamespace as NS

    a = NS(starts_ns=(0, 100), ends_ns=(10, 110))
    b = NS(starts_ns=(20, 105), ends_ns=(30, 120))
    assert M.overlaps([a, b]) == [1, 1]
