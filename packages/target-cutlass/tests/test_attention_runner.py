"""The CUTLASS attention's device runner (``CutlassBackend.prepare`` -> ``backend.AttentionRunnable``) on a machine with
no GPU: what it refuses, each with one line and before anything is compiled (knobs, the template's rules, the inputs
by :data:`attention.INPUT_RULES`, 16-bit representability); the runner's build is the lowering's (the same cache entry)
and its shim's host paths answer without a GPU (the problem checks, the launch grid, and a clear "no usable CUDA
device" from ``mosaic_create``); and ``mosaic capture`` without ``--lower-only`` records that refusal as
``unbuildable`` with that one line. The runner on a GPU: tests/test_attention_gpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mosaic.backend import Unbuildable
from mosaic.errors import BadInput, RecordError
from mosaic.records import KernelSpec
from mosaic_target_cutlass import attention
from mosaic_target_cutlass.attention import AttentionKnobs
from mosaic_target_cutlass.backend import CutlassBackend


def _have_gpu() -> bool:
    from mosaic.gpus import probe_devices

    return bool(probe_devices()[0])


no_gpu = pytest.mark.skipif(_have_gpu(), reason="a CUDA device is visible: the GPU test is test_attention_gpu.py")

SHAPE = {"batch": 1, "seq": 300, "heads": 4, "head_dim": 128}


@pytest.fixture(scope="module")
def h100():
    from mosaic_gpu_hopper.targets import H100_SXM

    return H100_SXM


def _spec(dtype="bf16", knobs=None, **shape):
    return KernelSpec(family="attention", shape={**SHAPE, **shape}, dtype=dtype, language="cutlass",
                      knobs=knobs or {}, name="attn")


def _inputs(spec, values="normal", seed=0):
    from mosaic.families import make_inputs

    return make_inputs(spec, seed, values)


@pytest.fixture
def no_compile(monkeypatch):
    """Any nvcc build in the test fails it: the refusals below come before compiling."""
    def build(self, spec, gpu):
        raise AssertionError("prepare compiled before refusing")

    monkeypatch.setattr(CutlassBackend, "build", build)


def _one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text and text, text
    return text


@pytest.mark.parametrize("knobs,error,match", [
    ({"block_m": 96}, RecordError, "AttentionKnobs.block_m="),
    ({"tile_m": 128}, RecordError, "known knobs: block_m"),
    ({"p_in": "tmem"}, RecordError, "AttentionKnobs.p_in="),
    ({"block_m": 64}, Unbuildable, r"\[CUTLASS-ATT-ROWS\]"),
    ({"stages": 4}, Unbuildable, r"\[CUTLASS-SMEM\]"),
])
def test_bad_knobs_are_refused_in_one_line_before_compiling(knobs, error, match, h100, no_compile):
    spec = _spec(knobs=knobs)
    with pytest.raises(error, match=match) as exc:
        CutlassBackend().prepare(spec, h100, None, _inputs(_spec()))
    _one_line(exc)


@pytest.mark.parametrize("shape,match", [
    ({"kv_heads": 3}, r"\[CUTLASS-ATT-SHAPE\] shape.kv_heads"),
    ({"head_dim": 96}, r"\[CUTLASS-ATT-HEAD-DIM\]"),
])
def test_bad_shapes_are_refused_in_one_line_before_compiling(shape, match, h100, no_compile):
    with pytest.raises(Unbuildable, match=match) as exc:
        CutlassBackend().prepare(_spec(**shape), h100, None, _inputs(_spec()))
    _one_line(exc)


def test_a_blackwell_gpu_and_f32_are_refused(no_compile):
    from mosaic_gpu_blackwell.targets import B200
    from mosaic_gpu_hopper.targets import H200

    with pytest.raises(Unbuildable, match=r"\[CUTLASS-ATT-ARCH\]"):
        CutlassBackend().prepare(_spec(), B200, None, _inputs(_spec()))
    with pytest.raises(Unbuildable, match=r"\[CUTLASS-DTYPE\]"):
        CutlassBackend().prepare(_spec("f32"), H200, None, _inputs(_spec("f32")))


def _without(d, key):
    return {k: v for k, v in d.items() if k != key}


#: (what, spec shape over SHAPE, how the family's inputs are changed, the rule that refuses them, where)
BAD_INPUTS = (
    ("missing k", {}, lambda x: _without(x, "k"), "CUTLASS-ATT-INPUT", "inputs.k"),
    ("an unknown input", {}, lambda x: {**x, "bias": np.zeros(4, np.float32)}, "CUTLASS-ATT-INPUT", "inputs.bias"),
    ("q in (batch, seq, heads, head_dim)", {}, lambda x: {**x, "q": x["q"].transpose(0, 2, 1, 3)},
     "CUTLASS-ATT-INPUT-SHAPE", "inputs.q"),
    ("k with heads, not kv_heads", {"kv_heads": 2},
     lambda x: {**x, "k": np.repeat(x["k"], 2, axis=1)}, "CUTLASS-ATT-INPUT-SHAPE", "inputs.k"),
    ("v of another seq", {}, lambda x: {**x, "v": x["v"][:, :, :-1]}, "CUTLASS-ATT-INPUT-SHAPE", "inputs.v"),
    ("causal inputs of a full problem", {}, lambda x: {**x, "causal": np.array(True)}, "CUTLASS-ATT-INPUT-CAUSAL",
     "inputs.causal"),
    ("full inputs of a causal problem", {"causal": 1}, lambda x: {**x, "causal": np.array(False)},
     "CUTLASS-ATT-INPUT-CAUSAL", "inputs.causal"),
)


@pytest.mark.parametrize("what,shape,change,code,where", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_are_refused_in_one_line_before_compiling(what, shape, change, code, where, h100, no_compile):
    spec = _spec(**shape)
    good = _inputs(spec)
    assert attention.input_problems(spec, good) == []  # the family's own inputs pass every input rule
    bad = change(good)
    assert [d.code for d in attention.input_problems(spec, bad)] == [code]
    with pytest.raises(BadInput, match=rf"\[{code}\] {where}") as exc:
        CutlassBackend().prepare(spec, h100, None, bad)
    assert _one_line(exc).endswith("(attention inputs)")


def test_inputs_not_representable_in_the_dtype_are_refused_naming_the_input(h100, no_compile):
    spec = _spec()
    x = _inputs(spec)
    x["v"] = x["v"] + np.float32(1e-3)  # low float32 bits set: not a bf16 value
    with pytest.raises(BadInput, match="attention input 'v': an input is not representable in bf16") as exc:
        CutlassBackend().prepare(spec, h100, None, x)
    _one_line(exc)


def test_input_rules_are_data_and_every_rule_is_exercised():
    codes = [r.code for r in attention.INPUT_RULES]
    assert len(codes) == len(set(codes)) and all(r.reason and r.fields for r in attention.INPUT_RULES)
    assert {b[3] for b in BAD_INPUTS} == set(codes)
    assert attention.input_shapes(_spec(kv_heads=2)) == {"q": (1, 4, 300, 128), "k": (1, 2, 300, 128),
                                                         "v": (1, 2, 300, 128)}


def test_grid_mirror():
    k = AttentionKnobs(block_m=64, consumer_warpgroups=1)
    assert attention.grid(k, 3, 300, 4) == (5, 4, 3) and attention.grid(AttentionKnobs(), 1, 256, 2) == (2, 2, 1)


# -- the runner's build and its shim's host paths (nvcc; cached) ------------------------------------------------

#: a child's script: mosaic_create for each problem of argv[2] (JSON [[batch, seq, heads, kv_heads], ...]) with zero
#: inputs, as JSON [[rc, message], ...]; a handle that came back is destroyed
CREATE_SCRIPT = ("import ctypes, json, sys\n"
                 "lib = ctypes.CDLL(sys.argv[1])\n"
                 "lib.mosaic_create.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p] * 3 + "
                 "[ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_int]\n"
                 "lib.mosaic_destroy.argtypes = [ctypes.c_void_p]\n"
                 "out = []\n"
                 "for b, s, h, kv in json.loads(sys.argv[2]):\n"
                 "    n = max(1, b * max(h, kv) * max(s, 1) * 128)\n"
                 "    buf = (ctypes.c_uint16 * n)()\n"
                 "    handle, err = ctypes.c_void_p(), ctypes.create_string_buffer(512)\n"
                 "    rc = lib.mosaic_create(b, s, h, kv, buf, buf, buf, ctypes.byref(handle), err, 512)\n"
                 "    if handle.value:\n"
                 "        lib.mosaic_destroy(handle)\n"
                 "    out.append([rc, err.value.decode()])\n"
                 "print(json.dumps(out))\n")


@pytest.fixture(scope="module")
def built(h100, tmp_path_factory):
    spec = _spec(kv_heads=2, causal=1)
    low = CutlassBackend().lower(spec, h100, tmp_path_factory.mktemp("attn"))
    return spec, low, CutlassBackend().build(spec, h100)


@pytest.mark.slow
@pytest.mark.usefixtures("cutlass_build")
def test_the_runner_builds_the_lowered_kernel_and_its_host_paths_answer_without_a_gpu(built):
    from mosaic_target_cutlass.build import run_shim

    spec, low, b = built
    assert low.toolchain["cutlass_build"] == b.key  # prepare's build is the lowering's cache entry
    assert "Config<cutlass::bfloat16_t, 128, 128, 128, 2, 2,\n                                     true, true, true>" \
        in b.source.read_text()
    problems = [[1, 0, 4, 2], [1, 300, 3, 2], [1, 300, 70000, 70000], [1, 300, 4, 2]]
    got = run_shim(b.library, CREATE_SCRIPT, json.dumps(problems))
    assert got[0] == [1, "every dimension must be >= 1"]
    assert got[1] == [2, "kv_heads must divide heads"]
    assert got[2] == [3, "heads and batch are grid dimensions: at most 65535"]
    if _have_gpu():
        assert got[3] == [0, ""]
    else:
        assert got[3][0] == 10 and got[3][1].startswith("no usable CUDA device (cudaGetDeviceCount: "), got[3]
    k = AttentionKnobs()
    grids = [(1, 300, 4), (2, 1, 8), (3, 1000, 32)]
    checked = attention.fragment_check(b.library, grids=grids)
    assert checked["fragment_violations"] == 0
    assert [tuple(g) for g in checked["grids"]] == [attention.grid(k, *g) for g in grids]
    assert f"launch grid=(3, 4, 1) block=384 dynamic_smem={attention.smem_bytes(k, 128)}" in low.notes


@pytest.mark.slow
@pytest.mark.usefixtures("cutlass_build")
@no_gpu
def test_capture_without_a_gpu_is_unbuildable_in_one_line(built, tmp_path):
    """`mosaic capture` (not --lower-only) on this machine: lowered, then prepare's runner refuses with its reason."""
    out = tmp_path / "attn.bundle"
    env = {**os.environ, "MOSAIC_LOAD_PLUGINS": "hopper,cutlass"}
    p = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "capture", "--lang", "cutlass",
                        "--family", "attention", "--shape", "batch=1,seq=300,heads=4,head_dim=128,kv_heads=2,causal=1",
                        "--dtype", "bf16", "--gpu", "h100-sxm", "--json", "-o", str(out)], capture_output=True,
                       text=True, env=env, timeout=1600)
    r = json.loads(p.stdout)
    assert p.returncode == 1 and r["status"] == "unbuildable", (r, p.stderr[-2000:])
    assert r["message"].startswith("CUTLASS attention setup failed (10): no usable CUDA device"), r["message"]
    assert "\n" not in r["message"] and r["summary"]["resources"]["registers"] > 0



def test_the_device_checks_configurations_pass_the_rules_on_an_h100(h100):
    """Every line of tools/attention_capture_configs.txt (the table of test_attention_gpu.py and
    attention_capture_check.sh) is a problem in the family's canonical form and knobs the template's rules build on an
    H100, each line a different configuration."""
    from pathlib import Path

    from mosaic.families.attention import canonical

    table = Path(__file__).resolve().parents[1] / "tools" / "attention_capture_configs.txt"
    rows = [line.split("|") for line in table.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(rows) >= 6 and all(len(r) == 4 for r in rows) and len({r[0] for r in rows}) == len(rows)
    seen = set()
    for name, shape, knobs, dtype in rows:
        dims = {k: int(v) for k, v in (kv.split("=") for kv in shape.split(","))}
        assert canonical(dims) == dims, name  # as the family writes it (no default kv_heads, no causal=0)
        values = dict(kv.split("=") for kv in knobs.split())
        k = AttentionKnobs(**values)
        spec = KernelSpec(family="attention", shape=dims, dtype=dtype, language="cutlass", knobs=values)
        assert attention.problems(k, spec, h100) == [], name
        seen.add((dtype, dims["head_dim"], dims.get("causal", 0), dims.get("kv_heads"), dims["seq"], k))
    assert len(seen) == len(rows)
