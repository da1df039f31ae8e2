"""The CUDA VM on a GPU (marked ``gpu``; skipped without cupy and a CUDA device). The full evidence run
is benchmarks/amk_microkernels.py, amk_sync_variants.py and amk_parity.py; these are the same checks at tiny scale
for ``pytest -m gpu`` on the device."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", ["llama", "smollm2", "qwen2", "mistral"])
def test_tiny_greedy_matches_hf_bf16(family, tmp_path, cuda_device):
    from mosaic.plugins import host
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch
    from mosaic_amk.parity import compare
    from mosaic_amk.tiny_models import make_checkpoint

    model = hf_gpu.load_bf16(make_checkpoint(tmp_path / family, family))
    spec = hf_gpu.spec_of(model)
    vm = CudaVM(spec, ScheduleConfig(gemv_rows_per_task=16), host().get("gpus", "h200"),
                weights=weights_from_torch(model, spec), max_positions=64)
    prompt = [3, 17, 42, 5, 11]
    toks, logits = vm.generate(prompt, 24)
    hf_toks, hf_logits = hf_gpu.greedy(model, [prompt], 24)
    r = compare(toks, logits, hf_toks[0], list(hf_logits[0]))
    assert r.ok, r.to_json()
    assert r.max_logit_error < 0.1


def test_gemv_f32_mode_is_ops_py(cuda_device):
    import cupy as cp
    from mosaic_amk import ops
    from mosaic_amk.bench.microbench import op_schedule, split_rows
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.encode import encode
    from mosaic_amk.cuda.launcher import Launcher, bf16_round
    from mosaic_amk.schedule import Buffer

    rng = np.random.default_rng(0)
    n, k = 1000, 512
    x, w = bf16_round(rng.standard_normal(k).astype(np.float32)), bf16_round(rng.standard_normal((n, k)).astype(np.float32))
    bufs = [Buffer("x", "f32", (k,), "input"), Buffer("w", "f32", (n, k), "weight"), Buffer("y", "f32", (n,), "output")]
    s = op_schedule("gemv", bufs, ["x", "w"], ["y"], {"bias": False, "residual": False}, 132, split_rows(n, 132),
                    ["w", "y"])
    lz = Launcher(encode(s), str(build(512).cubin), mode="f32")
    lz.bind({"w": w}, {"x": x})
    lz.launch()
    lz.check()
    ref = np.empty(n, np.float32)
    ops.op_gemv([x, w], [ref], {"row_start": 0, "row_end": n, "bias": False, "residual": False})
    assert np.abs(cp.asnumpy(lz.dev["y"]) - ref).max() <= 1e-4 * np.abs(ref).max()


def test_watchdog_aborts_and_gpu_stays_usable(cuda_device):
    import cupy as cp
    from mosaic_amk.bench.microbench import deadlock, handoff_chain
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.encode import encode
    from mosaic_amk.cuda.launcher import Launcher, WatchdogAbort

    lz = Launcher(encode(deadlock(132)), str(build(512).cubin), timeout_s=0.2)
    lz.bind({}, {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    lz.launch()
    with pytest.raises(WatchdogAbort) as exc:
        lz.check()
    states = {d["block"]: d for d in exc.value.dump}
    assert {states[0]["state"], states[1]["state"]} <= {"timeout", "peer-abort"}
    assert "timeout" in {states[0]["state"], states[1]["state"]}
    assert states[0]["counter"] == 1 and states[0]["value"] == 0 and states[0]["threshold"] == 1
    ok = Launcher(encode(handoff_chain(10, [0, 1], 132)), str(build(512).cubin))
    ok.bind({}, {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)})
    ok.launch()
    ok.check()
    assert float(cp.asnumpy(ok.dev["y9"])[0]) == 11.0


def _run_case(schedule, case, mode):
    import cupy as cp
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.encode import encode
    from mosaic_amk.cuda.launcher import Launcher, gate

    gate(schedule)
    lz = Launcher(encode(schedule, runtime_position=False), str(build(512).cubin), mode=mode)
    lz.bind(case["weights"], case["inputs"])
    lz.launch()
    lz.check()
    return cp.asnumpy(lz.dev[case["out"]]).astype(np.float32)


@pytest.mark.parametrize("case", ["rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append_k",
                                  "gemv_rope_append_v"])
def test_fused_gemv_micro_kernels(case, cuda_device):
    """Each fused GEMV micro-kernel: f32 mode is ops.KERNELS of the fused op (normwise relative error < 1e-4 on
    the bf16 weights), and hf-bf16 mode is bit-identical to the unfused chain (rmsnorm, gemv, rope / append),
    which rounds where transformers' bf16 eager rounds: the fused op rounds at the same places."""
    from mosaic_amk.bench.microbench import fused_gemv_case

    c = fused_gemv_case(case, np.random.default_rng(3), hidden=1024, rows=1000, heads=16, head_dim=64, position=37)
    got = _run_case(c["fused"], c, "f32")
    ref = c["ref"]
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    fused = _run_case(c["fused"], c, "hf-bf16")
    unfused = _run_case(c["unfused"], c, "hf-bf16")
    assert np.isfinite(fused).all()
    assert np.array_equal(fused.view(np.uint32), unfused.view(np.uint32))


# ------------------------------------------------------------------ synchronisation variants (vm.cu sync_flags)

SYNC_VARIANT_NAMES = ["relaxed", "merged", "side", "side-pf"]


@pytest.mark.parametrize("variant", SYNC_VARIANT_NAMES)
@pytest.mark.parametrize("steps_per_launch", [1, 8])
def test_sync_variant_tokens_equal_v0(variant, steps_per_launch, tmp_path, cuda_device):
    """Each synchronisation variant generates the v0 path's greedy tokens (one step per launch and 8 steps in
    one launch: the step-boundary signal of the last task), with bit-identical logits in the per-step path."""
    import attrs
    from mosaic.plugins import host
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.bench.bench import SYNC_VARIANTS
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch
    from mosaic_amk.tiny_models import make_checkpoint

    model = hf_gpu.load_bf16(make_checkpoint(tmp_path / "llama", "llama"))
    spec = hf_gpu.spec_of(model)
    weights = weights_from_torch(model, spec)
    base = ScheduleConfig(gemv_rows_per_task=16, prefetch_depth=2)
    wait, signal, prefetch = SYNC_VARIANTS[variant]
    cfg = attrs.evolve(base, wait_mode=wait, signal_mode=signal, prefetch_mode=prefetch)
    gpu = host().get("gpus", "h200")
    v0 = CudaVM(spec, base, gpu, weights=weights, max_positions=64)
    vm = CudaVM(spec, cfg, gpu, weights=weights, max_positions=64)
    assert vm.launcher.sync != 0 and v0.launcher.sync == 0
    prompt = [3, 17, 42, 5, 11]
    logits = steps_per_launch == 1
    want, want_logits = v0.generate(prompt, 24, logits=logits, steps_per_launch=steps_per_launch)
    got, got_logits = vm.generate(prompt, 24, logits=logits, steps_per_launch=steps_per_launch)
    assert got == want
    for a, b in zip(got_logits, want_logits, strict=True):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("variant", SYNC_VARIANT_NAMES)
def test_sync_variant_watchdog_and_handoff_chain(variant, cuda_device):
    """Under each variant: the planted deadlock trips the watchdog (dump names the counter), a valid hand-off
    chain across two SMs then computes its result, and a multi-step launch of it too (counters not re-zeroed)."""
    import cupy as cp
    from mosaic_amk.bench.bench import SYNC_VARIANTS
    from mosaic_amk.bench.microbench import deadlock, handoff_chain
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.encode import encode
    from mosaic_amk.cuda.launcher import Launcher, WatchdogAbort

    wait, signal, prefetch = SYNC_VARIANTS[variant]
    kw = dict(wait_mode=wait, signal_mode=signal, prefetch_mode=prefetch)
    lz = Launcher(encode(deadlock(132)), str(build(512).cubin), timeout_s=0.2, **kw)
    lz.bind({}, {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    lz.launch()
    with pytest.raises(WatchdogAbort) as exc:
        lz.check()
    states = {d["block"]: d for d in exc.value.dump}
    assert "timeout" in {states[0]["state"], states[1]["state"]}
    assert states[0]["counter"] == 1 and states[0]["threshold"] == 1
    for n_steps in (1, 5):
        ok = Launcher(encode(handoff_chain(50, [0, 1], 132)), str(build(512).cubin), **kw)
        ok.bind({}, {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)})
        ok.launch(n_steps=n_steps)
        ok.check()
        assert float(cp.asnumpy(ok.dev["y49"])[0]) == 51.0
