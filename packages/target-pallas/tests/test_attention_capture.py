"""`mosaic capture --lang pallas --family attention` reaches the backend on a machine without a GPU: the knobs arrive
as strings from the command line and the knob class converts them (``--knob causal=true`` is the bool True, not
the error "'causal' must be <class 'bool'>"), a causal knob that contradicts the problem is refused by the
backend's lowering with one line, a bf16 problem is refused with one line (jax 0.11.2's attention_mgpu stages its
operands in float16 shared memory: the H200's "Expected dtypes to match but src had type bfloat16 and dst had
type float16"), and without jax's CUDA plugin the lowering says that it needs it.

jax's kernel asserts that plugin only to read the CUDA runtime's version (it refuses causal masks on CUDA 12.8 to
12.9.1, a ptxas miscompilation). With that one query answered (13.0, the H200's runtime) jax's real lowering runs
here: the backend's attention lowering (transposes around attention_mgpu) gives the Mosaic GPU module for f16, and
bf16 fails in jax exactly as on the H200 -- the test says when a jax release lifts that. The GPU half:
test_attention_gpu.py."""

import json
import subprocess
import sys
import types

import pytest

pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312")
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
SHAPE = "batch=1,seq=256,heads=2,head_dim=64"
CUDA_13 = types.SimpleNamespace(cuda_runtime_get_version=lambda: 13000)  # the H200's CUDA runtime, 13.0


def capture(tmp_path, shape, *knobs, dtype="f16"):
    args = [a for k in knobs for a in ("--knob", k)]
    p = subprocess.run([*MOSAIC, "capture", "--lang", "pallas", "--family", "attention", "--shape", shape,
                        "--dtype", dtype, *args, "--lower-only", "--json", "-o", str(tmp_path / "a.bundle")],
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


def test_a_bf16_problem_is_refused_with_one_line(tmp_path):
    # jax's kernel named: a bf16 problem with no kernel knob goes to the project's own (test_attention_project.py)
    r = json.loads(capture(tmp_path, SHAPE, "kernel=jax", dtype="bf16").stdout)
    assert r["status"] == "unbuildable", r
    assert "attention_mgpu forward runs f16 only, not bf16" in r["message"], r


def test_without_the_cuda_plugin_the_lowering_says_so(tmp_path):
    from mosaic_target_pallas.backend import jax_has_cuda_plugin

    if jax_has_cuda_plugin():
        pytest.skip("jax's CUDA plugin is installed: attention lowers here (test_attention_gpu.py)")
    p = capture(tmp_path, SHAPE + ",causal=1", "causal=true", "block_q=128")  # knobs agree with the problem
    r = json.loads(p.stdout)
    assert p.returncode != 0 and r["status"] == "unbuildable", r
    assert "attention_mgpu needs jax's CUDA plugin" in r["message"], r


def _cuda_runtime_answered(monkeypatch):
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am
    from mosaic_target_pallas import backend as be

    monkeypatch.setattr(am, "cuda_versions", CUDA_13)
    monkeypatch.setattr(be, "jax_has_cuda_plugin", lambda: True)
    return am


@pytest.mark.parametrize("shape", ["batch=2,seq=256,heads=4,head_dim=128", "batch=1,seq=256,heads=4,head_dim=64,"
                                   "kv_heads=2,causal=1"])
def test_the_backend_lowers_attention_for_f16(shape, tmp_path, monkeypatch):
    from mosaic.families import parse_shape
    from mosaic.plugins import host
    from mosaic.records import KernelSpec
    from mosaic_target_pallas.backend import PallasBackend

    _cuda_runtime_answered(monkeypatch)
    spec = KernelSpec(family="attention", shape=parse_shape("attention", shape, "--shape"), dtype="f16",
                      language="pallas", knobs={})
    low = PallasBackend().lower(spec, host().get("gpus", "h200"), tmp_path)
    text = low.source.read_text()
    assert "stablehlo.custom_call @mosaic_gpu" in text and "stablehlo.transpose" in text
    assert any(n.startswith("smem_bytes=") and int(n.split("=")[1]) > 0 for n in low.notes), low.notes


def test_jax_attention_mgpu_still_cannot_lower_bf16(monkeypatch):
    """The reason bf16 is refused (ATTENTION_DTYPES): jax's own kernel, lowered for cuda. When this fails because bf16
    lowers, a jax release has fixed it: add bf16 to backend.ATTENTION_DTYPES."""
    import jax
    import jax.numpy as jnp

    am = _cuda_runtime_answered(monkeypatch)
    cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
    shapes = [jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)] * 3
    with pytest.raises(ValueError, match="src had type bfloat16 and dst had type float16"):
        jax.jit(lambda q, k, v: am.attention(q, k, v, cfg)).trace(*shapes).lower(lowering_platforms=("cuda",))
