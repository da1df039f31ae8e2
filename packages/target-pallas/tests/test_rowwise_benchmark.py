"""The CPU-checkable parts of benchmarks/pallas_rowwise.py's short mode: ``--only``/``--configs`` parsed into full knob
sets over the class defaults (refused in one line, exit 2, before any GPU work when a knob is unknown, a value bad or
the set does not fit the shape), and the ``--check rows`` oracle (sampled whole rows plus a scan of every element for
NaN/inf) that passes a right output and fails a wrong one."""

import importlib
import subprocess
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
from mosaic.families import make_inputs
from mosaic.oracle import rmsnorm
from mosaic.oracle.formats import fmt
from mosaic.plugins import host
from mosaic.records import KernelSpec
from mosaic_target_pallas.rowwise_knobs import RmsnormKnobs

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))
M = importlib.import_module("pallas_rowwise")


@pytest.fixture(scope="module")
def h200():
    return host().get("gpus", "h200")


def test_configurations_over_the_defaults(h200):
    got = M.parse_configs("defaults; copy=direct,hold=registers ;block_rows=2,vector=4,out_slots=0\n# note\n",
                          RmsnormKnobs, 16384, 8192, h200, "bf16")
    base = attrs.asdict(RmsnormKnobs())
    assert got[0] == base
    assert got[1] == {**base, "copy": "direct", "hold": "registers"}
    assert got[2] == {**base, "block_rows": 2, "vector": 4, "out_slots": 0}
    assert M.parse_configs("defaults;defaults", RmsnormKnobs, 16384, 8192, h200, "bf16") == [base]


@pytest.mark.parametrize("text, says", [
    ("bogus=1", "is not knob=value with a knob of RmsnormKnobs"),
    ("block_rows", "is not knob=value"),
    ("block_rows=3", "block_rows"),
    ("block_rows=8", "cannot run at 16384x8192: [smem-per-block]"),
    ("max_concurrent_steps=4,blocks_per_cta=2", "[steps-within-cta]"),
    ("", "no configuration given"),
])
def test_a_bad_configuration_is_one_line(text, says, h200):
    with pytest.raises(ValueError) as e:
        M.parse_configs(text, RmsnormKnobs, 16384, 8192, h200, "bf16")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_cli_refuses_before_any_gpu_work():
    p = subprocess.run([sys.executable, str(BENCH / "pallas_rowwise.py"), "--families", "rmsnorm", "--only",
                        "defaults;tma_cols=100"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "tma_cols=100" in p.stderr


def _right(shape=(2048, 256)):
    spec = KernelSpec(family="rmsnorm", shape={"rows": shape[0], "cols": shape[1]}, dtype="bf16", language="pallas",
                      knobs={})
    inputs = make_inputs(spec, 0, "normal")
    y = fmt("bf16").round(rmsnorm.reference(inputs, fmt("bf16"), fmt("bf16"))["y"].expected).astype(np.float32)
    return inputs, y


def test_the_row_sample_oracle():
    inputs, y = _right()
    ok, reason, how = M.row_sample_check("rmsnorm", inputs, {"y": y}, "bf16")
    assert ok and reason == "" and how.startswith(f"{M.SAMPLE_ROWS} sampled rows")
    rows = np.unique(np.linspace(0, y.shape[0] - 1, M.SAMPLE_ROWS).astype(np.int64))
    unsampled = next(r for r in range(y.shape[0]) if r not in set(rows))
    nan = y.copy()
    nan[unsampled, 17] = np.nan  # outside the sample: the scan of every element still finds it
    ok, reason, _ = M.row_sample_check("rmsnorm", inputs, {"y": nan}, "bf16")
    assert not ok and "1 non-finite element(s) in the whole output" in reason
    wrong = y.copy()
    wrong[rows[3], 5] = fmt("bf16").round(np.float64(wrong[rows[3], 5]) * 2 + 1)  # inside the sample
    ok, reason, _ = M.row_sample_check("rmsnorm", inputs, {"y": wrong}, "bf16")
    assert not ok and "outside the guard band" in reason
