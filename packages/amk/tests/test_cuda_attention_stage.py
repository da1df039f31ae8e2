"""KV staging of the attention (ScheduleConfig.attention_stage, build define AMK_ATT_STAGE; docs/amk-cuda.md
"Attention staging"): the encoder's F_KV_STAGE rule, the config and the build on the CPU; on the H200 the staged
build gives the default build's bits (the op on random data, whole models one and eight steps per launch) and a
staged task whose wait never holds still trips the watchdog."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from mosaic_amk.bench.microbench import op_schedule
from mosaic_amk.config import CUDA_DEFAULT, ScheduleConfig
from mosaic_amk.cuda import build as B
from mosaic_amk.cuda import encode as E
from mosaic_amk.schedule import Buffer, Task

STAGE = ("AMK_ATT_STAGE=1",)
NO_STAGE = attrs.evolve(CUDA_DEFAULT, attention_stage=False)
# configs that must give NO_STAGE's bits: CUDA_DEFAULT and its twin without the preload (the v0 loop then has no B0
# of its own: the staging needs it)
TWINS = {"stage": CUDA_DEFAULT, "stage-preload0": attrs.evolve(CUDA_DEFAULT, weight_preload=0)}


def attention_case(rng, *, nh=32, nkv=8, hd=64, pos=100, window=0, heads_per_task=1, page=16, pages=16,
                   num_sms=132):
    """One attention op over a random KV cache, ``heads_per_task`` query heads per task: (schedule, q, k, v)."""
    kvd = nkv * hd
    kc = rng.standard_normal((pages, page, kvd)).astype(np.float32)
    vc = rng.standard_normal((pages, page, kvd)).astype(np.float32)
    q = rng.standard_normal(nh * hd).astype(np.float32)
    first = max(0, pos - window + 1) if window else 0
    bufs = [Buffer("q", "f32", (nh * hd,), "input"), Buffer("k", "f32", (pages, page, kvd), "kv_cache"),
            Buffer("v", "f32", (pages, page, kvd), "kv_cache"), Buffer("y", "f32", (nh * hd,), "output")]
    rows = [(h * hd, min(nh, h + heads_per_task) * hd) for h in range(0, nh, heads_per_task)]
    params = {"position": pos, "num_heads": nh, "num_kv_heads": nkv, "head_dim": hd, "window": window,
              "scale": hd ** -0.5, "page_tokens": page}
    kv = (first // page, pos // page + 1)
    s = op_schedule("attention", bufs, ["q", "k", "v"], ["y"], params, num_sms, rows, ["q", "y"],
                    extra_ranges={"k": kv, "v": kv}, position=pos)
    return s, q, kc, vc


def _flags(enc):
    return [int(f) for f, op in zip(enc.tasks[:, E.W_FLAGS], enc.tasks[:, E.W_OP], strict=True)
            if op == E.OP_CODE["attention"]]


# ------------------------------------------------------------------------------------------------ CPU
def test_encoder_flags_runtime_position_attention_only():
    s, *_ = attention_case(np.random.default_rng(0))
    assert all(f & E.F_KV_STAGE for f in _flags(E.encode(s)))
    # a baked position (no F_RUNTIME_POS): the rows before it are not known to come from earlier steps
    assert not any(f & E.F_KV_STAGE for f in _flags(E.encode(s, runtime_position=False)))


def test_encoder_refuses_the_flag_when_a_cache_writer_has_a_baked_position():
    """A kv_append at another position than the schedule's writes a row the staged attention could read before its
    wait: no F_KV_STAGE. The same append at the schedule's position keeps it."""
    s, *_ = attention_case(np.random.default_rng(0), pos=40)
    x = Buffer("x", "f32", (8 * 64,), "input")

    def with_append(position):
        app = Task(id=len(s.tasks), op="kv_append", sm=0, inputs=("x",), outputs=("k",), waits=(), signal=1,
                   params={"position": position, "page_tokens": 16}, ranges={"k": (position // 16, position // 16 + 1)})
        return attrs.evolve(s, buffers=(*s.buffers, x), tasks=(*s.tasks, app), num_counters=2)

    assert all(f & E.F_KV_STAGE for f in _flags(E.encode(with_append(40))))
    assert not any(f & E.F_KV_STAGE for f in _flags(E.encode(with_append(39))))


@pytest.mark.parametrize("family", ["llama", "smollm2"])
def test_lowered_decode_schedule_flags_every_attention_task(family):
    from mosaic.plugins import host
    from mosaic_amk.lowering import lower
    from mosaic_amk.tiny_models import tiny_model

    s = lower(tiny_model(family), CUDA_DEFAULT, host().get("gpus", "h200"), 5)
    flags = _flags(E.encode(s))
    assert len(flags) == sum(t.op == "attention" for t in s.tasks) > 0
    assert all(f & E.F_KV_STAGE for f in flags)


def test_config_defines_and_builds_without_spills():
    assert B.config_defines(CUDA_DEFAULT)[-1] == "AMK_ATT_STAGE=1"
    assert "AMK_ATT_STAGE=1" not in B.config_defines(attrs.evolve(CUDA_DEFAULT, attention_stage=False))
    with pytest.raises(TypeError):
        ScheduleConfig(attention_stage=1)
    for defines in (STAGE, (*B.preload_defines(8), *STAGE), (*B.preload_defines(6), *STAGE),
                    (*B.preload_defines(8), *STAGE, "AMK_ATT_NB1=0")):
        info = B.build(512, defines=defines)
        assert info.spill_stores == 0 and info.spill_loads == 0, (defines, info.ptxas_log)
        assert info.registers <= 128


# ------------------------------------------------------------------------------------------------ GPU


def _run_attention(s, q, kc, vc, mode, defines):
    import cupy as cp
    from mosaic_amk.cuda.launcher import Launcher, gate

    gate(s)
    enc = E.encode(s)
    assert all(f & E.F_KV_STAGE for f in _flags(enc))
    lz = Launcher(enc, str(B.build(512, defines=defines).cubin), mode=mode)
    lz.bind({}, {"q": q})
    lz.dev["k"][...] = cp.asarray(kc)
    lz.dev["v"][...] = cp.asarray(vc)
    lz.launch()
    lz.check()
    return cp.asnumpy(lz.dev["y"]).astype(np.float32)


ATT_CASES = {  # name: attention_case keywords
    "llama1b-1head-pos100": {},
    "llama1b-group-pos37": {"heads_per_task": 4, "pos": 37},
    "llama1b-2groups-pos60": {"heads_per_task": 8, "pos": 60},  # two KV groups in a task: the global path
    "smollm2-1head-pos150": {"nh": 9, "nkv": 3, "pos": 150},
    "window48-pos120": {"window": 48, "pos": 120},
    "pos0": {"pos": 0},
    "long-pos1000": {"pos": 1000, "pages": 64},  # too many rows for shared memory: the global path
    "hd128-pos70": {"nh": 8, "nkv": 2, "hd": 128, "pos": 70},
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ATT_CASES))
def test_staged_attention_is_default_bits(name, cuda_device):
    from mosaic_amk import ops

    s, q, kc, vc = attention_case(np.random.default_rng(7), **ATT_CASES[name])
    p = s.tasks[0].params
    ref = np.zeros_like(q)
    ops.op_attention([q, kc, vc], [ref], {**p, "row_start": 0, "row_end": q.size})
    for mode in ("f32", "hf-bf16"):
        want = _run_attention(s, q, kc, vc, mode, ())
        got = _run_attention(s, q, kc, vc, mode, STAGE)
        assert np.isfinite(want).all()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), mode
        if mode == "f32":
            assert np.abs(got - ref).max() <= 1e-5 * max(1.0, float(np.abs(ref).max()))


@pytest.mark.gpu
@pytest.mark.parametrize("model_kind", ["tiny-llama", "tiny-smollm2", "llama-3.2-1b-2layers"])
@pytest.mark.parametrize("steps_per_launch", [1, 8])
@pytest.mark.parametrize("twin", list(TWINS))
def test_staged_whole_model_tokens_and_logits_equal(model_kind, steps_per_launch, twin, cuda_device, gpu_model,
                                                    same_generation):
    """CUDA_DEFAULT (attention_stage on; and its twin without the preload) against the twin without the staging: the same greedy
    tokens; one step per launch also bit-identical logits. Eight steps per launch: every staged row of positions >
    the first was written earlier in the launch."""
    from mosaic_amk.cuda.cuda_vm import CudaVM

    _, spec, weights, gpu = gpu_model(model_kind)
    off = CudaVM(spec, NO_STAGE, gpu, weights=weights, max_positions=64)
    on = CudaVM(spec, TWINS[twin], gpu, weights=weights, max_positions=64)
    from mosaic_amk.cuda.cuda_vm import short_rows_defines

    assert on.build_info.key == B.build(512, defines=B.config_defines(TWINS[twin]) + short_rows_defines(spec)).key
    assert "AMK_ATT_STAGE=1" in B.config_defines(TWINS[twin])
    same_generation(off, on, [3, 17, 42, 5, 11], 40, steps_per_launch)


@pytest.mark.gpu
@pytest.mark.parametrize("model_kind", ["tiny-llama", "smollm2-135m-3layers", "llama-3.2-1b-2layers"])
def test_one_head_instantiation_is_bit_identical(model_kind, cuda_device, gpu_model, same_generation):
    """CUDA_DEFAULT (one query head per attention task, staged: the one-slot instantiation of the attention) against
    the same config built with AMK_ATT_NB1=0 (every task through the eight-slot code): the same tokens and logits."""
    from mosaic_amk.cuda.cuda_vm import CudaVM

    _, spec, weights, gpu = gpu_model(model_kind)
    one = CudaVM(spec, CUDA_DEFAULT, gpu, weights=weights, max_positions=64)
    eight = CudaVM(spec, CUDA_DEFAULT, gpu, weights=weights, max_positions=64, extra_defines=("AMK_ATT_NB1=0",))
    assert one.build_info.key != eight.build_info.key
    same_generation(eight, one, [3, 17, 42, 5, 11], 40)


@pytest.mark.gpu
def test_staged_attention_watchdog_trips_and_the_next_launch_works(tmp_path, cuda_device):
    """A lowered model's attention task whose wait never holds (forced past the validator): its rows were staged,
    the watchdog still trips and names it; then the same cubin generates the default build's tokens."""
    from mosaic.plugins import host
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.bench.microbench import raise_threshold
    from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch
    from mosaic_amk.cuda.launcher import Launcher, WatchdogAbort, gate
    from mosaic_amk.lowering import lower
    from mosaic_amk.tiny_models import make_checkpoint

    model = hf_gpu.load_bf16(make_checkpoint(tmp_path / "llama", "llama"))
    spec = hf_gpu.spec_of(model)
    weights = weights_from_torch(model, spec)
    gpu = host().get("gpus", "h200")
    vm = CudaVM(spec, CUDA_DEFAULT, gpu, weights=weights, max_positions=64)
    s = lower(spec, vm.config, gpu, 6)
    i = next(i for i, t in enumerate(s.tasks) if t.op == "attention")
    bad = raise_threshold(s, i)
    assert not gate(bad, unsafe=True).ok
    lz = Launcher(E.encode(bad), str(vm.build_info.cubin), smem_bytes=vm.config.smem_bytes, timeout_s=0.25,
                  mode="hf-bf16")
    lz.bind(weights)
    lz.launch(position=6)
    with pytest.raises(WatchdogAbort) as exc:
        lz.check()
    # blocks waiting downstream may time out first (they started waiting earlier): the raised task's block then
    # records the peer abort; either way its dump names the task, its counter and the raised threshold
    assert any(d["state"] == "timeout" for d in exc.value.dump)
    mine = [d for d in exc.value.dump if d["task"] == s.tasks[i].id]
    assert mine and mine[0]["state"] in ("timeout", "peer-abort"), mine
    assert mine[0]["counter"] == s.tasks[i].waits[0].counter
    assert mine[0]["threshold"] == s.tasks[i].waits[0].threshold + 1 > mine[0]["value"]
    del lz
    off = CudaVM(spec, NO_STAGE, gpu, weights=weights, max_positions=64)
    want, _ = off.generate([1, 2, 3, 4], 8, logits=False)
    got, _ = vm.generate([1, 2, 3, 4], 8, logits=False)
    assert got == want
