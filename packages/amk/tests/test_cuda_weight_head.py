"""The weight head (ScheduleConfig.weight_head, build define AMK_WHEAD_KB): the encoder pairs every gate/up task with
the task before it on its SM (regions, flags), the config and build refuse what cannot run, and on the H200 a head
build generates the default build's tokens and logits bit for bit; an aborted launch with a head in flight leaves the
GPU usable."""

from __future__ import annotations

import shutil

import attrs
import numpy as np
import pytest
from mosaic.errors import BadInput
from mosaic.plugins import host
from mosaic_amk.config import CUDA_DEFAULT
from mosaic_amk.cuda import build as B
from mosaic_amk.cuda import encode as E
from mosaic_amk.lowering import lower
from mosaic_amk.tiny_models import tiny_model

GPU = host().get("gpus", "h200")
HEAD = attrs.evolve(CUDA_DEFAULT, weight_head=96)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_encoder_pairs_each_gate_up_task_with_the_task_before_it(family):
    m = tiny_model(family)
    s = lower(m, attrs.evolve(CUDA_DEFAULT, kv_max_tokens=64), GPU, 0)
    plain, enc = E.encode(s), E.encode(s, weight_head=96 * 1024)
    keep = [w for w in range(E.TASK_WORDS) if w != E.W_FLAGS and not E.W_PF <= w < E.W_PF + 3 * E.MAX_PF]
    assert np.array_equal(plain.tasks[:, keep], enc.tasks[:, keep])
    flags = enc.tasks[:, E.W_FLAGS]
    assert np.array_equal(flags & ~(E.F_HEAD_ISSUE | E.F_HEAD_USE), plain.tasks[:, E.W_FLAGS])
    users = 0
    for sm in range(enc.num_sms):
        q = [int(i) for i in enc.queue[enc.queue_offsets[sm]:enc.queue_offsets[sm + 1]]]
        for j, i in enumerate(q):
            t, rec = s.tasks[i], enc.tasks[i]
            if t.op == "rmsnorm_gemv_silu_mul" and j > 0 and s.tasks[q[j - 1]].op != t.op:
                users += 1
                p = enc.tasks[q[j - 1]]
                assert rec[E.W_FLAGS] & E.F_HEAD_USE and p[E.W_FLAGS] & E.F_HEAD_ISSUE
                g, u = E._role_buffer(t, "w_gate"), E._role_buffer(t, "w_up")
                assert [enc.buffers[p[E.W_PF]].name, enc.buffers[p[E.W_PF + 3]].name] == [g, u]
                row16 = enc.buffers[p[E.W_PF]].row * 2 // 16
                r0, r1 = t.params["row_start"], t.params["row_end"]
                rows = min(r1 - r0, 96 * 1024 // (4 * enc.buffers[p[E.W_PF]].row))
                assert tuple(p[E.W_PF:E.W_PF + 6]) == (p[E.W_PF], r0 * row16, rows * row16,
                                                       p[E.W_PF + 3], r0 * row16, rows * row16)
                assert tuple(rec[E.W_PF:E.W_PF + 3]) == tuple(p[E.W_PF:E.W_PF + 3])
                assert rec[E.W_PF + 3] == -1
            elif not (j + 1 < len(q) and s.tasks[q[j + 1]].op == "rmsnorm_gemv_silu_mul" and t.op != s.tasks[q[j + 1]].op):
                assert not rec[E.W_FLAGS] & (E.F_HEAD_ISSUE | E.F_HEAD_USE)
                assert (rec[E.W_PF:E.W_PF + 3 * E.MAX_PF] == -1).all()
    assert users > 0
    # decode ignores the head: the same schedule comes back
    assert E.decode(enc).tasks == E.decode(plain).tasks


def test_head_rows_fit_the_head():
    """Rows of 8 KB (gate + up, K = 2048) in 96 KB: 12 rows; a head smaller than one row pair gives none."""
    m = tiny_model("llama")
    s = lower(m, attrs.evolve(CUDA_DEFAULT, kv_max_tokens=64), GPU, 0)
    k = [b for b in E.encode(s).buffers if b.name.endswith("gate_proj.weight")][0].row
    enc = E.encode(s, weight_head=4 * k - 16)
    assert not (enc.tasks[:, E.W_FLAGS] & (E.F_HEAD_ISSUE | E.F_HEAD_USE)).any()


def test_config_and_build_refuse_what_cannot_run():
    with pytest.raises((ValueError, BadInput)):
        attrs.evolve(CUDA_DEFAULT, weight_head=100)
    with pytest.raises((ValueError, BadInput)):
        attrs.evolve(CUDA_DEFAULT, weight_head=64, prefetch_depth=1)
    with pytest.raises((ValueError, BadInput)):
        attrs.evolve(CUDA_DEFAULT, weight_preload=0, weight_head=64, weight_stream=2)
    assert HEAD.ring_bytes() == 96 * 1024 and B.config_defines(HEAD)[-1] == "AMK_WHEAD_KB=96"
    assert B.ring_bytes(512, ("AMK_WHEAD_KB=96",)) == 96 * 1024
    assert HEAD.to_json()["weight_head"] == 96


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_head_build_has_the_bulk_copies():
    b = B.build(512, defines=B.config_defines(HEAD))
    assert b.registers <= 128
    assert "AMK_WHEAD_KB=96" in " ".join(B.flags(512, B.config_defines(HEAD)))


@pytest.mark.gpu
@pytest.mark.parametrize("steps_per_launch", [1, 8])
@pytest.mark.parametrize("model_kind", ["tiny-llama", "smollm2-135m-3layers", "llama-3.2-1b-2layers"])
def test_head_is_bit_identical(model_kind, steps_per_launch, cuda_device, gpu_model, same_generation):
    from mosaic_amk.cuda.cuda_vm import CudaVM

    _, spec, weights, gpu = gpu_model(model_kind)
    base = CudaVM(spec, CUDA_DEFAULT, gpu, weights=weights, max_positions=64)
    for kb in (32, 120):
        head = CudaVM(spec, attrs.evolve(CUDA_DEFAULT, weight_head=kb), gpu, weights=weights, max_positions=64)
        assert (head.enc.tasks[:, E.W_FLAGS] & E.F_HEAD_USE).any()
        same_generation(base, head, [3, 17, 42, 5, 11], 24, steps_per_launch)


@pytest.mark.gpu
def test_head_watchdog_trips_and_the_next_launch_works(cuda_device, gpu_model):
    """A gate/up task whose wait never holds (forced past the validator) while its head is in flight: the watchdog
    trips and names it; the same cubin then generates the default build's tokens."""
    from mosaic_amk.cuda.cuda_vm import CudaVM
    from mosaic_amk.cuda.launcher import Launcher, WatchdogAbort, gate
    from mosaic_amk.cuda.microbench import raise_threshold

    _, spec, weights, gpu = gpu_model("llama-3.2-1b-2layers")
    vm = CudaVM(spec, HEAD, gpu, weights=weights, max_positions=64)
    s = lower(spec, vm.config, gpu, 6)
    enc0 = E.encode(s, weight_head=96 * 1024)
    i = next(i for i, t in enumerate(s.tasks) if enc0.tasks[i, E.W_FLAGS] & E.F_HEAD_USE)
    bad = raise_threshold(s, i)
    assert not gate(bad, unsafe=True).ok
    lz = Launcher(E.encode(bad, weight_head=96 * 1024), str(vm.build_info.cubin), smem_bytes=vm.config.smem_bytes,
                  ring_bytes=vm.config.ring_bytes(), timeout_s=0.25, mode="hf-bf16")
    lz.bind(weights)
    lz.launch(position=6)
    with pytest.raises(WatchdogAbort) as exc:
        lz.check()
    assert any(d["task"] == s.tasks[i].id for d in exc.value.dump)
    del lz
    base = CudaVM(spec, CUDA_DEFAULT, gpu, weights=weights, max_positions=64)
    want, _ = base.generate([1, 2, 3, 4], 8, logits=False)
    got, _ = vm.generate([1, 2, 3, 4], 8, logits=False)
    assert got == want
