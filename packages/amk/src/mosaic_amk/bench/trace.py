"""The VM's timeline of one decode step, from a cubin built with ``AMK_TRACE=1`` (``CudaVM(trace=True)`` or
``Launcher(trace=True)``): per task, three %globaltimer stamps (vm.cu): the top of its iteration, the moment its
waits held, and the moment its outputs were stored (the signal follows).

:func:`timeline` joins them with the encoding (op, SM, the counters a task waits on and signals); :func:`stage_table`
splits the step's duration into the stages' shares. A stage instance is the set of tasks that signal one counter
(one layer's o-proj, say); instances are ordered by the time their last task finished, and each gets the increment
of that finish time over every earlier instance's, so the increments add up to the step (first top to last
finish). An instance's critical task is the one that finished last: its hand-off is the time from its producers'
last finish to its waits holding (signal, poll, fence), its body the time from there to its outputs stored.
Kinds group the instances of all layers (op plus the output name with its numbers as ``#``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

import attrs
import numpy as np

from mosaic_amk.cuda import encode as E


@attrs.frozen
class TaskTime:
    index: int        # the task's row in the encoding (its schedule position)
    task_id: int      # the schedule's task id
    sm: int
    op: str
    kind: str         # op and output name with numbers as '#', e.g. "gemv l#.h_mid"
    signal: int
    waits: tuple[int, ...]
    top: int          # ns from the step's first top
    waited: int
    done: int
    producers_done: int | None  # the latest finish among the tasks that signal a counter it waits on


@attrs.frozen
class StageRow:
    kind: str
    instances: int        # stage instances of this kind in the step (layers)
    tasks: float          # tasks per instance (mean)
    total_us: float       # the kind's share of the step: the sum of its instances' increments
    increment_us: float   # per instance (mean)
    handoff_us: float     # the critical task's hand-off (mean over instances)
    handoff_share_us: float  # the part of the kind's share that is hand-off: per instance min(increment, hand-off)
    body_us: float        # the critical task's body (mean over instances)
    body_mean_us: float   # every task's body (mean)
    body_max_us: float    # every task's body (max)

    def as_dict(self) -> dict:
        return attrs.asdict(self)


def kind_of(op: str, output: str) -> str:
    return f"{op} {re.sub(r'[0-9]+', '#', output)}"


def timeline(enc: E.Encoded, stamps: np.ndarray) -> list[TaskTime]:
    """The last traced step's tasks, in encoding order. ``stamps``: ``Launcher.trace_stamps()`` (queue entries x 3).
    Raises ValueError when the stamps do not cover every queue entry of the encoding or a task has no stamps (it
    did not run: an aborted launch)."""
    stamps = np.asarray(stamps, np.int64)
    n_queue = int(enc.queue_offsets[-1])
    if stamps.ndim != 2 or stamps.shape[1] != 3 or stamps.shape[0] < n_queue:
        raise ValueError(f"trace stamps of shape {stamps.shape}, the encoding has {n_queue} queue entries x 3")
    sm_of, row = {}, {}
    for s in range(enc.num_sms):
        for q in range(int(enc.queue_offsets[s]), int(enc.queue_offsets[s + 1])):
            sm_of[int(enc.queue[q])] = s
            row[int(enc.queue[q])] = q
    used = stamps[:n_queue]
    if (used == 0).any():
        raise ValueError("a traced task has no stamps (the launch did not run it: aborted, or not traced)")
    t0 = int(used[:, 0].min())
    recs = []
    for i in range(len(sm_of)):
        w = enc.tasks[i]
        q = row[i]
        waits = tuple(int(w[E.W_WAIT + 2 * k]) for k in range(int(w[E.W_NWAIT])))
        out = enc.buffers[int(w[E.W_OUT])].name if int(w[E.W_NOUT]) else ""
        op = E.OPS[int(w[E.W_OP])]
        recs.append((i, int(w[E.W_ID]), sm_of[i], op, kind_of(op, out), int(w[E.W_SIGNAL]), waits,
                     int(stamps[q, 0]) - t0, int(stamps[q, 1]) - t0, int(stamps[q, 2]) - t0))
    done_of: dict[int, int] = {}
    for r in recs:
        done_of[r[5]] = max(done_of.get(r[5], r[9]), r[9])
    return [TaskTime(index=r[0], task_id=r[1], sm=r[2], op=r[3], kind=r[4], signal=r[5], waits=r[6], top=r[7],
                     waited=r[8], done=r[9],
                     producers_done=max((done_of[c] for c in r[6] if c in done_of), default=None))
            for r in recs]


def stage_table(tasks: Sequence[TaskTime]) -> tuple[list[StageRow], float]:
    """Rows per stage kind (largest share first) and the step's duration in us (first top to last finish)."""
    if not tasks:
        raise ValueError("no tasks in the trace")
    by_counter: dict[int, list[TaskTime]] = defaultdict(list)
    for t in tasks:
        by_counter[t.signal].append(t)
    start = min(t.top for t in tasks)
    inst = sorted(by_counter.values(), key=lambda g: max(t.done for t in g))
    acc: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    reached = start
    for g in inst:
        crit = max(g, key=lambda t: t.done)
        inc = max(0, crit.done - reached)
        reached = max(reached, crit.done)
        a = acc[crit.kind]
        a["inc"].append(inc)
        a["tasks"].append(len(g))
        ready = crit.producers_done if crit.producers_done is not None else crit.top
        a["handoff"].append(crit.waited - ready)
        a["hshare"].append(min(inc, max(0, crit.waited - ready)))
        a["body"].append(crit.done - crit.waited)
        a["bodies"].extend(t.done - t.waited for t in g)
    rows = [StageRow(kind=k, instances=len(a["inc"]), tasks=float(np.mean(a["tasks"])),
                     total_us=sum(a["inc"]) / 1e3, increment_us=float(np.mean(a["inc"])) / 1e3,
                     handoff_us=float(np.mean(a["handoff"])) / 1e3, handoff_share_us=sum(a["hshare"]) / 1e3, body_us=float(np.mean(a["body"])) / 1e3,
                     body_mean_us=float(np.mean(a["bodies"])) / 1e3, body_max_us=float(np.max(a["bodies"])) / 1e3)
            for k, a in acc.items()]
    rows.sort(key=lambda r: -r.total_us)
    return rows, (reached - start) / 1e3


def format_table(rows: Sequence[StageRow], step_us: float) -> list[str]:
    """The table ``benchmarks/amk_trace.py`` prints: one line per kind, then the step."""
    head = (f"  {'stage kind':<36}{'n':>4}{'tasks':>7}{'share us':>10}{'%':>6}{'per inst':>10}"
            f"{'hand-off':>10}{'body':>8}{'body avg':>10}{'body max':>10}")
    out = [head]
    for r in rows:
        out.append(f"  {r.kind:<36}{r.instances:>4}{r.tasks:>7.0f}{r.total_us:>10.1f}"
                   f"{100 * r.total_us / step_us if step_us else 0:>6.1f}{r.increment_us:>10.2f}{r.handoff_us:>10.2f}"
                   f"{r.body_us:>8.2f}{r.body_mean_us:>10.2f}{r.body_max_us:>10.2f}")
    out.append(f"  {'step (first top to last finish)':<36}{'':>4}{'':>7}{step_us:>10.1f}")
    return out
