"""The scheduling semantics, executed: an independent dynamic oracle for schedules.

This module deliberately shares no analysis code with :mod:`mosaic_amk.validate`: it runs the SM
queues under seeded interleavings and watches what happens, where the validator reasons statically.
The audit uses it to label mutants (a false accept is a schedule this oracle shows unsafe and the
validator accepts).

Semantics (docs/amk-schedule.md): counters start at zero; each SM walks its tasks in list order; a task
runs once every wait ``counter >= threshold`` holds, then increments its ``signal`` counter by one.
What the oracle reports (each a :class:`Finding`):

- ``fault``: what the VM's loader or a task would hit before any ordering question: an SM, counter or
  buffer that does not exist, a task descriptor over the ABI's fixed slots (8 inputs, 4 outputs,
  8 waits, rank 4), an unknown op or missing parameter, an access outside a buffer, or (with
  ``run_task``) an exception from the op itself;
- ``deadlock``: no SM can make progress and some have tasks left (the watchdog);
- ``race``: two accesses to overlapping elements of one buffer, at least one a write, by different
  tasks, not ordered by happens-before in this execution. Happens-before is tracked with per-SM
  knowledge sets (bitsets of finished tasks, a vector clock at task granularity): a signal releases
  the SM's knowledge into the counter's history; a wait that passes at threshold ``t`` acquires only
  what the first ``t`` increments released (the weakest observation a real acquire load may make);
- ``uninitialized``: a read of activation/scratch/output elements that no write ordered before it
  covers;
- ``unwritten-output``: an output buffer with elements no task wrote.

The page protocol (docs/amk-schedule.md "Pages"), when a schedule has it: each SM also runs a *loader* agent that
walks the SM's queue ahead of the compute warps and makes each task's fills in order, waiting only on the fills'
own waits (acquiring what their first ``t`` increments released, like a task). A compute warp reading a page waits
for the fill it reads (the latest acquire of that page on its SM at or before the task: the page's full barrier)
and acquires the loader's knowledge at that fill; a release hands the page back (its contents are undefined from
then on). Shadow state per page: the fill it holds (owner and what the loader knew), released or not, and the
reads of that fill. Findings:

- ``page-race`` (a reuse race): a fill overwrites a page while a read of its previous contents is not ordered
  before it, or a task reads a page whose current fill is not ordered before the read;
- ``page-unfilled``: a task reads a page that no fill wrote, that was released, or that holds no rows of its
  inputs;
- ``fill-unwritten`` (a fill that reads data not yet written): a fill reads elements whose writer is not ordered
  before it (or that nothing wrote), a later writer of elements a fill read is not ordered after the fill, or a task
  reads a page filled before a write of those rows that the task itself sees (the page is stale);
- ``fault`` for what the loader would hit (a page outside the SM's pool or a pool larger than shared memory, a
  fill larger than a page or outside its buffer, too many page operations or fill waits, a fill waiting on a counter
  that does not exist), ``deadlock`` when a loader is stuck too.

Footprints: the op's declared footprint (``ops.OpSpec.footprint``, flattened element intervals; the
one declaration the validator reads too), never the schedule's ``ranges`` (which the oracle ignores, so
a lying ``ranges`` shows up as a race). The declaration itself is not trusted: the *probe*
(:func:`probe_footprint`) runs the op's numpy semantics (``ops.KERNELS``, what the ReferenceVM runs) on
random data with sentinel-filled outputs and NaN-poisoned inputs outside the declared read intervals,
and a task whose op writes outside (or leaves unwritten part of) its declared write interval, or whose
outputs change when elements outside its read intervals change, is a ``fault``. So a wrong declaration
shows up here as an unsafe schedule the validator (which trusts it) accepts: a false accept in the audit.

Interleavings: ``random`` (a ready SM uniformly at random each step), ``priority`` (a random fixed
priority per SM; always the highest ready one, which starves the others as long as possible) and
``pct`` (priority with random change points that demote the running SM, as in PCT testing).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from math import prod
from typing import Any

import attrs
import numpy as np
from mosaic.errors import MosaicError

from mosaic_amk import ops as _ops
from mosaic_amk.schedule import (
    MAX_INPUTS,
    MAX_OUTPUTS,
    MAX_PAGE_OPS,
    MAX_POOL_BYTES,
    MAX_RANK,
    MAX_WAITS,
    Schedule,
    Task,
    row_bytes,
)

STRATEGIES = ("random", "priority", "pct")
_INITIALISED = frozenset(("weight", "input", "kv_cache"))


@attrs.frozen
class Finding:
    kind: str  # fault | deadlock | race | uninitialized | unwritten-output
    tasks: tuple = ()
    buffer: str | None = None
    message: str = ""

    def line(self) -> str:
        where = f" tasks {list(self.tasks)}" if self.tasks else ""
        buf = f" buffer {self.buffer}" if self.buffer else ""
        return f"[{self.kind}]{where}{buf}: {self.message}"

    def to_json(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen
class Execution:
    """One interleaving: the task ids in the order they ran, and what went wrong."""

    strategy: str
    seed: int
    order: tuple = ()
    findings: tuple = ()
    completed: bool = False

    @property
    def safe(self) -> bool:
        return not self.findings


@attrs.frozen
class Verdict:
    """The oracle's label over several interleavings: unsafe if any of them found anything."""

    safe: bool
    runs: int
    findings: tuple = ()

    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}


# ----------------------------------------------------------------------------------------------- loading

class _Loaded:
    """The schedule as the VM's loader sees it: per-SM queues of packed descriptors, or faults."""

    def __init__(self, s: Schedule, probe: bool = True):
        self.s = s
        self.probe = probe
        self.faults: list[Finding] = []
        bufs: dict[str, Any] = {}
        for b in s.buffers:
            bufs.setdefault(b.name, b)
        self.bufs = bufs
        self.numel = {n: (prod(b.shape) if b.shape else 1) for n, b in bufs.items()}
        self.queues: list[list[int]] = [[] for _ in range(max(s.num_sms, 0))]
        self.foot: list[list[tuple[str, int, int, bool]]] = []
        n_ok_counter = s.num_counters
        fault = self.faults.append
        for i, t in enumerate(s.tasks):
            tid = (t.id,)
            if not 0 <= t.sm < s.num_sms:
                fault(Finding("fault", tid, None, f"task placed on SM {t.sm}; the grid has {s.num_sms}"))
            else:
                self.queues[t.sm].append(i)
            if len(t.inputs) > MAX_INPUTS or len(t.outputs) > MAX_OUTPUTS or len(t.waits) > MAX_WAITS:
                fault(Finding("fault", tid, None, "task descriptor overflows the VM's fixed slots"))
            for c in (t.signal, *(w.counter for w in t.waits)):
                if not 0 <= c < n_ok_counter:
                    fault(Finding("fault", tid, None, f"counter {c} outside the {n_ok_counter} counters"))
            for name in (*t.inputs, *t.outputs):
                b = bufs.get(name)
                if b is None:
                    fault(Finding("fault", tid, name, "buffer does not exist"))
                elif len(b.shape) > MAX_RANK:
                    fault(Finding("fault", tid, name, f"rank {len(b.shape)} does not fit the descriptor"))
            foot, problem = self._footprint(t)
            if problem:
                fault(Finding("fault", tid, None, problem))
            self.foot.append(foot)
        for name in s.outputs:
            if name not in bufs:
                fault(Finding("fault", (), name, "output buffer does not exist"))
        self.paged = any(t.pages is not None for t in s.tasks) or bool(s.page_pools)
        if self.paged:
            self._load_pages()

    def _load_pages(self) -> None:
        """The loader's program per SM (its fills in queue order) and, per task, the fill each page use reads (the
        latest acquire of that page on the SM at or before the task), or the faults the loader would hit."""
        s, bufs, fault = self.s, self.bufs, self.faults.append
        pools: dict[int, tuple[int, int]] = {}
        for pool in s.page_pools:
            if not 0 <= pool.sm < s.num_sms or pool.sm in pools:
                fault(Finding("fault", (), None, f"page pool for SM {pool.sm}: no such SM, or a second pool"))
            elif pool.count < 1 or pool.page_bytes < 1 or pool.count * pool.page_bytes > MAX_POOL_BYTES:
                fault(Finding("fault", (), None, f"page pool of SM {pool.sm} ({pool.count} x {pool.page_bytes} "
                                                 "bytes) does not fit an SM's shared memory"))
            else:
                pools[pool.sm] = (pool.count, pool.page_bytes)
        # fills: (task index, sm, page, buffer, element lo, element hi, waits); loader programs; uses
        self.fills: list[tuple] = []
        self.program: list[list[int]] = [[] for _ in range(max(s.num_sms, 0))]
        self.uses: list[list[tuple[int, int | None]]] = []  # per task: (page, fill it reads or None)
        latest: dict[tuple[int, int], int] = {}
        for i, t in enumerate(s.tasks):
            pg = t.pages
            tid = (t.id,)
            if pg is None:
                self.uses.append([])
                continue
            if max(len(pg.acquire), len(pg.use), len(pg.release)) > MAX_PAGE_OPS:
                fault(Finding("fault", tid, None, "page operations overflow the task descriptor"))
            pool = pools.get(t.sm)
            for fl in pg.acquire:
                b = bufs.get(fl.buffer)
                lo, hi = fl.rows
                if len(fl.waits) > MAX_WAITS:
                    fault(Finding("fault", tid, None, "a fill's waits overflow the descriptor"))
                if any(not 0 <= w.counter < s.num_counters for w in fl.waits):
                    fault(Finding("fault", tid, None, "a fill waits on a counter that does not exist"))
                if b is None or not b.shape or not 0 <= lo < hi <= b.shape[0]:
                    fault(Finding("fault", tid, fl.buffer, f"fill of rows [{lo}, {hi}) of a buffer without them"))
                    continue
                if pool is None or not 0 <= fl.page < pool[0]:
                    fault(Finding("fault", tid, fl.buffer, f"fill of page {fl.page}, outside SM {t.sm}'s pool"))
                    continue
                if (hi - lo) * row_bytes(b.dtype, b.shape) > pool[1]:
                    fault(Finding("fault", tid, fl.buffer, f"fill of {(hi - lo) * row_bytes(b.dtype, b.shape)} "
                                                          f"bytes into a {pool[1]}-byte page"))
                    continue
                per_row = prod(b.shape[1:]) if len(b.shape) > 1 else 1
                fid = len(self.fills)
                self.fills.append((i, t.sm, fl.page, fl.buffer, lo * per_row, hi * per_row, fl.waits))
                if 0 <= t.sm < s.num_sms:
                    self.program[t.sm].append(fid)
                latest[(t.sm, fl.page)] = fid
            self.uses.append([(p, latest.get((t.sm, p))) for p in pg.use])

    def _footprint(self, t: Task) -> tuple[list, str | None]:
        spec = _ops.OP_SPECS.get(t.op)
        if spec is None:
            return [], f"unknown op {t.op!r}"
        p = t.params
        missing = [k for k in spec.params if k not in p]
        if missing:
            return [], f"{t.op} missing parameter(s) {missing}"
        if len(t.inputs) != len(spec.input_roles(p)) or len(t.outputs) != len(spec.outputs):
            return [], f"{t.op} given {len(t.inputs)} inputs/{len(t.outputs)} outputs"
        bufs = self.bufs
        if any(n not in bufs for n in (*t.inputs, *t.outputs)):
            return [], None  # already a fault
        if spec.writes == "kv_slot" and bufs[t.outputs[0]].kind != "kv_cache":
            return [], f"{t.op} appends into {t.outputs[0]}, which is not a KV cache"
        try:
            got = spec.footprint(p, [bufs[n].shape for n in t.inputs], [bufs[n].shape for n in t.outputs])
        except (TypeError, ValueError, ZeroDivisionError, KeyError, IndexError) as exc:
            return [], f"{t.op} parameters unusable: {exc}"
        if isinstance(got, str):
            return [], f"{t.op}: {got}"
        k = len(t.inputs)
        region: dict[tuple[str, bool], tuple[int, int]] = {}  # a buffer in two roles: the hull of both
        for j, (n, (lo, hi)) in enumerate(zip((*t.inputs, *t.outputs), got, strict=True)):
            if lo < 0 or hi > self.numel[n]:
                return [], f"{t.op} touches elements [{lo}, {hi}) of {n} ({self.numel[n]} elements)"
            if hi <= lo:
                continue
            old = region.get((n, j >= k))
            region[(n, j >= k)] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)
        if self.probe:
            problem = probe_footprint(t.op, p, [bufs[n] for n in t.inputs], [bufs[n] for n in t.outputs], got)
            if problem:
                return [], problem
        foot = [(n, lo, hi, write) for (n, write), (lo, hi) in region.items()]
        foot.sort(key=lambda a: a[3])  # reads first, then writes
        return foot, None


# ----------------------------------------------------------------------------------------------- the probe

_PROBED: dict[Any, str | None] = {}
_NP = {"f32": np.float32, "i32": np.int32}


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return (type(v).__name__, v)


def probe_footprint(op: str, params: Any, ins: list, outs: list, declared: list) -> str | None:
    """Run the op itself (``ops.KERNELS``, the ReferenceVM's numpy semantics) on random data and check
    its declared footprint at element level: every output element inside the declared write interval
    is written and none outside (outputs start as a sentinel), and the outputs do not change when every
    input element outside the declared read interval is replaced (NaN, or a flipped integer). Returns
    the problem, or None. Memoised per (op, params, buffer shapes and dtypes, declaration)."""
    key = (op, _freeze(params), tuple((tuple(b.shape), b.dtype) for b in ins),
           tuple((tuple(b.shape), b.dtype) for b in outs), tuple(map(tuple, declared)))
    if key not in _PROBED:
        _PROBED[key] = _probe(op, params, ins, outs, declared)
    return _PROBED[key]


def _probe(op: str, params: Any, ins: list, outs: list, declared: list) -> str | None:
    kernel = _ops.KERNELS.get(op)
    if kernel is None or any(b.dtype not in _NP for b in (*ins, *outs)):
        return None  # nothing the numpy semantics run: the op cannot be probed here
    rng = np.random.default_rng(0)

    def fill(b):
        if b.dtype == "i32":
            return rng.integers(0, 2, b.shape).astype(np.int32)
        return rng.standard_normal(b.shape).astype(np.float32)

    def fresh():
        return [np.full(b.shape, np.nan if b.dtype == "f32" else -7, _NP[b.dtype]) for b in outs]

    def run(arrays):
        o = fresh()
        with np.errstate(all="ignore"):
            kernel(arrays, o, params)
        return o

    a = [fill(b) for b in ins]
    k = len(ins)
    try:
        first = run(a)
    except Exception as exc:  # noqa: BLE001 - an op that crashes on in-bounds data is a fault
        return f"{op} raised {type(exc).__name__}: {exc}"
    for j, o in enumerate(first):
        lo, hi = declared[k + j]
        flat = o.reshape(-1)
        written = ~np.isnan(flat) if outs[j].dtype == "f32" else flat != -7
        if written[:lo].any() or written[hi:].any():
            return f"{op} writes {outs[j].name} outside its declared footprint [{lo}, {hi})"
        if not written[lo:hi].all():
            return f"{op} leaves elements of its declared write footprint [{lo}, {hi}) of {outs[j].name} unwritten"
    b = []
    for j, arr in enumerate(a):
        lo, hi = declared[j]
        arr = arr.copy()
        flat = arr.reshape(-1)
        if ins[j].dtype == "f32":
            flat[:lo], flat[hi:] = np.nan, np.nan
        else:
            flat[:lo], flat[hi:] = 1 - flat[:lo], 1 - flat[hi:]
        b.append(arr)
    try:
        second = run(b)
    except Exception:  # noqa: BLE001
        return f"{op} reads outside its declared footprint (fails when those elements change)"
    for j, (x, y) in enumerate(zip(first, second, strict=True)):
        if not np.array_equal(x, y, equal_nan=True):
            return f"{op} reads outside its declared footprint ({outs[j].name} changes when they change)"
    return None


# ----------------------------------------------------------------------------------------------- running

def execute(schedule: Schedule, *, seed: int = 0, strategy: str = "random",
            run_task: Callable[[Task], None] | None = None, stop_at_first: bool = True) -> Execution:
    """Run the schedule's SM queues under one seeded interleaving. ``run_task(task)`` (for instance the
    ReferenceVM's numpy op) is called when a task runs; without it only ordering is checked."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    return _run(_Loaded(schedule), seed, strategy, run_task, stop_at_first)


def _run(ld: _Loaded, seed: int, strategy: str, run_task, stop_at_first: bool) -> Execution:
    if ld.faults:
        return Execution(strategy, seed, (), tuple(ld.faults), False)
    s = ld.s
    tasks = s.tasks
    n = len(tasks)
    rng = random.Random(seed)
    findings: list[Finding] = []
    counters = [0] * s.num_counters
    hist: list[list[int]] = [[0] for _ in range(s.num_counters)]
    queues = ld.queues
    nsm = len(queues)
    head = [0] * nsm
    # agents: the SMs' compute warps 0 .. nsm-1, and with pages each SM's loader nsm + sm
    paged = ld.paged
    n_agents = 2 * nsm if paged else nsm
    know = [0] * n_agents
    waiting_on: dict[int, list[int]] = {}
    ready: list[int] = []
    prio = [rng.random() for _ in queues]
    change_points = sorted(rng.randrange(max(len(tasks), 1)) for _ in range(3)) if strategy == "pct" else []
    shadow: dict[str, list[tuple[int, int, int, bool]]] = {}
    init_kind = {n: b.kind in _INITIALISED for n, b in ld.bufs.items()}
    order: list[int] = []
    if paged:
        prio += [rng.random() for _ in queues]
        fills, program, uses = ld.fills, ld.program, ld.uses
        lhead = [0] * nsm
        fill_know: dict[int, int] = {}  # fill -> the loader's knowledge once it is done (its own bit included)
        waiting_fill: dict[int, list[int]] = {}
        # per (sm, page): [the fill it holds or None, released since?, the reads of that fill (event bits)]
        pshadow: dict[tuple[int, int], list] = {}

    def arm(agent: int) -> None:
        if agent >= nsm:  # a loader: its next fill's waits
            sm = agent - nsm
            if lhead[sm] >= len(program[sm]):
                return
            for w in fills[program[sm][lhead[sm]]][6]:
                if counters[w.counter] < w.threshold:
                    waiting_on.setdefault(w.counter, []).append(agent)
                    return
            ready.append(agent)
            return
        q = queues[agent]
        if head[agent] >= len(q):
            return
        i = q[head[agent]]
        for w in tasks[i].waits:
            if counters[w.counter] < w.threshold:
                waiting_on.setdefault(w.counter, []).append(agent)
                return
        if paged:
            for _, fid in uses[i]:  # the fills its page reads need (the full barrier of each page)
                if fid is not None and fid not in fill_know:
                    waiting_fill.setdefault(fid, []).append(agent)
                    return
        ready.append(agent)

    for agent in range(n_agents):
        arm(agent)
    steps = 0
    while ready:
        if strategy == "random":
            k = rng.randrange(len(ready))
        else:
            k = max(range(len(ready)), key=lambda j: prio[ready[j]])
        agent = ready[k]
        ready[k] = ready[-1]
        ready.pop()
        if agent >= nsm:
            sm = agent - nsm
            fid = program[sm][lhead[sm]]
            kn = know[agent]
            for w in fills[fid][6]:
                if w.threshold >= 1:
                    kn |= hist[w.counter][w.threshold]
            _fill(fid, n, tasks, fills, kn, shadow, pshadow, init_kind, findings)
            kn |= 1 << (n + fid)
            know[agent] = fill_know[fid] = kn
            lhead[sm] += 1
            arm(agent)
            for other in waiting_fill.pop(fid, ()):
                arm(other)
            if findings and stop_at_first:
                return Execution(strategy, seed, tuple(order), tuple(findings), False)
            continue
        sm = agent
        i = queues[sm][head[sm]]
        t = tasks[i]
        kn = know[sm]
        for w in t.waits:
            if w.threshold >= 1:
                kn |= hist[w.counter][w.threshold]
        if paged:
            for _, fid in uses[i]:
                if fid is not None:
                    kn |= fill_know[fid]
            _read_pages(i, n, tasks, fills, uses[i], kn, fill_know, shadow, pshadow, findings)
        _check_accesses(i, tasks, ld.foot[i], kn, shadow, init_kind, findings, n, fills if paged else ())
        if run_task is not None:
            try:
                run_task(t)
            except Exception as exc:  # noqa: BLE001 - an op that crashes is a fault of this schedule
                findings.append(Finding("fault", (t.id,), None, f"{t.op} raised {type(exc).__name__}: {exc}"))
        kn |= 1 << i
        know[sm] = kn
        if paged and t.pages is not None:
            for p in t.pages.release:  # the page goes back to the pool: its contents are undefined from now on
                pshadow.setdefault((sm, p), [None, True, []])[1] = True
        order.append(t.id)
        c = t.signal
        counters[c] += 1
        hist[c].append(hist[c][-1] | kn)
        head[sm] += 1
        arm(sm)
        for other in waiting_on.pop(c, ()):
            arm(other)
        steps += 1
        if strategy == "pct" and change_points and steps == change_points[0]:
            change_points.pop(0)
            prio[sm] = -rng.random()  # demote the SM that just ran
        if findings and stop_at_first:
            return Execution(strategy, seed, tuple(order), tuple(findings), False)
    blocked = [sm for sm in range(nsm) if head[sm] < len(queues[sm])]
    loaders = [sm for sm in range(nsm) if paged and lhead[sm] < len(program[sm])]
    if blocked or loaders:
        heads = tuple(tasks[queues[sm][head[sm]]].id for sm in blocked)
        waits = {tasks[queues[sm][head[sm]]].id: [(w.counter, w.threshold, counters[w.counter])
                                                 for w in tasks[queues[sm][head[sm]]].waits
                                                 if counters[w.counter] < w.threshold] for sm in blocked}
        stuck = f"; loaders of SMs {loaders} blocked on a fill" if loaders else ""
        findings.append(Finding("deadlock", heads, None,
                                f"no SM can progress; blocked heads (counter, threshold, value): {waits}{stuck}"))
        return Execution(strategy, seed, tuple(order), tuple(findings), False)
    for name in s.outputs:
        if not init_kind.get(name, False) and not _covered(shadow.get(name, ()), 0, ld.numel[name], -1):
            findings.append(Finding("unwritten-output", (), name, "output elements no task wrote"))
        elif init_kind.get(name) and not any(a[3] for a in shadow.get(name, ())):
            findings.append(Finding("unwritten-output", (), name, "no task wrote this output"))
    return Execution(strategy, seed, tuple(order), tuple(findings), not findings)


def _ids(j: int, n: int, tasks, fills) -> int:
    """The task id of an event: a task, or (a fill) the task that acquired it."""
    return tasks[j].id if j < n else tasks[fills[j - n][0]].id


def _fill(fid: int, n: int, tasks, fills, kn: int, shadow, pshadow, init_kind, findings) -> None:
    """The loader fills a page: it overwrites the page (every read of its previous contents must be ordered before:
    else a reuse race) and reads rows of a buffer (whose writers must be ordered before: else it read data not yet
    written; the read stays in the buffer's shadow, so a later unordered writer is caught too)."""
    i, sm, page, name, lo, hi, _ = fills[fid]
    me = n + fid
    st = pshadow.setdefault((sm, page), [None, False, []])
    late = [r for r in st[2] if not (kn >> r) & 1]
    if late:
        findings.append(Finding("page-race", (tasks[i].id, *sorted({tasks[r].id for r in late})), name,
                                f"fill of page {page} of SM {sm} overwrites it while reads of its previous contents "
                                "are not ordered before the fill (reuse race)"))
    st[0], st[1], st[2] = fid, False, []
    if hi <= lo:
        return
    acc = shadow.setdefault(name, [])
    racing = [j for (j, a_lo, a_hi, a_w) in acc if a_w and a_lo < hi and lo < a_hi and not (kn >> j) & 1]
    if racing:
        findings.append(Finding("fill-unwritten", (tasks[i].id, *sorted({_ids(j, n, tasks, fills) for j in racing})),
                                name, f"fill of page {page} reads elements [{lo}, {hi}) unordered with their writer "
                                      "(it may run ahead of the data)"))
    elif not init_kind[name] and not _covered(acc, lo, hi, kn):
        findings.append(Finding("fill-unwritten", (tasks[i].id,), name,
                                f"fill of page {page} reads elements [{lo}, {hi}) no earlier write covers"))
    acc.append((me, lo, hi, False))


def _read_pages(i: int, n: int, tasks, fills, uses, kn: int, fill_know, shadow, pshadow, findings) -> None:
    """A task reads its pages: each must hold a fill ordered before the read (not released since) of rows of one of
    its inputs, and that fill must have seen every write of those rows the task itself sees."""
    t = tasks[i]
    for page, _ in uses:
        st = pshadow.get((t.sm, page))
        if st is None or st[0] is None:
            findings.append(Finding("page-unfilled", (t.id,), None, f"reads page {page}, which no fill wrote"))
            continue
        fid = st[0]
        fi, _, _, name, lo, hi, _ = fills[fid]
        if st[1]:
            findings.append(Finding("page-unfilled", (t.id,), name, f"reads page {page} after it was released"))
        elif not (kn >> (n + fid)) & 1:
            findings.append(Finding("page-race", (t.id, tasks[fi].id), name,
                                    f"reads page {page}, whose fill (acquired by task {tasks[fi].id}) is not ordered "
                                    "before the read (reuse race)"))
        elif name not in t.inputs:
            findings.append(Finding("page-unfilled", (t.id,), name, f"reads page {page}, which holds {name}, not one "
                                                                    "of its inputs"))
        else:
            seen = fill_know[fid]
            stale = [j for (j, a_lo, a_hi, a_w) in shadow.get(name, ())
                     if a_w and a_lo < hi and lo < a_hi and (kn >> j) & 1 and not (seen >> j) & 1]
            if stale:
                findings.append(Finding("fill-unwritten", (t.id, tasks[fi].id, *sorted(tasks[j].id for j in stale)),
                                        name, f"reads page {page}, filled before writes of {name} it sees (the fill "
                                              "read data not yet written)"))
        st[2].append(i)


def _check_accesses(i: int, tasks, foot, kn: int, shadow, init_kind, findings, n: int = 0, fills=()) -> None:
    t = tasks[i]
    for name, lo, hi, write in foot:
        acc = shadow.setdefault(name, [])
        racing = [j for (j, a_lo, a_hi, a_w) in acc
                  if j != i and (write or a_w) and a_lo < hi and lo < a_hi and not (kn >> j) & 1]
        if racing:
            what = "write" if write else "read"
            others = (t.id, *sorted({_ids(j, n, tasks, fills) if fills else tasks[j].id for j in racing}))
            if fills and all(j >= n for j in racing):  # only loader fills read these elements before
                findings.append(Finding("fill-unwritten", others, name, f"{t.op} writes elements [{lo}, {hi}) that a "
                                        "fill not ordered before it loads (the fill may read data not yet written)"))
            else:
                findings.append(Finding("race", others, name,
                                        f"{t.op} {what}s elements [{lo}, {hi}) unordered with a conflicting access"))
        elif not write and not init_kind[name] and not _covered(acc, lo, hi, kn):
            findings.append(Finding("uninitialized", (t.id,), name,
                                    f"{t.op} reads elements [{lo}, {hi}) no earlier write covers"))
        if write:  # accesses this write supersedes (ordered before it, inside it) are no longer needed
            acc[:] = [a for a in acc if not (lo <= a[1] and a[2] <= hi and (kn >> a[0]) & 1 and a[0] != i)]
        acc.append((i, lo, hi, write))


def _covered(acc, lo: int, hi: int, kn: int) -> bool:
    """Do writes in ``acc`` ordered before (in ``kn``; ``kn=-1``: all) cover elements [lo, hi)?"""
    spans = sorted((a_lo, a_hi) for (j, a_lo, a_hi, a_w) in acc if a_w and (kn == -1 or (kn >> j) & 1))
    reach = lo
    for a_lo, a_hi in spans:
        if a_lo > reach:
            break
        reach = max(reach, a_hi)
        if reach >= hi:
            return True
    return reach >= hi


def explore(schedule: Schedule, *, runs: int = 6, seed: int = 0,
            run_task_factory: Callable[[], Callable[[Task], None]] | None = None) -> Verdict:
    """Label a schedule: run up to ``runs`` interleavings (cycling random, priority, pct) and stop at
    the first that finds anything. ``run_task_factory()`` gives a fresh ``run_task`` per run."""
    ld = _Loaded(schedule)
    if ld.faults:
        return Verdict(False, 0, tuple(ld.faults))
    for k in range(runs):
        strategy = STRATEGIES[k % len(STRATEGIES)]
        ex = _run(ld, seed * 1_000_003 + k, strategy, run_task_factory() if run_task_factory else None, True)
        if ex.findings:
            return Verdict(False, k + 1, ex.findings)
    return Verdict(True, runs, ())


class ScheduleUnsafe(MosaicError):
    """An interleaving of the schedule deadlocked, raced or faulted (exit 1)."""

    exit_code = 1


def interleaving(seed: int = 0, strategy: str = "random") -> Callable[[Schedule, Callable[[Task], None]], Execution]:
    """An ``executor(schedule, run_task)`` for :meth:`ReferenceVM.run`: runs the tasks in one seeded
    interleaving of the SM queues and raises :class:`ScheduleUnsafe` on any finding."""

    def run(schedule: Schedule, run_task: Callable[[Task], None]) -> Execution:
        ex = execute(schedule, seed=seed, strategy=strategy, run_task=run_task)
        if ex.findings:
            raise ScheduleUnsafe(ex.findings[0].line(), f"interleaving {strategy} seed {seed}")
        return ex

    return run
