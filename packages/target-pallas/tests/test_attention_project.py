"""The project's own Pallas Mosaic GPU attention forward (``kernels/attention.py``, ``--knob
kernel=project``), on the CPU: it lowers for sm_90a in bf16 and f16 down to Mosaic GPU's NVVM module (wgmma of
the input dtype, TMA, mbarriers, setmaxnreg, ex2.approx), through the backend and through ``mosaic capture
--lower-only``; it runs in jax's GPU interpreter with race detection and passes the family's float64 oracle
(non-causal, causal, GQA, both dtypes, the hard input distributions, the knob variants), race-free; and
planted bugs (no running-max rescale, a dropped or off-by-one causal mask, a wrong GQA head mapping, a loader
that refills a slot still being read) fail.

jax 0.11.2's interpreter runs grids point by point, so the grids here have several CTAs; it does not implement
a wgmma whose A operand is a register array, ``pl.run_state`` over ``plgpu.ACC.init`` nor a store into an
accumulator, so it runs the kernel with ``p_operand=smem, pv_accumulator=fresh`` (the test that pins two of
those limits says when a jax release lifts one); the register/carried variants are checked by lowering.
Its race detector does not track wgmma operand reads (docs/pallas-attention.md).

    .venv312/bin/python -m pytest -q -s packages/target-pallas/tests/test_attention_project.py
"""

import json
import re
import subprocess
import sys

import pytest

pytest.importorskip("jax", minversion="0.11.2",
                    reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from mosaic import oracle  # noqa: E402
from mosaic.errors import RecordError  # noqa: E402
from mosaic.families import get, parse_shape  # noqa: E402
from mosaic.records import KernelSpec  # noqa: E402
from mosaic_target_pallas import interpret  # noqa: E402
from mosaic_target_pallas.kernels import attention  # noqa: E402
from mosaic_target_pallas.knobs import AttentionKnobs  # noqa: E402

MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
JNP = {"bf16": jnp.bfloat16, "f16": jnp.float16}
#: the variant jax's interpreter can run (module docstring)
INTERPRETABLE = {"kernel": "project", "p_operand": "smem", "pv_accumulator": "fresh"}


def _problem(dims: dict) -> attention.AttentionProblem:
    return attention.AttentionProblem(batch=dims["batch"], heads=dims["heads"],
                                      kv_heads=dims.get("kv_heads", dims["heads"]), seq=dims["seq"],
                                      head_dim=dims["head_dim"], causal=bool(dims.get("causal", 0)))


def _args(p: attention.AttentionProblem, dtype: str) -> list:
    q = jax.ShapeDtypeStruct((p.batch, p.heads, p.seq, p.head_dim), JNP[dtype])
    kv = jax.ShapeDtypeStruct((p.batch, p.kv_heads, p.seq, p.head_dim), JNP[dtype])
    return [q, kv, kv]


def interpreted(shape: str, dtype: str = "bf16", values: str = "normal", seed: int = 0, into: bool = False,
                **knobs):
    """Run the kernel in the interpreter on the family's inputs; (oracle verdict, races found)."""
    dims = parse_shape("attention", shape, "--shape")
    kn = AttentionKnobs(**{**INTERPRETABLE, **knobs})
    inputs = get("attention").make_inputs(dims, dtype, seed, values)
    fn = attention.build(kn, _problem(dims), JNP[dtype], into=into)
    args = [jnp.asarray(inputs[x], JNP[dtype]) for x in ("q", "k", "v")]
    if into:  # the kernel writes into a NaN-filled buffer: an element it never writes fails the oracle
        args.append(jnp.full(inputs["q"].shape, jnp.nan, JNP[dtype]))
    r = interpret.run(fn, *args)
    verdict = oracle.check("attention", inputs, {"o": r.outputs[0]}, dtype)
    return verdict, r.races_found


def _figures(label: str, verdict) -> str:
    o = verdict.outputs[0]
    return f"{label}: passed={verdict.passed} {o.summary()} ({o.failures}/{o.elements} outside the band)"


# -- the oracle in the interpreter -------------------------------------------------------------------------

PROBLEMS = {
    "plain": "batch=1,seq=256,heads=2,head_dim=64",
    "causal": "batch=1,seq=256,heads=2,head_dim=64,causal=1",
    "gqa": "batch=2,seq=256,heads=4,head_dim=64,kv_heads=2",
    "causal-gqa": "batch=1,seq=256,heads=4,head_dim=64,kv_heads=1,causal=1",
}


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", list(PROBLEMS))
def test_the_kernel_passes_the_oracle_race_free_in_the_interpreter(case, dtype):
    verdict, races = interpreted(PROBLEMS[case], dtype)
    print("\n" + _figures(f"{case} {dtype}", verdict))
    assert races is False
    assert verdict.passed, verdict.reason
    assert verdict.outputs[0].max_error_over_band < 1.0


@pytest.mark.parametrize("shape,knobs", [
    ("batch=1,seq=256,heads=2,head_dim=64,causal=1", {"compute_wgs": 1}),
    ("batch=1,seq=256,heads=2,head_dim=64,causal=1", {"use_schedule_barrier": False}),
    # 4 key blocks through a ring of 3 (slots reused), causal skipping with two query blocks per key block
    ("batch=1,seq=512,heads=1,head_dim=64,causal=1", {"block_kv": 128, "max_concurrent_steps": 3}),
    ("batch=1,seq=256,heads=2,head_dim=128,kv_heads=1,causal=1", {"block_q": 128, "compute_wgs": 1}),
    ("batch=1,seq=256,heads=1,head_dim=256", {"compute_wgs": 1, "max_concurrent_steps": 4}),
], ids=["one-compute-wg", "no-schedule-barrier", "ring3-bkv128", "bq128-d128", "d256-ring4"])
def test_the_knob_variants_pass_the_oracle_race_free(shape, knobs):
    verdict, races = interpreted(shape, "bf16", **knobs)
    print("\n" + _figures(f"{knobs}", verdict))
    assert races is False
    assert verdict.passed, verdict.reason


@pytest.mark.parametrize("dtype,values", [("bf16", "large"), ("f16", "large"), ("bf16", "equal-rows"),
                                          ("f16", "denormal"), ("bf16", "int")])
def test_the_hard_inputs_pass_the_oracle(dtype, values):
    """``large``: scores offset by +-512, beyond exp's range unless the running max is subtracted;
    ``denormal``: f16 subnormal values, which a kernel that flushes them fails; ``int``: small integers, large
    scores. (f16
    ``int`` is not here: its nearly one-hot rows give probabilities below f16's normal range, and P rounded to
    f16 there loses more than the oracle's band allows; a float32 NumPy run of the same recipe fails the
    same way -- docs/pallas-attention.md.)"""
    verdict, races = interpreted("batch=1,seq=256,heads=2,head_dim=64,causal=1", dtype, values)
    print("\n" + _figures(f"{values} {dtype}", verdict))
    assert races is False
    assert verdict.passed, verdict.reason


def test_the_kernel_writes_every_element_of_the_callers_buffer():
    """``into=True`` (what ``prepare`` runs on the GPU): the output buffer is NaN-filled; any element the
    kernel does not write stays NaN and fails the oracle."""
    verdict, races = interpreted("batch=1,seq=256,heads=4,head_dim=64,kv_heads=2,causal=1", "bf16", into=True)
    assert races is False
    assert verdict.passed and verdict.outputs[0].nonfinite == 0, verdict.reason


# -- planted bugs must fail ---------------------------------------------------------------------------------

def _no_rescale(m, total, acc, s, c):
    """The online softmax without the rescale of acc and the running sum when the maximum grows."""
    from jax import lax

    m_new = jnp.maximum(m, s.max(axis=1) * c)
    p = jnp.exp2(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))
    return m_new, total + p.sum(axis=1), acc, p


def _strict_mask(s, q_row0, k_col0):
    """Off by one: a query no longer sees its own key."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    rows = q_row0 + plgpu.broadcasted_iota(jnp.int32, s.shape, 0, layout=plgpu.Layout.WGMMA)
    cols = k_col0 + plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA)
    return jnp.where(cols < rows, s, -jnp.inf)


def _interleaved_heads(head, group):
    """q head h reads kv head h % kv_heads (here 2) instead of h // group."""
    from jax import lax

    return lax.rem(head, jnp.int32(2))


@pytest.mark.parametrize("name,replacement,shape", [
    ("online_softmax", _no_rescale, "batch=1,seq=256,heads=2,head_dim=64"),
    ("causal_mask", lambda s, q_row0, k_col0: s, "batch=1,seq=256,heads=2,head_dim=64,causal=1"),
    ("causal_mask", _strict_mask, "batch=1,seq=256,heads=2,head_dim=64,causal=1"),
    ("kv_head_of", _interleaved_heads, "batch=1,seq=128,heads=4,head_dim=64,kv_heads=2"),
], ids=["no-rescale", "dropped-mask", "off-by-one-mask", "gqa-mapping"])
def test_a_planted_bug_fails_the_oracle(name, replacement, shape, monkeypatch):
    good, _ = interpreted(shape, "bf16")
    assert good.passed, good.reason  # the same problem passes with the kernel's own function
    monkeypatch.setattr(attention, name, replacement)
    verdict, _ = interpreted(shape, "bf16")
    print("\n" + _figures(f"planted {name}", verdict))
    assert not verdict.passed and verdict.outputs[0].failures > 0.01 * verdict.outputs[0].elements


def _races_of_a_run(fn, *args) -> tuple[bool, Exception | None]:
    """(races found, the error the run ended with): ``interpret.run`` without losing the race flag when the
    interpreter also fails the run (a barrier phase nobody observed)."""
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
    from jax.experimental.pallas import mosaic_gpu as plgpu

    gpu_callbacks.reset_gpu_interpret_mode_state()
    error = None
    try:
        with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams(detect_races=True)):
            try:
                jax.block_until_ready(jax.jit(fn)(*args))
            except Exception as exc:  # noqa: BLE001 -- returned to the test
                error = exc
        return bool(gpu_callbacks.get_races().races_found), error
    finally:
        gpu_callbacks.reset_gpu_interpret_mode_state()


def test_a_loader_that_refills_a_slot_still_being_read_is_a_race(monkeypatch):
    dims = parse_shape("attention", "batch=1,seq=512,heads=1,head_dim=64", "--shape")
    inputs = get("attention").make_inputs(dims, "bf16", 0, "normal")
    args = [jnp.asarray(inputs[x], jnp.bfloat16) for x in ("q", "k", "v")]
    fn = attention.build(AttentionKnobs(**INTERPRETABLE), _problem(dims), jnp.bfloat16)
    assert _races_of_a_run(fn, *args) == (False, None)
    monkeypatch.setattr(attention, "wait_slot_free", lambda empty, slot: None)
    fn = attention.build(AttentionKnobs(**INTERPRETABLE), _problem(dims), jnp.bfloat16)
    races, _ = _races_of_a_run(fn, *args)
    assert races is True


@pytest.mark.parametrize("p_operand,pv_accumulator,error", [
    ("registers", "fresh", r"Expected shape \(6,\) but got \(64, 64\)"),  # wgmma A from registers
    ("smem", "carried", r"Cannot lower jaxpr with effects"),  # pl.run_state over plgpu.ACC.init
])
def test_what_the_interpreter_cannot_run(p_operand, pv_accumulator, error):
    """Pins jax 0.11.2's interpreter limits that keep the GPU-default variant out of it. When this fails
    because the run passes, a jax release has lifted the limit: run the oracle tests above on that variant."""
    dims = parse_shape("attention", "batch=1,seq=128,heads=1,head_dim=64", "--shape")
    fn = attention.build(AttentionKnobs(kernel="project", p_operand=p_operand, pv_accumulator=pv_accumulator),
                         _problem(dims), jnp.bfloat16)
    x = jnp.zeros((1, 1, 128, 64), jnp.bfloat16)
    with pytest.raises(Exception, match=error):
        interpret.run(fn, x, x, x)


# -- lowering for sm_90a on the CPU ------------------------------------------------------------------------

@pytest.fixture
def mosaic_modules(monkeypatch):
    """The Mosaic GPU modules (NVVM/LLVM dialect text) lowered while the fixture is active."""
    from jax.experimental.mosaic.gpu import core as mgpu_core

    texts = []
    serde = mgpu_core._run_serde_pass

    def spy(module, **kw):
        if kw.get("serialize"):
            texts.append(str(module))
        return serde(module, **kw)

    monkeypatch.setattr(mgpu_core, "_run_serde_pass", spy)
    return texts


def _gpu():
    from mosaic.plugins import host

    return host().get("gpus", "h200")


LOWERINGS = [
    ("batch=1,seq=512,heads=2,head_dim=128", {}),
    ("batch=2,seq=1024,heads=8,head_dim=128,kv_heads=2,causal=1", {"block_kv": 128}),
    ("batch=1,seq=512,heads=2,head_dim=64,causal=1", {"compute_wgs": 1, "max_concurrent_steps": 4}),
    ("batch=1,seq=512,heads=4,head_dim=128,kv_heads=1", {"p_operand": "smem", "pv_accumulator": "fresh"}),
    ("batch=1,seq=512,heads=2,head_dim=256", {"use_schedule_barrier": False, "block_q": 64}),
]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("shape,knobs", LOWERINGS, ids=[f"{s}|{k}" for s, k in LOWERINGS])
def test_the_backend_lowers_the_kernel_for_sm90a(shape, knobs, dtype, tmp_path, mosaic_modules):
    """The StableHLO holds one mosaic_gpu custom call on the family's layout (no transposes); the Mosaic GPU
    module behind it holds the two wgmma shapes in the input dtype (S = Q K^T: m64 n<block_kv>; P V: m64
    n<head_dim>), the TMA loads, the mbarrier waits, setmaxnreg with two compute warpgroups, ex2.approx."""
    from mosaic_target_pallas.backend import PallasBackend

    dims = parse_shape("attention", shape, "--shape")
    spec = KernelSpec(family="attention", shape=dims, dtype=dtype, language="pallas",
                      knobs={"kernel": "project", **knobs})
    low = PallasBackend().lower(spec, _gpu(), tmp_path)
    text = low.source.read_text()
    assert text.count("stablehlo.custom_call @mosaic_gpu") == 1 and "stablehlo.transpose" not in text
    smem = int(next(n for n in low.notes if n.startswith("smem_bytes=")).split("=")[1])
    kn = AttentionKnobs(kernel="project", **knobs)
    assert attention.smem_bytes(kn, dims["head_dim"], dims["seq"]) <= smem <= _gpu().smem_per_block
    module = mosaic_modules[-1]
    t = {"bf16": "bf16", "f16": "f16"}[dtype]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{kn.block_kv}k16\.f32\.{t}\.{t}", module)
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{dims['head_dim']}k16\.f32\.{t}\.{t}", module)
    other = {"bf16": "f16", "f16": "bf16"}[dtype]
    assert f".f32.{other}.{other}" not in module  # nothing is staged in the other 16-bit type
    assert "cp.async.bulk.tensor" in module and "mbarrier.try_wait.parity" in module
    assert "ex2.approx" in module
    assert ("setmaxnreg.inc" in module) == (kn.compute_wgs == 2)


def test_the_shared_memory_budget_refuses_an_oversized_ring(tmp_path):
    from mosaic.backend import Unbuildable
    from mosaic_target_pallas.backend import PallasBackend

    dims = parse_shape("attention", "batch=1,seq=1024,heads=2,head_dim=128", "--shape")
    spec = KernelSpec(family="attention", shape=dims, dtype="bf16", language="pallas",
                      knobs={"kernel": "project", "block_q": 128, "block_kv": 128, "max_concurrent_steps": 3})
    over = r"\[smem-per-block\] .*shared memory \d+ B exceeds h200's 232448 B"
    with pytest.raises(Unbuildable, match=over):
        PallasBackend().lower(spec, _gpu(), tmp_path)


@pytest.mark.parametrize("shape,dtype,message", [
    ("batch=1,seq=192,heads=2,head_dim=64", "bf16", "seq=192 must be a multiple of compute_wgs*block_q=128"),
    ("batch=1,seq=256,heads=2,head_dim=96", "bf16", "head_dim=96 must be a multiple of 64"),
    ("batch=1,seq=256,heads=2,head_dim=64", "f32", "pallas attention supports dtypes bf16, f16, not f32"),
])
def test_a_problem_the_kernel_cannot_run_is_unbuildable_with_a_reason(shape, dtype, message, tmp_path):
    from mosaic.backend import Unbuildable
    from mosaic_target_pallas.backend import PallasBackend

    spec = KernelSpec(family="attention", shape=parse_shape("attention", shape, "--shape"), dtype=dtype,
                      language="pallas", knobs={"kernel": "project"})
    with pytest.raises(Unbuildable, match=re.escape(message)) as exc:
        PallasBackend().lower(spec, _gpu(), tmp_path)
    assert "\n" not in str(exc.value)


# -- knobs and the command line -----------------------------------------------------------------------------

def test_the_kernel_knob_defaults_by_dtype_and_checks_the_other_kernels_knobs():
    assert AttentionKnobs().resolved("bf16").kernel == "project"
    assert AttentionKnobs().resolved("f16").kernel == "jax"
    assert AttentionKnobs(kernel="jax").resolved("bf16").kernel == "jax"
    from_strings = AttentionKnobs(kernel="none", compute_wgs="1", p_operand="smem", approx_math="false")
    assert from_strings == AttentionKnobs(kernel=None, compute_wgs=1, p_operand="smem", approx_math=False)
    with pytest.raises(RecordError, match=r"compute_wgs=1 is invalid: must be 2: .* kernel='jax'"):
        AttentionKnobs(compute_wgs=1).resolved("f16")
    with pytest.raises(RecordError, match=r"pv_accumulator='fresh' is invalid: must be 'carried'"):
        AttentionKnobs(kernel="jax", pv_accumulator="fresh")
    with pytest.raises(RecordError, match=r"use_schedule_barrier=False is invalid: must be True: .*wgs=1"):
        AttentionKnobs(kernel="project", compute_wgs=1, use_schedule_barrier=False)
    with pytest.raises(RecordError, match=r"kernel='triton' is invalid: must be None or one of project, jax"):
        AttentionKnobs(kernel="triton")


def capture(tmp_path, shape, *knobs, dtype="bf16"):
    args = [a for k in knobs for a in ("--knob", k)]
    p = subprocess.run([*MOSAIC, "capture", "--lang", "pallas", "--family", "attention", "--shape", shape,
                        "--dtype", dtype, *args, "--lower-only", "--json", "-o", str(tmp_path / "a.bundle")],
                       capture_output=True, text=True, timeout=600)
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    return p


@pytest.mark.parametrize("dtype,knobs", [("bf16", ()), ("f16", ("kernel=project",))])
def test_mosaic_capture_lower_only_gives_a_bundle(dtype, knobs, tmp_path):
    from mosaic.bundle import load_bundle

    p = capture(tmp_path, "batch=1,seq=512,heads=2,head_dim=128", *knobs, dtype=dtype)
    r = json.loads(p.stdout)
    assert p.returncode == 0 and r["status"] == "lowered", r
    b = load_bundle(tmp_path / "a.bundle")
    assert "stablehlo.custom_call @mosaic_gpu" in b.read_text("source")
    notes = json.loads((tmp_path / "a.bundle" / "lowering.json").read_text())["notes"]
    assert "kernel=project" in notes and any(n.startswith("smem_bytes=") for n in notes), notes


def test_jax_kernel_chosen_for_bf16_keeps_its_refusal(tmp_path):
    p = capture(tmp_path, "batch=1,seq=256,heads=2,head_dim=64", "kernel=jax", dtype="bf16")
    r = json.loads(p.stdout)
    assert r["status"] == "unbuildable", r
    assert "attention_mgpu forward runs f16 only, not bf16" in r["message"], r


def test_a_knob_of_the_other_kernel_is_one_line(tmp_path):
    p = capture(tmp_path, "batch=1,seq=256,heads=2,head_dim=64", "kernel=jax", "p_operand=smem", dtype="f16")
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, lines
    assert "p_operand='smem' is invalid: must be 'registers': it does not apply to kernel='jax'" in lines[0]


def test_a_knob_of_the_kernel_the_dtype_did_not_pick_says_which_it_picked(tmp_path):
    p = capture(tmp_path, "batch=1,seq=256,heads=2,head_dim=64", "compute_wgs=1", dtype="f16")
    r = json.loads(p.stdout)
    assert p.returncode != 0 and r["status"] == "failed", r
    assert ("compute_wgs=1 is invalid: must be 2: it does not apply to kernel='jax' (kernel unset: f16 runs "
            "kernel=jax; set --knob kernel=project or kernel=jax)") in r["message"], r

