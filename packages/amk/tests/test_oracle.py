"""The interleaving executor (the dynamic oracle): deadlocks, races, faults, and real lowerings."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from mosaic.plugins import host
from mosaic_amk.config import ScheduleConfig
from mosaic_amk.lowering import lower
from mosaic_amk.reference_vm import ReferenceVM
from mosaic_amk.schedule import Buffer, Schedule, Task, Wait
from mosaic_amk.tiny_models import tiny_model
from mosaic_amk.validate.oracle import STRATEGIES, ScheduleUnsafe, execute, explore, interleaving

G = {"bias": False, "residual": False}


def split_gemv(th: int = 2, reader_sm: int = 2) -> Schedule:
    """Two GEMV row tasks (SMs 0, 1) write halves of y and signal counter 0; an add on reader_sm reads
    all of y after waiting for counter 0 >= th."""
    return Schedule(
        num_sms=3,
        buffers=(Buffer("x", "f32", (4,), "input"), Buffer("w", "f32", (4, 4), "weight"),
                 Buffer("y", "f32", (4,), "activation"), Buffer("o", "f32", (4,), "output")),
        num_counters=2,
        tasks=(Task(0, "gemv", 0, ("x", "w"), ("y",), (), 0, {**G, "row_start": 0, "row_end": 2},
                    {"w": (0, 2), "y": (0, 2)}),
               Task(1, "gemv", 1, ("x", "w"), ("y",), (), 0, {**G, "row_start": 2, "row_end": 4},
                    {"w": (2, 4), "y": (2, 4)}),
               Task(2, "add", reader_sm, ("y", "x"), ("o",), (Wait(0, th),) if th else (), 1, {})),
        outputs=("o",))


def with_task(s: Schedule, i: int, **changes) -> Schedule:
    tasks = list(s.tasks)
    tasks[i] = attrs.evolve(tasks[i], **changes)
    return attrs.evolve(s, tasks=tuple(tasks))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_safe_schedule_runs_every_task_in_a_legal_order(strategy):
    for seed in range(5):
        ex = execute(split_gemv(), seed=seed, strategy=strategy)
        assert ex.safe and ex.completed
        assert sorted(ex.order) == [0, 1, 2] and ex.order[-1] == 2


def test_interleavings_differ_by_seed():
    orders = {execute(split_gemv(), seed=s).order for s in range(20)}
    assert orders == {(0, 1, 2), (1, 0, 2)}


def test_missing_wait_is_a_race_in_some_interleaving():
    v = explore(split_gemv(th=0), runs=8)
    assert not v.safe and v.kinds() <= {"race", "uninitialized"}


def test_first_of_n_is_a_race_in_every_interleaving():
    """threshold 1 of 2 producers: even when both producers happen to finish first, the waiter is only
    ordered after the first increment, so the read of the other half of y is unordered (a race, or,
    when the other producer has not run yet, a read of rows nothing ordered before it wrote)."""
    kinds = set()
    for seed in range(6):
        for strategy in STRATEGIES:
            ex = execute(split_gemv(th=1), seed=seed, strategy=strategy)
            assert len(ex.findings) == 1 and ex.findings[0].buffer == "y"
            kinds.add(ex.findings[0].kind)
    assert kinds == {"race", "uninitialized"}


def test_queue_order_is_enough_without_a_wait():
    s = with_task(with_task(split_gemv(th=0), 1, sm=0), 2, sm=0)  # everything on SM 0: program order
    assert explore(s, runs=6).safe


def test_deadlock_watchdog():
    ex = execute(split_gemv(th=3))
    assert [f.kind for f in ex.findings] == ["deadlock"] and ex.findings[0].tasks == (2,)
    assert "(0, 3, 2)" in ex.findings[0].message  # counter 0, threshold 3, value 2


def test_cross_sm_queue_cycle_deadlocks():
    bufs = (Buffer("x", "f32", (4,), "input"), Buffer("o", "f32", (4,), "output"))
    t = lambda i, sm, waits: Task(i, "add", sm, ("x", "x"), ("o",), waits, i, {})  # noqa: E731
    s = Schedule(2, bufs, 4, (t(0, 0, (Wait(3, 1),)), t(1, 0, ()), t(2, 1, (Wait(1, 1),)), t(3, 1, ())), ("o",))
    assert all(execute(s, seed=k).findings[0].kind == "deadlock" for k in range(4))


@pytest.mark.parametrize("mutate, text", [
    (lambda s: with_task(s, 2, signal=2), "counter 2"),
    (lambda s: with_task(s, 2, waits=(Wait(-1, 1),)), "counter -1"),
    (lambda s: with_task(s, 2, inputs=("y", "ghost")), "does not exist"),
    (lambda s: with_task(s, 2, sm=5), "SM 5"),
    (lambda s: with_task(s, 2, waits=(Wait(0, 2),) * 9), "fixed slots"),
    (lambda s: with_task(s, 1, params={**G, "row_start": 2, "row_end": 5}), "beyond w"),
    (lambda s: with_task(s, 2, op="conv"), "unknown op"),
    (lambda s: with_task(s, 0, params={"row_start": 0}), "missing parameter"),
])
def test_faults_before_running(mutate, text):
    ex = execute(mutate(split_gemv()))
    assert ex.findings and ex.findings[0].kind == "fault" and text in ex.findings[0].message
    assert ex.order == ()


def test_uninitialized_read_and_unwritten_output():
    s = attrs.evolve(split_gemv(), buffers=(*split_gemv().buffers, Buffer("junk", "f32", (4,), "scratch")))
    ex = execute(with_task(s, 2, inputs=("junk", "x")))
    assert [f.kind for f in ex.findings] == ["uninitialized"]
    s2 = attrs.evolve(split_gemv(), buffers=(*split_gemv().buffers, Buffer("o2", "f32", (2,), "output")),
                      outputs=("o", "o2"))
    assert [f.kind for f in execute(s2).findings] == ["unwritten-output"]


def test_oracle_ignores_declared_ranges():
    """Two GEMV tasks whose params overlap (rows 0..3 and 2..4) but whose ranges claim disjoint rows:
    the oracle uses the op's own footprint and reports the write race."""
    s = with_task(split_gemv(), 0, params={**G, "row_start": 0, "row_end": 3})
    assert any(f.kind == "race" for f in explore(s, runs=8).findings)


def test_run_task_callback_sees_every_task_once():
    seen = []
    ex = execute(split_gemv(), seed=3, strategy="pct", run_task=lambda t: seen.append(t.id))
    assert tuple(seen) == ex.order and len(seen) == 3


def test_a_crashing_op_is_a_fault():
    def boom(task):
        if task.id == 1:
            raise ValueError("bad shapes")

    ex = execute(split_gemv(), run_task=boom)
    assert ex.findings[0].kind == "fault" and "bad shapes" in ex.findings[0].message


def test_real_lowerings_are_safe_and_the_vm_matches_list_order():
    gpu = host().get("gpus", "h200")
    spec = tiny_model("smollm2")
    cfg = ScheduleConfig(num_sms=3, gemv_rows_per_task=16, fusion=())
    s = lower(spec, cfg, gpu, 4)
    assert explore(s, runs=9).safe
    ref = ReferenceVM(spec, cfg, gpu).generate([5, 9, 2], 3)
    for seed, strategy in ((0, "random"), (1, "priority"), (2, "pct")):
        got = ReferenceVM(spec, cfg, gpu).generate([5, 9, 2], 3, executor=interleaving(seed, strategy))
        assert got[0] == ref[0]
        assert all(np.array_equal(a, b) for a, b in zip(got[1], ref[1], strict=True))


def test_vm_executor_raises_on_an_unsafe_schedule():
    s = split_gemv(th=1)
    with pytest.raises(ScheduleUnsafe, match="race|uninitialized"):
        interleaving(0)(s, lambda t: None)
