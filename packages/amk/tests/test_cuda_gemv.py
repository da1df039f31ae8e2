"""The two GEMV bodies of kernels/gemv_rows.cuh (AMK_GEMV_IMPL 1, the default, and 2, the cp.async ring; build(defines=)):
both build for sm_90a, body 2 really streams through cp.async (LDGSTS in its SASS, none in body 1's), bad defines are
refused (body 1's only cp.async stages a fused norm's weight); on a GPU (marked ``gpu``) body 2 is bit-identical to body 1 in both precision modes for gemv (bias,
residual, a K with a partial last chunk round, more than 32 rows per warp), gemv_silu_mul and every fused GEMV,
and its f32 mode is ops.py (normwise relative error < 1e-4).

The weight preload (AMK_WEIGHT_PRELOAD=N, ScheduleConfig.weight_preload; docs/amk-cuda.md "Weight preload"; its CPU
checks are in test_cuda_preload.py): on a GPU, every allowed N is bit-identical to the default build for gemv (the
cases above: rows past the warps, K shorter than the preload, a partial chunk round), the fused GEMVs and their
unfused chains (rmsnorm -> gemv / gemv_silu_mul -> rope / append: GEMV tasks that really wait), an LM head
(rmsnorm -> gemv -> argmax), at 1 and 3 steps per launch; whole models (tiny Llama, a 2-layer Llama-3.2-1B shape)
generate the same tokens and bit-identical logits; the watchdog still trips on a GEMV task's wait. The same GPU tests
run the weight stream (AMK_WSTREAM=N, ScheduleConfig.weight_stream: TMA bulk copies into a shared-memory ring, the
first pieces issued before the wait; docs/amk-cuda.md "Weight stream"; CPU checks in test_cuda_preload.py)."""

from __future__ import annotations

import os
import shutil
import subprocess

import attrs
import numpy as np
import pytest
from mosaic.toolchain.tools import find_tool
from mosaic_amk.config import WEIGHT_PRELOADS, WEIGHT_STREAMS
from mosaic_amk.cuda import build as B

BODY2 = ("AMK_GEMV_IMPL=2",)
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.isfile("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc not found (the VM build needs it)")


@pytest.fixture(scope="module")
def builds(private_cache):
    return B.build(512), B.build(512, defines=BODY2)


def test_defines_are_checked_and_keyed():
    with pytest.raises(B.BuildError, match="unknown build define"):
        B.build(512, defines=("AMK_THREADS=1024",))
    with pytest.raises(B.BuildError, match="unknown build define"):
        B.build(512, defines=("AMK_GEMV_IMPL=2; rm",))
    assert B.source_key(512, "release 13.0", BODY2) != B.source_key(512, "release 13.0")
    assert "-DAMK_GEMV_IMPL=2" in B.flags(512, BODY2) and "-DAMK_GEMV_IMPL=2" not in B.flags(512)


@needs_nvcc
def test_both_bodies_build_and_body2_uses_cp_async(builds):
    body1, body2 = builds
    assert body1.key != body2.key and body1.cubin != body2.cubin
    assert body1.spill_stores == 0 and body1.stack_bytes == 0, body1.ptxas_log  # the default stays spill-free
    assert body2.registers <= 128, body2.ptxas_log
    tool = find_tool("cuobjdump")
    if tool is None:  # pragma: no cover - the venv ships nvidia-cuda-cuobjdump
        pytest.skip("cuobjdump not found")
    sass = [subprocess.run([tool, "--dump-sass", str(b.cubin)], capture_output=True, text=True, timeout=120).stdout
            for b in builds]
    # body 1 issues cp.async only to stage the norm weight of a fused norm (norm_into, one copy per inlined site);
    # body 2 streams every GEMV's weights through its ring with it (and never stages the norm weight)
    assert sass[0].count("LDGSTS") < sass[1].count("LDGSTS")
    assert "LDGSTS" in sass[1] and "DEPBAR" in sass[1]


# ------------------------------------------------------------------------------------------------ GPU


def _run(schedule, weights, inputs, out, mode, defines=(), n_steps=1):
    import cupy as cp
    from mosaic_amk.cuda.encode import encode
    from mosaic_amk.cuda.launcher import Launcher, gate

    gate(schedule)
    lz = Launcher(encode(schedule, runtime_position=False), str(B.build(512, defines=defines).cubin), mode=mode,
                  ring_bytes=B.ring_bytes(512, defines))
    lz.bind(weights, inputs)
    lz.launch(n_steps=n_steps)
    lz.check()
    return cp.asnumpy(lz.dev[out]).astype(np.float32)


def _gemv_case(rng, n, k, bias, resid, parts):
    from mosaic_amk.bench.microbench import op_schedule, split_rows
    from mosaic_amk.cuda.launcher import bf16_round
    from mosaic_amk.schedule import Buffer

    x = bf16_round(rng.standard_normal(k).astype(np.float32))
    w = bf16_round((0.05 * rng.standard_normal((n, k))).astype(np.float32))
    b, r = bf16_round(rng.standard_normal(n).astype(np.float32)), bf16_round(rng.standard_normal(n).astype(np.float32))
    bufs = [Buffer("x", "f32", (k,), "input"), Buffer("w", "f32", (n, k), "weight"), Buffer("y", "f32", (n,), "output")]
    ins, rows = ["x", "w"], ["w", "y"]
    if bias:
        bufs.append(Buffer("b", "f32", (n,), "weight"))
        ins.append("b")
        rows.append("b")
    if resid:
        bufs.append(Buffer("res", "f32", (n,), "input"))
        ins.append("res")
        rows.append("res")
    s = op_schedule("gemv", bufs, ins, ["y"], {"bias": bias, "residual": resid}, 132, split_rows(n, parts), rows)
    return s, {"w": w, "b": b}, {"x": x, "res": r}, [x, w, *([b] if bias else []), *([r] if resid else [])]


# (rows, K, bias, residual, tasks): K = 576 has a partial last round of chunks (72 per row); 1000 rows in 1 task
# give each warp 32 rows and more (the second operand batch); 8 rows leave warps idle
GEMV_CASES = [(1000, 2048, True, True, 132), (1000, 576, True, True, 1), (8, 8192, False, True, 1),
              (4096, 2048, False, False, 132), (520, 8, True, False, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"{c[0]}x{c[1]}-b{int(c[2])}r{int(c[3])}-t{c[4]}")
def test_body2_gemv_is_body1_bits_and_ops_py(case, cuda_device):
    from mosaic_amk import ops

    n, k, bias, resid, parts = case
    s, weights, inputs, ref_ins = _gemv_case(np.random.default_rng(5), n, k, bias, resid, parts)
    ref = np.empty(n, np.float32)
    ops.op_gemv(ref_ins, [ref], {"row_start": 0, "row_end": n, "bias": bias, "residual": resid})
    for mode in ("f32", "hf-bf16"):
        one = _run(s, weights, inputs, "y", mode)
        two = _run(s, weights, inputs, "y", mode, BODY2)
        assert np.isfinite(two).all()
        assert np.array_equal(one.view(np.uint32), two.view(np.uint32)), mode
        if mode == "f32":
            assert np.abs(two - ref).max() <= 1e-4 * np.abs(ref).max()


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append_k",
                                  "gemv_rope_append_v"])
def test_body2_fused_gemvs_are_body1_bits_and_the_unfused_chain(case, cuda_device):
    """Body 2 keeps the fused ops' contract: f32 is ops.KERNELS, hf-bf16 is bit-identical to body 2's unfused chain
    (which includes gemv_silu_mul for the silu case) and to body 1."""
    from mosaic_amk.bench.microbench import fused_gemv_case

    c = fused_gemv_case(case, np.random.default_rng(3), hidden=1024, rows=1000, heads=16, head_dim=64, position=37)
    pick = (lambda a: a.reshape(-1, a.shape[-1])[37]) if c["out"] == "cache" else (lambda a: a)
    got = pick(_run(c["fused"], c["weights"], c["inputs"], c["out"], "f32", BODY2))
    ref = pick(c["ref"])
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    fused = _run(c["fused"], c["weights"], c["inputs"], c["out"], "hf-bf16", BODY2)
    unfused = _run(c["unfused"], c["weights"], c["inputs"], c["out"], "hf-bf16", BODY2)
    body1 = _run(c["fused"], c["weights"], c["inputs"], c["out"], "hf-bf16")
    assert np.array_equal(fused.view(np.uint32), unfused.view(np.uint32))
    assert np.array_equal(fused.view(np.uint32), body1.view(np.uint32))


# ------------------------------------------------------------------------------------ weight preload (GPU)
PRELOADS = tuple(n for n in WEIGHT_PRELOADS if n)
# every build variant that issues weight loads before a GEMV task's wait: the preload (registers) and the weight
# stream (TMA into a shared-memory ring; docs/amk-cuda.md "Weight stream"): (id, build defines, config change)
EARLY = [(f"preload{n}", B.preload_defines(n), {"weight_preload": n}) for n in PRELOADS] + \
        [(f"stream{n}", (f"AMK_WSTREAM={n}",), {"weight_stream": n}) for n in WEIGHT_STREAMS if n] + \
        [(f"pp-preload{n}", (*B.preload_defines(n), "AMK_GEMV_PP=1"), {"weight_preload": n, "gemv_pingpong": True})
         for n in (0, 6)]
EARLY_IDS = [e[0] for e in EARLY]


def _bits_equal(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize("early", EARLY, ids=EARLY_IDS)
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"{c[0]}x{c[1]}-b{int(c[2])}r{int(c[3])}-t{c[4]}")
def test_preload_gemv_is_default_bits(case, early, cuda_device):
    n, k, bias, resid, parts = case
    s, weights, inputs, _ = _gemv_case(np.random.default_rng(5), n, k, bias, resid, parts)
    for mode in ("f32", "hf-bf16"):
        want = _run(s, weights, inputs, "y", mode)
        got = _run(s, weights, inputs, "y", mode, early[1])
        assert np.isfinite(want).all() and _bits_equal(got, want), (mode, early[0])


@pytest.mark.gpu
@pytest.mark.parametrize("early", EARLY, ids=EARLY_IDS)
@pytest.mark.parametrize("case", ["rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append_k",
                                  "gemv_rope_append_v"])
def test_preload_fused_gemvs_and_chains_are_default_bits(case, early, cuda_device):
    """The fused op and its unfused chain (whose GEMV / gemv_silu_mul tasks wait for the rmsnorm stage: the preload
    is issued before a real wait), both precision modes, 1 and 3 steps per launch."""
    from mosaic_amk.bench.microbench import fused_gemv_case

    c = fused_gemv_case(case, np.random.default_rng(3), hidden=1024, rows=1000, heads=16, head_dim=64, position=37)
    for which in ("fused", "unfused"):
        for mode in ("f32", "hf-bf16"):
            want = _run(c[which], c["weights"], c["inputs"], c["out"], mode)
            for n_steps in (1, 3):
                got = _run(c[which], c["weights"], c["inputs"], c["out"], mode, early[1], n_steps)
                assert _bits_equal(got, want), (which, mode, n_steps)


# ------------------------------------------------------------------------------------ short rows (GPU)
NO_SHORT = ("AMK_SHORT_ROWS=0",)
SHORT_CASES = [(1000, 576, True, True, 132), (1000, 576, False, False, 3), (37, 1024, True, False, 1),
               (300, 960, False, True, 2), (64, 8, True, True, 1), (200, 1032, False, False, 1)]


def test_short_rows_defines_follow_the_model():
    """The VM leaves the short-row paths out of the build when no GEMV row is short (K > 1024 everywhere)."""
    from mosaic_amk.cuda.cuda_vm import short_rows_defines
    from mosaic_amk.tiny_models import tiny_model

    spec = tiny_model("llama")
    assert short_rows_defines(spec) == ()
    big = attrs.evolve(spec, hidden_size=2048, intermediate_size=8192, num_heads=32, head_dim=64)
    assert short_rows_defines(big) == NO_SHORT
    assert short_rows_defines(attrs.evolve(big, intermediate_size=1024)) == ()


@pytest.mark.gpu
@pytest.mark.parametrize("defines", [(), *[B.preload_defines(n) for n in PRELOADS]],
                         ids=["default", *[f"preload{n}" for n in PRELOADS]])
@pytest.mark.parametrize("case", SHORT_CASES, ids=lambda c: f"{c[0]}x{c[1]}-b{int(c[2])}r{int(c[3])}-t{c[4]}")
def test_short_rows_are_the_row_loop_bits(case, defines, cuda_device):
    """Rows of K <= 1024 two per round trip (row_dot_short2; with the preload the warp's first two rows preloaded
    whole): the bits of the one-row-at-a-time loop (AMK_SHORT_ROWS=0, no preload), both modes; K = 1032 is just
    past the short path."""
    n, k, bias, resid, parts = case
    s, weights, inputs, _ = _gemv_case(np.random.default_rng(9), n, k, bias, resid, parts)
    for mode in ("f32", "hf-bf16"):
        want = _run(s, weights, inputs, "y", mode, NO_SHORT)
        got = _run(s, weights, inputs, "y", mode, defines)
        assert np.isfinite(want).all() and _bits_equal(got, want), mode


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["gemv_rope", "gemv_rope_append_k", "gemv_rope_append_v", "rmsnorm_gemv"])
def test_short_rows_fused_smollm2_shapes(case, cuda_device):
    """The SmolLM2-135M q/k/v and norm+GEMV shapes (K = 576, 9 heads of 64): preload 8 with short rows gives the
    bits of the default build without them, in chains of 1 and 3 steps."""
    from mosaic_amk.bench.microbench import fused_gemv_case

    c = fused_gemv_case(case, np.random.default_rng(5), hidden=576, rows=576, heads=9, head_dim=64, position=20)
    for mode in ("f32", "hf-bf16"):
        want = _run(c["fused"], c["weights"], c["inputs"], c["out"], mode, NO_SHORT)
        for n_steps in (1, 3):
            got = _run(c["fused"], c["weights"], c["inputs"], c["out"], mode, B.preload_defines(8), n_steps)
            assert _bits_equal(got, want), (mode, n_steps)


@pytest.mark.gpu
@pytest.mark.parametrize("model_kind", ["tiny-smollm2", "smollm2-135m-3layers"])
def test_short_rows_whole_model_tokens_and_logits_equal(model_kind, cuda_device, gpu_model, same_generation):
    """CUDA_DEFAULT with and without the short-row paths: the same tokens and bit-identical logits."""
    from mosaic_amk.config import CUDA_DEFAULT
    from mosaic_amk.cuda.cuda_vm import CudaVM

    _, spec, weights, gpu = gpu_model(model_kind)
    off = CudaVM(spec, CUDA_DEFAULT, gpu, weights=weights, max_positions=64, extra_defines=NO_SHORT)
    on = CudaVM(spec, CUDA_DEFAULT, gpu, weights=weights, max_positions=64)
    same_generation(off, on, [3, 17, 42, 5], 24)


# ------------------------------------------------------------------------------------ split argmax (GPU)
def split_argmax_schedule(vocab, per, num_sms=132):
    """logits -> argmax_partial tasks of ``per`` logits (round robin, no waits) -> argmax_combine (waits for all)."""
    from mosaic_amk.schedule import Buffer, Schedule, Task, Wait

    parts = -(-vocab // per)
    bufs = (Buffer("logits", "f32", (vocab,), "input"), Buffer("val", "f32", (parts,), "scratch"),
            Buffer("idx", "i32", (parts,), "scratch"), Buffer("next_token", "i32", (1,), "output"))
    tasks = [Task(id=k, op="argmax_partial", sm=k % num_sms, inputs=("logits",), outputs=("val", "idx"), waits=(),
                  signal=0, params={"row_start": k * per, "row_end": min(vocab, (k + 1) * per), "part": k},
                  ranges={"logits": (k * per, min(vocab, (k + 1) * per)), "val": (k, k + 1), "idx": (k, k + 1)})
             for k in range(parts)]
    tasks.append(Task(id=parts, op="argmax_combine", sm=0, inputs=("val", "idx"), outputs=("next_token",),
                      waits=(Wait(0, parts),), signal=1, params={}))
    return Schedule(num_sms=num_sms, buffers=bufs, num_counters=2, tasks=tuple(tasks), outputs=("next_token",))


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["random", "ties", "nan", "all-equal", "max-last"])
@pytest.mark.parametrize("per", [1024, 7, 5000])
def test_split_argmax_is_the_first_index_of_the_max(case, per, cuda_device):
    """argmax_partial + argmax_combine on the device: numpy's argmax (first index of the max, NaN the maximum)."""
    rng = np.random.default_rng(13)
    vocab = 5003
    logits = rng.standard_normal(vocab).astype(np.float32)
    if case == "ties":
        logits[[17, 2100, 4999]] = 9.0
    elif case == "nan":
        logits[[3001, 4000]] = np.nan
    elif case == "all-equal":
        logits[:] = 1.5
    elif case == "max-last":
        logits[-1] = 50.0
    s = split_argmax_schedule(vocab, per)
    for mode in ("f32", "hf-bf16"):
        tok = _run(s, {}, {"logits": logits}, "next_token", mode)
        assert int(tok[0]) == int(np.argmax(logits)), (case, mode)  # (_run returns the int32 token as a float)


@pytest.mark.gpu
@pytest.mark.parametrize("model_kind", ["tiny-llama", "llama-3.2-1b-2layers"])
@pytest.mark.parametrize("steps_per_launch", [1, 8])
def test_split_argmax_whole_model_tokens_equal(model_kind, steps_per_launch, cuda_device, gpu_model, same_generation):
    """CUDA_DEFAULT (the argmax split over the SMs, 1024 logits per part; and 100) against its twin with one argmax
    task: the same tokens (and logits)."""
    from mosaic_amk.config import CUDA_DEFAULT, VM_FUSIONS
    from mosaic_amk.cuda.cuda_vm import CudaVM
    from mosaic_amk.cuda.decode import decode

    _, spec, weights, gpu = gpu_model(model_kind)
    assert "split_argmax" in CUDA_DEFAULT.fusion and CUDA_DEFAULT.argmax_rows_per_task == 1024
    one = attrs.evolve(CUDA_DEFAULT, fusion=VM_FUSIONS, argmax_rows_per_task=4096)
    base = CudaVM(spec, one, gpu, weights=weights, max_positions=64)
    assert sum(t.op == "argmax" for t in decode(base.enc).tasks) == 1
    for per in (1024, 100):
        cfg = attrs.evolve(CUDA_DEFAULT, argmax_rows_per_task=per)
        vm = CudaVM(spec, cfg, gpu, weights=weights, max_positions=64)
        assert sum(t.op == "argmax_partial" for t in decode(vm.enc).tasks) == -(-spec.vocab_size // per)
        same_generation(base, vm, [3, 17, 42, 5, 11], 24, steps_per_launch)


def lm_head_chain(rng, hidden=2048, vocab=5000, num_sms=132):
    """rmsnorm -> LM-head gemv (row tasks over the SMs, each waiting for the norm) -> argmax (waits for them all):
    (schedule, weights, inputs); the logits and next_token are outputs."""
    from mosaic_amk.bench.microbench import chain_schedule, split_rows
    from mosaic_amk.cuda.launcher import bf16_round
    from mosaic_amk.schedule import Buffer

    x = bf16_round((3.0 * rng.standard_normal(hidden)).astype(np.float32))
    nw = bf16_round((1.0 + 0.2 * rng.standard_normal(hidden)).astype(np.float32))
    w = bf16_round((0.02 * rng.standard_normal((vocab, hidden))).astype(np.float32))
    bufs = [Buffer("x", "f32", (hidden,), "input"), Buffer("nw", "f32", (hidden,), "weight"),
            Buffer("xn", "f32", (hidden,), "activation"), Buffer("w", "f32", (vocab, hidden), "weight"),
            Buffer("logits", "f32", (vocab,), "output"), Buffer("next_token", "i32", (1,), "output")]
    stages = [{"op": "rmsnorm", "inputs": ["x", "nw"], "outputs": ["xn"], "params": {"eps": 1e-5}},
              {"op": "gemv", "inputs": ["xn", "w"], "outputs": ["logits"], "params": {"bias": False, "residual": False},
               "rows": split_rows(vocab, num_sms), "row_buffers": ["w", "logits"]},
              {"op": "argmax", "inputs": ["logits"], "outputs": ["next_token"], "params": {}}]
    return chain_schedule(bufs, stages, num_sms, ["logits", "next_token"]), {"nw": nw, "w": w}, {"x": x}


@pytest.mark.gpu
@pytest.mark.parametrize("early", EARLY, ids=EARLY_IDS)
def test_preload_lm_head_argmax_is_default_bits(early, cuda_device):
    s, weights, inputs = lm_head_chain(np.random.default_rng(11))
    for mode in ("f32", "hf-bf16"):
        want = _run(s, weights, inputs, "logits", mode)
        want_tok = _run(s, weights, inputs, "next_token", mode)
        for n_steps in (1, 3):
            got = _run(s, weights, inputs, "logits", mode, early[1], n_steps)
            tok = _run(s, weights, inputs, "next_token", mode, early[1], n_steps)
            assert _bits_equal(got, want), (mode, n_steps)
            assert tok[0] == want_tok[0] == int(np.argmax(want)), (mode, n_steps)


@pytest.mark.gpu
@pytest.mark.parametrize("early", [EARLY[len(PRELOADS) - 1], EARLY[-1]], ids=[EARLY_IDS[len(PRELOADS) - 1], EARLY_IDS[-1]])
def test_preload_watchdog_trips_on_a_gemv_wait_and_the_next_launch_works(early, cuda_device):
    """A GEMV task whose wait can never hold (threshold + 1, forced past the validator): its preload was issued,
    the watchdog still trips and names its counter; a valid launch with the same cubin then gives the default bits."""
    import cupy as cp
    from mosaic_amk.bench.microbench import fused_gemv_case, raise_threshold
    from mosaic_amk.cuda.encode import encode
    from mosaic_amk.cuda.launcher import Launcher, WatchdogAbort, gate

    c = fused_gemv_case("rmsnorm_gemv", np.random.default_rng(3), hidden=1024, rows=1000, position=37)
    ok = c["unfused"]
    i = next(i for i, t in enumerate(ok.tasks) if t.op == "gemv")
    bad = raise_threshold(ok, i)
    assert not gate(bad, unsafe=True).ok
    cubin = str(B.build(512, defines=early[1]).cubin)
    ring = B.ring_bytes(512, early[1])
    lz = Launcher(encode(bad, runtime_position=False), cubin, mode="hf-bf16", timeout_s=0.2, ring_bytes=ring)
    lz.bind(c["weights"], c["inputs"])
    lz.launch()
    with pytest.raises(WatchdogAbort) as exc:
        lz.check()
    timed_out = [d for d in exc.value.dump if d["state"] == "timeout"]
    assert timed_out and timed_out[0]["task"] == ok.tasks[i].id
    assert timed_out[0]["counter"] == ok.tasks[i].waits[0].counter
    assert timed_out[0]["threshold"] == ok.tasks[i].waits[0].threshold + 1
    good = Launcher(encode(ok, runtime_position=False), cubin, mode="hf-bf16", timeout_s=0.2, ring_bytes=ring)
    good.bind(c["weights"], c["inputs"])
    good.launch(n_steps=2)
    good.check()
    want = _run(ok, c["weights"], c["inputs"], c["out"], "hf-bf16")
    assert _bits_equal(cp.asnumpy(good.dev[c["out"]]).astype(np.float32), want)


@pytest.mark.gpu
@pytest.mark.parametrize("model_kind", ["tiny-llama", "llama-3.2-1b-2layers"])
@pytest.mark.parametrize("steps_per_launch", [1, 8])
@pytest.mark.parametrize("early", [EARLY[len(PRELOADS) - 1], EARLY[-1]], ids=[EARLY_IDS[len(PRELOADS) - 1], EARLY_IDS[-1]])
def test_preload_whole_model_tokens_and_logits_equal(model_kind, steps_per_launch, early, cuda_device, gpu_model,
                                                    same_generation):
    """best-measured's config (fused GEMVs, relaxed polling, no L2 prefetch) with and without weight_preload=8 (and
    weight_stream=4):
    the same greedy tokens (one step per launch: bit-identical logits too; 8 steps in one launch: the tokens)."""
    import attrs
    from mosaic_amk.config import VM_FUSIONS, ScheduleConfig
    from mosaic_amk.cuda.cuda_vm import CudaVM

    # llama-3.2-1b-2layers: K = 2048 (the preload covers a whole row) and 8192 (the row loop goes on after it)
    _, spec, weights, gpu = gpu_model(model_kind)
    base = ScheduleConfig(gemv_rows_per_task=16, prefetch_depth=0, fusion=VM_FUSIONS, wait_mode="relaxed")
    off = CudaVM(spec, base, gpu, weights=weights, max_positions=64)
    on = CudaVM(spec, attrs.evolve(base, **early[2]), gpu, weights=weights, max_positions=64)
    from mosaic_amk.cuda.cuda_vm import short_rows_defines

    short = short_rows_defines(spec)
    assert on.build_info.key == B.build(base.threads_per_block, defines=early[1] + short).key
    assert off.build_info.key == B.build(base.threads_per_block, defines=short).key
    same_generation(off, on, [3, 17, 42, 5, 11], 24, steps_per_launch)
