"""Small schedules for testing the VM piece by piece: one op split over SMs (micro-kernel checks and
their bandwidth floors), a chain of counter hand-offs, and a planted deadlock. All are built as real
Schedules, so they go through the same validator gate, encoder and launcher as a model's schedule."""

from __future__ import annotations

from collections.abc import Sequence

from mosaic_amk.schedule import Buffer, Schedule, Task, Wait


def split_rows(n: int, parts: int, align: int = 8) -> list[tuple[int, int]]:
    """[lo, hi) row ranges covering n rows in at most ``parts`` pieces of a multiple of ``align`` rows."""
    per = -(-n // parts)
    step = -(-per // align) * align
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def op_schedule(op: str, buffers: Sequence[Buffer], inputs: Sequence[str], outputs: Sequence[str],
                params: dict, num_sms: int, rows: Sequence[tuple[int, int]] | None = None,
                row_buffers: Sequence[str] = (), extra_ranges: dict | None = None,
                argmax_of: str | None = None, position: int | None = None) -> Schedule:
    """One op, optionally split into row tasks (one per SM, round robin) that all signal counter 0;
    with ``argmax_of`` an argmax task on SM 0 waits for them all (an all-join) and signals counter 1."""
    tasks = []
    for i, (lo, hi) in enumerate(rows or [(None, None)]):
        p = dict(params)
        ranges = dict(extra_ranges or {})
        if lo is not None:
            p.update(row_start=lo, row_end=hi)
            ranges.update({b: (lo, hi) for b in row_buffers})
        tasks.append(Task(id=i, op=op, sm=i % num_sms, inputs=tuple(inputs), outputs=tuple(outputs), waits=(),
                          signal=0, params=p, ranges=ranges))
    counters = 1
    if argmax_of:
        tasks.append(Task(id=len(tasks), op="argmax", sm=0, inputs=(argmax_of,), outputs=("next_token",),
                          waits=(Wait(0, len(tasks)),), signal=1, params={}))
        counters = 2
    outs = tuple(dict.fromkeys(list(outputs) + (["next_token"] if argmax_of else [])))
    meta = {"position": position} if position is not None else {}
    return Schedule(num_sms=num_sms, buffers=tuple(buffers), num_counters=counters, tasks=tuple(tasks),
                    outputs=outs, meta=meta)


def handoff_chain(n: int, sms: Sequence[int], num_sms: int) -> Schedule:
    """n tiny ``add`` tasks in a chain (task i waits for task i-1's counter, signals its own), placed
    round robin on ``sms``: with one SM every hand-off stays on it; with two, every hand-off crosses SMs."""
    bufs = [Buffer("a", "f32", (1,), "input"), Buffer("b", "f32", (1,), "input")]
    bufs += [Buffer(f"y{i}", "f32", (1,), "output" if i == n - 1 else "activation") for i in range(n)]
    tasks = []
    for i in range(n):
        src = "a" if i == 0 else f"y{i - 1}"
        tasks.append(Task(id=i, op="add", sm=sms[i % len(sms)], inputs=(src, "b"), outputs=(f"y{i}",),
                          waits=(Wait(i - 1, 1),) if i else (), signal=i, params={}))
    return Schedule(num_sms=num_sms, buffers=tuple(bufs), num_counters=n, tasks=tuple(tasks), outputs=(f"y{n - 1}",))


def deadlock(num_sms: int) -> Schedule:
    """Two tasks on two SMs, each waiting for the other's counter: a cycle the validator rejects."""
    bufs = (Buffer("a", "f32", (4,), "input"), Buffer("b", "f32", (4,), "input"),
            Buffer("y0", "f32", (4,), "output"), Buffer("y1", "f32", (4,), "output"))
    tasks = (Task(id=0, op="add", sm=0, inputs=("a", "b"), outputs=("y0",), waits=(Wait(1, 1),), signal=0, params={}),
             Task(id=1, op="add", sm=1, inputs=("a", "b"), outputs=("y1",), waits=(Wait(0, 1),), signal=1, params={}))
    return Schedule(num_sms=num_sms, buffers=bufs, num_counters=2, tasks=tasks, outputs=("y0", "y1"))


def raise_threshold(schedule: Schedule, task_index: int) -> Schedule:
    """A copy of ``schedule`` with task ``task_index``'s first wait made unsatisfiable (threshold + 1)."""
    import attrs

    t = schedule.tasks[task_index]
    w = t.waits[0]
    bad = attrs.evolve(t, waits=(Wait(w.counter, w.threshold + 1), *t.waits[1:]))
    tasks = list(schedule.tasks)
    tasks[task_index] = bad
    return attrs.evolve(schedule, tasks=tuple(tasks))
