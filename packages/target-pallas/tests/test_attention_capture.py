"""`mosaic capture --lang pallas --family attention` reaches the backend on a machine without a GPU: the knobs arrive
as strings from the command line and the knob class converts them (``--knob causal=true`` is the bool True, not
the error "'causal' must be <class 'bool'>"), a causal knob that contradicts the problem is refused by the
backend's lowering with one line, and without jax's CUDA plugin the lowering says that it needs it (jax's
attention_mgpu asserts it before it traces). The GPU half: test_attention_gpu.py."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312")
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
SHAPE = "batch=1,seq=256,heads=2,head_dim=64"


def capture(tmp_path, shape, *knobs):
    args = [a for k in knobs for a in ("--knob", k)]
    p = subprocess.run([*MOSAIC, "capture", "--lang", "pallas", "--family", "attention", "--shape", shape,
                        "--dtype", "bf16", *args, "--lower-only", "--json", "-o", str(tmp_path / "a.bundle")],
                       capture_output=True, text=True, timeout=600)
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    return p


def test_knob_strings_from_the_command_line_are_converted():
    from mosaic_target_pallas.knobs import AttentionKnobs, GemmKnobs

    assert AttentionKnobs(causal="true", block_q="128", use_schedule_barrier="0") == AttentionKnobs(
        causal=True, block_q=128, use_schedule_barrier=False)
    assert GemmKnobs(tile_m="256", epi_tile_m="none", persistent="True", cluster_dimension="None") == GemmKnobs(
        tile_m=256, epi_tile_m=None, persistent=True, cluster_dimension=None)


def test_a_bad_bool_knob_is_one_line(tmp_path):
    p = capture(tmp_path, SHAPE, "causal=maybe")
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error:") and "causal='maybe' is invalid: must be true or false" in lines[0], lines


def test_a_causal_knob_contradicting_the_problem_is_refused_by_the_backend(tmp_path):
    p = capture(tmp_path, SHAPE, "causal=true")
    r = json.loads(p.stdout)
    assert p.returncode != 0 and r["status"] == "failed", r
    assert "attention knob causal=True contradicts the problem (causal=0)" in r["message"], r


def test_without_the_cuda_plugin_the_lowering_says_so(tmp_path):
    from mosaic_target_pallas.backend import jax_has_cuda_plugin

    if jax_has_cuda_plugin():
        pytest.skip("jax's CUDA plugin is installed: attention lowers here (test_attention_gpu.py)")
    p = capture(tmp_path, SHAPE + ",causal=1", "causal=true", "block_q=128")  # knobs agree with the problem
    r = json.loads(p.stdout)
    assert p.returncode != 0 and r["status"] == "unbuildable", r
    assert "attention_mgpu needs jax's CUDA plugin" in r["message"], r
