"""The VM trace (build define AMK_TRACE, bench/trace.py): the timeline and stage table on stamps of a simulated
executor (CPU), the build, and on the H200 a traced generation (same tokens; causality of every wait)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from mosaic.plugins import host
from mosaic_amk.bench.trace import format_table, stage_table, timeline
from mosaic_amk.config import CUDA_DEFAULT, VM_FUSIONS
from mosaic_amk.cuda import build as B
from mosaic_amk.cuda import encode as E
from mosaic_amk.lowering import lower
from mosaic_amk.tiny_models import tiny_model

HANDOFF = 1300
BODY = {"embed": 900, "gemv_rope": 4000, "gemv_rope_append": 3000, "attention": 2500, "gemv": 5000,
        "rmsnorm_gemv_silu_mul": 9000, "rmsnorm_gemv": 20000, "argmax": 1500}


def _simulate(enc):
    """Stamps of an ideal executor: each SM runs its queue in order; a task's waits hold HANDOFF ns after the last
    producer of each counter it waits on finished; its body takes BODY[op] ns."""
    n = len(enc.tasks)
    done, stamps = {}, np.zeros((int(enc.queue_offsets[-1]), 3), np.int64)
    finished = {}  # counter -> [done of each producer]
    producers = np.bincount(enc.tasks[:, E.W_SIGNAL], minlength=enc.num_counters)
    sm_free = [10_000] * enc.num_sms
    pos = {int(enc.queue[q]): q for q in range(len(stamps))}
    sm_of = {int(enc.queue[q]): s for s in range(enc.num_sms)
             for q in range(int(enc.queue_offsets[s]), int(enc.queue_offsets[s + 1]))}
    for i in range(n):  # encoding order is a topological order of the lowered schedule
        w = enc.tasks[i]
        waits = [int(w[E.W_WAIT + 2 * k]) for k in range(int(w[E.W_NWAIT]))]
        assert all(len(finished.get(c, ())) == producers[c] for c in waits)
        top = sm_free[sm_of[i]]
        ready = max((max(finished[c]) + HANDOFF for c in waits), default=top)
        waited = max(top, ready)
        d = waited + BODY[E.OPS[int(w[E.W_OP])]]
        stamps[pos[i]] = (top, waited, d)
        sm_free[sm_of[i]] = d
        done[i] = d
        finished.setdefault(int(w[E.W_SIGNAL]), []).append(d)
    return stamps


@pytest.fixture(scope="module")
def enc():
    one_argmax = attrs.evolve(CUDA_DEFAULT, fusion=VM_FUSIONS, argmax_rows_per_task=4096)  # one argmax stage instance
    return E.encode(lower(tiny_model("llama"), one_argmax, host().get("gpus", "h200"), 5))


def test_timeline_and_stage_table_on_a_simulated_step(enc):
    stamps = _simulate(enc)
    tl = timeline(enc, stamps)
    assert len(tl) == len(enc.tasks)
    assert min(t.top for t in tl) == 0 and all(t.top <= t.waited <= t.done for t in tl)
    rows, step_us = stage_table(tl)
    assert step_us == pytest.approx((stamps[:, 2].max() - stamps[:, 0].min()) / 1e3)
    assert sum(r.total_us for r in rows) == pytest.approx(step_us)
    kinds = {r.kind: r for r in rows}
    # the tiny llama has 2 layers: one instance per layer; every instance but the first waits for its producers
    assert kinds["attention l#.attn"].instances == 2
    assert kinds["rmsnorm_gemv_silu_mul l#.act"].body_us == pytest.approx(9.0)
    assert kinds["gemv l#.h_mid"].handoff_us == pytest.approx(HANDOFF / 1e3)
    assert kinds["argmax next_token"].increment_us == pytest.approx((HANDOFF + 1500) / 1e3)
    assert kinds["argmax next_token"].handoff_share_us == pytest.approx(HANDOFF / 1e3)
    assert 0 < sum(r.handoff_share_us for r in rows) < step_us
    lines = format_table(rows, step_us)
    assert lines[0].split()[:2] == ["stage", "kind"] and len(lines) == len(rows) + 2


def test_timeline_refuses_incomplete_stamps(enc):
    stamps = _simulate(enc)
    stamps[3] = 0
    with pytest.raises(ValueError, match="no stamps"):
        timeline(enc, stamps)
    with pytest.raises(ValueError, match="queue entries"):
        timeline(enc, stamps[:5])


def test_trace_build_has_no_spills():
    for defines in (("AMK_TRACE=1",), (*B.config_defines(CUDA_DEFAULT), "AMK_TRACE=1")):
        info = B.build(512, defines=defines)
        assert info.spill_stores == 0 and info.spill_loads == 0, (defines, info.ptxas_log)


@pytest.mark.gpu
@pytest.mark.parametrize("steps_per_launch", [1, 8])
def test_traced_generation_same_tokens_and_causal_waits(steps_per_launch, tmp_path, cuda_device):
    """CUDA_DEFAULT built with AMK_TRACE: the same tokens as without it; in the last step's stamps every task's waits
    hold after the last producer of each counter stored its outputs (%globaltimer is one clock for every SM)."""
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch
    from mosaic_amk.tiny_models import make_checkpoint

    model = hf_gpu.load_bf16(make_checkpoint(tmp_path / "llama", "llama"))
    spec = hf_gpu.spec_of(model)
    weights = weights_from_torch(model, spec)
    gpu = host().get("gpus", "h200")
    plain = CudaVM(spec, CUDA_DEFAULT, gpu, weights=weights, max_positions=64)
    traced = CudaVM(spec, CUDA_DEFAULT, gpu, weights=weights, max_positions=64, trace=True)
    want, _ = plain.generate([3, 17, 42], 16, logits=False, steps_per_launch=steps_per_launch)
    got, _ = traced.generate([3, 17, 42], 16, logits=False, steps_per_launch=steps_per_launch)
    assert got == want
    tl = timeline(traced.enc, traced.launcher.trace_stamps())
    assert all(t.top <= t.waited <= t.done for t in tl)
    late = [t for t in tl if t.producers_done is not None and t.waited < t.producers_done]
    assert not late, late[:3]
    rows, step_us = stage_table(tl)
    assert 0 < step_us < 10_000 and sum(r.total_us for r in rows) == pytest.approx(step_us)
