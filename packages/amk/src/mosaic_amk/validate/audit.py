"""The validator audit: adversarial schedules labelled by the dynamic oracle, checked by the validator.

Each schedule is either a *real lowering* (tiny random-init checkpoints of every supported family and an
int8 weight-only one, lowered by ``mosaic_amk.lowering.lower`` under several ScheduleConfigs, SM counts and
positions), a *single-injection mutant* of one (one class per unsafe pattern, below, and one class per
validator rule, ``RULE_CLASSES``, whose mutants break that rule alone; the page rules' classes, ``PAGE_CLASSES``,
mutate the bases lowered with the page protocol), or a *random DAG* (random ops,
buffers, waits, thresholds and SM placement, half of them built disciplined then perturbed once).
The oracle (:func:`mosaic_amk.validate.oracle.explore`, several adversarial interleavings with a deadlock
watchdog and shadow memory) labels each one; the validator gives its verdict. A *false accept* is a
schedule the oracle shows unsafe and the validator accepts: the audit's goal is zero. A schedule the
validator rejects while the oracle saw nothing wrong is counted as *stricter* (the oracle explores a
few interleavings and does not model every rule, e.g. a no-op threshold-0 wait or a lying ``ranges``).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from multiprocessing import get_context

import attrs

from mosaic_amk.schedule import (
    MAX_PAGE_OPS,
    MAX_POOL_BYTES,
    MAX_WAITS,
    Buffer,
    PageFill,
    Schedule,
    Task,
    TaskPages,
    Wait,
    row_bytes,
)
from mosaic_amk.validate import validate
from mosaic_amk.validate.oracle import explore

ORACLE_RUNS = 8
# Control classes: mutations that are safe by construction (moving a task to another SM keeps the list
# topological, so every queue stays a linear extension): the validator must accept them all.
CONTROL = frozenset({"reassign-sm"})
KV_OPS = ("kv_append", "rope_append", "gemv_rope_append")
KV_READERS = ("attention", "attention_partial")


# ------------------------------------------------------------------------------------------ base schedules

def real_lowerings(families: tuple[str, ...] | None = None, quick: bool = False) -> list[tuple[str, Schedule]]:
    """Real lowerings of tiny random-init checkpoints (mosaic_amk.tiny_models), several configs each: every
    family (``TINY_FAMILIES``) and the int8 weight-only variant (``TINY_INT8``) unless ``families`` names some.
    Configs: configs/audit.toml (10; the last two with the page protocol); ``quick``: 5 of them at 2 positions."""
    from mosaic.gpus import DEFAULT_GPU
    from mosaic.plugins import host

    from mosaic_amk.config import load_candidates
    from mosaic_amk.lowering import lower
    from mosaic_amk.tiny_models import TINY_FAMILIES, TINY_INT8, tiny_int8_model, tiny_model

    # one fixed record on every machine (CPU-only lowerings), so an audit's counts are the same wherever it runs
    gpu = host().get("gpus", DEFAULT_GPU)
    configs = load_candidates("audit", file="audit")  # configs/audit.toml
    positions = (0, 7) if quick else (0, 5, 16, 40)
    out = []
    for fam in families or (*TINY_FAMILIES, *TINY_INT8):
        model = tiny_int8_model(fam) if fam in TINY_INT8 else tiny_model(fam)
        for cname, cfg in ([*configs[:3], configs[6], configs[8]] if quick else configs):
            for pos in positions:
                out.append((f"{fam}/{cname}/pos{pos}", lower(model, cfg, gpu, pos)))
    return out


# ------------------------------------------------------------------------------------------ mutation helpers

def _with_task(s: Schedule, i: int, **changes) -> Schedule:
    tasks = list(s.tasks)
    tasks[i] = attrs.evolve(tasks[i], **changes)
    return attrs.evolve(s, tasks=tuple(tasks))


def _producers(s: Schedule) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, t in enumerate(s.tasks):
        out.setdefault(t.signal, []).append(i)
    return out


def _pick(rng: random.Random, items: list):
    return items[rng.randrange(len(items))] if items else None


def m_drop_wait(s: Schedule, rng: random.Random) -> Schedule | None:
    i = _pick(rng, [i for i, t in enumerate(s.tasks) if t.waits])
    if i is None:
        return None
    w = list(s.tasks[i].waits)
    w.pop(rng.randrange(len(w)))
    return _with_task(s, i, waits=tuple(w))


def m_add_cycle(s: Schedule, rng: random.Random) -> Schedule | None:
    """Task i waits (all-join) on the counter of a task that transitively waits on i."""
    prods = _producers(s)
    waiters: dict[int, list[int]] = {}
    for j, t in enumerate(s.tasks):
        for w in t.waits:
            waiters.setdefault(w.counter, []).append(j)
    for _ in range(10):
        i = rng.randrange(len(s.tasks))
        seen, todo = set(), [i]
        while todo:
            k = todo.pop()
            for j in waiters.get(s.tasks[k].signal, ()):
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        seen.discard(i)
        j = _pick(rng, sorted(seen))
        if j is not None:
            c = s.tasks[j].signal
            return _with_task(s, i, waits=(*s.tasks[i].waits, Wait(c, len(prods[c]))))
    return None


def m_swap_queue(s: Schedule, rng: random.Random) -> Schedule | None:
    """Swap two adjacent tasks of one SM queue (their list positions)."""
    queues: dict[int, list[int]] = {}
    for i, t in enumerate(s.tasks):
        queues.setdefault(t.sm, []).append(i)
    sm = _pick(rng, [k for k, q in queues.items() if len(q) > 1])
    if sm is None:
        return None
    q = queues[sm]
    k = rng.randrange(len(q) - 1)
    a, b = q[k], q[k + 1]
    tasks = list(s.tasks)
    tasks[a], tasks[b] = tasks[b], tasks[a]
    return attrs.evolve(s, tasks=tuple(tasks))


def _set_threshold(s: Schedule, rng: random.Random, choose: Callable[[int], int | None]) -> Schedule | None:
    prods = _producers(s)
    cands = [(i, k) for i, t in enumerate(s.tasks) for k, w in enumerate(t.waits)
             if choose(len(prods.get(w.counter, ()))) is not None]
    pick = _pick(rng, cands)
    if pick is None:
        return None
    i, k = pick
    w = list(s.tasks[i].waits)
    n = len(prods.get(w[k].counter, ()))
    th = choose(n)
    w[k] = Wait(w[k].counter, th if isinstance(th, int) else th(rng))
    return _with_task(s, i, waits=tuple(w))


def m_partial_threshold(s: Schedule, rng: random.Random) -> Schedule | None:
    """1 < threshold < producers on a shared counter."""
    return _set_threshold(s, rng, lambda n: (lambda r: r.randint(2, n - 1)) if n >= 3 else None)


def m_first_of_n(s: Schedule, rng: random.Random) -> Schedule | None:
    """threshold 1 on a counter with several producers."""
    return _set_threshold(s, rng, lambda n: 1 if n >= 2 else None)


def m_over_threshold(s: Schedule, rng: random.Random) -> Schedule | None:
    """threshold above the producer count."""
    return _set_threshold(s, rng, lambda n: n + 1 if n >= 1 else None)


def m_zero_threshold(s: Schedule, rng: random.Random) -> Schedule | None:
    """threshold 0 (a wait that never blocks)."""
    return _set_threshold(s, rng, lambda n: 0)


def m_oob_counter(s: Schedule, rng: random.Random) -> Schedule | None:
    i = rng.randrange(len(s.tasks))
    t = s.tasks[i]
    bad = _pick(rng, [s.num_counters, s.num_counters + rng.randrange(1, 50), -1])
    if t.waits and rng.random() < 0.5:
        w = list(t.waits)
        k = rng.randrange(len(w))
        w[k] = Wait(bad, w[k].threshold)
        return _with_task(s, i, waits=tuple(w))
    return _with_task(s, i, signal=bad)


def m_oob_buffer(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task names a buffer that does not exist, or touches rows past the end of one."""
    i = rng.randrange(len(s.tasks))
    t = s.tasks[i]
    if rng.random() < 0.5 and "row_end" in t.params and t.op != "attention":
        y = t.outputs[0]
        extent = {b.name: b.shape[0] for b in s.buffers}[y]
        end = extent + rng.randint(1, 8)
        start = min(t.params["row_start"], extent - 1)
        ranges = {**{n: (start, end) for n in t.ranges}, y: (start, end)}
        return _with_task(s, i, params={**t.params, "row_start": start, "row_end": end}, ranges=ranges)
    names = list(t.inputs) + list(t.outputs)
    k = rng.randrange(len(names))
    ghost = f"ghost.{rng.randrange(1000)}"
    if k < len(t.inputs):
        ins = list(t.inputs)
        ins[k] = ghost
        return _with_task(s, i, inputs=tuple(ins))
    outs = list(t.outputs)
    outs[k - len(t.inputs)] = ghost
    return _with_task(s, i, outputs=tuple(outs))


def m_capacity(s: Schedule, rng: random.Random) -> Schedule | None:
    """Overflow one ABI slot: > 8 waits (repeats of one), > 8 inputs, > 4 outputs, or rank 5."""
    kind = rng.randrange(4)
    if kind == 3:
        k = rng.randrange(len(s.buffers))
        b = s.buffers[k]
        bufs = list(s.buffers)
        bufs[k] = Buffer(b.name, b.dtype, (*b.shape, *([1] * (5 - len(b.shape) + rng.randrange(2)))), b.kind)
        return attrs.evolve(s, buffers=tuple(bufs))
    i = rng.randrange(len(s.tasks))
    t = s.tasks[i]
    if kind == 0 and t.waits:
        return _with_task(s, i, waits=t.waits + (t.waits[0],) * (9 - len(t.waits) + rng.randrange(3)))
    if kind == 1 or not t.outputs:
        return _with_task(s, i, inputs=t.inputs + (t.inputs[0],) * (9 - len(t.inputs) + rng.randrange(3)))
    return _with_task(s, i, outputs=t.outputs + (t.outputs[0],) * (5 - len(t.outputs) + rng.randrange(2)))


def m_kv_before_append(s: Schedule, rng: random.Random) -> Schedule | None:
    """An attention task loses its wait on the same-pass KV append (read before append)."""
    kv_counters = {t.signal for t in s.tasks if t.op in KV_OPS}
    cands = [i for i, t in enumerate(s.tasks) if t.op in KV_READERS and any(w.counter in kv_counters for w in t.waits)]
    i = _pick(rng, cands)
    if i is None:
        return None
    t = s.tasks[i]
    kv = [k for k, w in enumerate(t.waits) if w.counter in kv_counters]
    drop = set(kv) if rng.random() < 0.5 else {_pick(rng, kv)}
    return _with_task(s, i, waits=tuple(w for k, w in enumerate(t.waits) if k not in drop))


def m_self_wait(s: Schedule, rng: random.Random) -> Schedule | None:
    prods = _producers(s)
    i = rng.randrange(len(s.tasks))
    t = s.tasks[i]
    th = _pick(rng, [len(prods[t.signal]), 1])
    return _with_task(s, i, waits=(*t.waits, Wait(t.signal, th)))


def m_write_race(s: Schedule, rng: random.Random) -> Schedule | None:
    """A second writer of the same rows: a copy of a writer task on another SM, later in the list,
    signalling a fresh counter nobody waits on."""
    bufs = {b.name: b for b in s.buffers}
    cands = [i for i, t in enumerate(s.tasks) if any(bufs.get(o) and bufs[o].kind != "weight" for o in t.outputs)]
    i = _pick(rng, cands)
    if i is None:
        return None
    t = s.tasks[i]
    new = attrs.evolve(t, id=max(x.id for x in s.tasks) + 1, sm=rng.randrange(s.num_sms), signal=s.num_counters)
    pos = rng.randint(i + 1, len(s.tasks))
    tasks = list(s.tasks)
    tasks.insert(pos, new)
    return attrs.evolve(s, tasks=tuple(tasks), num_counters=s.num_counters + 1)


def m_reassign_sm(s: Schedule, rng: random.Random) -> Schedule | None:
    if s.num_sms < 2:
        return None
    # a task with page operations stays: its pages are its SM's (the same draws as before on a schedule without pages)
    i = _pick(rng, _unpaged(s))
    if i is None:
        return None
    sm = _pick(rng, [k for k in range(s.num_sms) if k != s.tasks[i].sm])
    return _with_task(s, i, sm=sm)


def _unpaged(s: Schedule) -> list[int]:
    """The tasks without page operations (every task of a schedule without pages)."""
    return [i for i, t in enumerate(s.tasks) if t.pages is None]


def m_move_in_list(s: Schedule, rng: random.Random) -> Schedule | None:
    """Move one task to another place in the task list (its SM unchanged)."""
    tasks = list(s.tasks)
    i = rng.randrange(len(tasks))
    t = tasks.pop(i)
    j = i
    while j == i and len(tasks) > 0:
        j = rng.randint(0, len(tasks))
    tasks.insert(j, t)
    return attrs.evolve(s, tasks=tuple(tasks))


def m_retarget_signal(s: Schedule, rng: random.Random) -> Schedule | None:
    if s.num_counters < 2:
        return None
    i = rng.randrange(len(s.tasks))
    c = _pick(rng, [k for k in range(s.num_counters) if k != s.tasks[i].signal])
    return _with_task(s, i, signal=c)


def m_swap_buffer(s: Schedule, rng: random.Random) -> Schedule | None:
    """One input or output of a task replaced by another buffer of the same shape."""
    bufs = {b.name: b for b in s.buffers}
    i = rng.randrange(len(s.tasks))
    t = s.tasks[i]
    names = [(k, n) for k, n in enumerate((*t.inputs, *t.outputs)) if n in bufs and bufs[n].kind != "weight"]
    pick = _pick(rng, names)
    if pick is None:
        return None
    k, n = pick
    other = _pick(rng, [b.name for b in s.buffers if b.shape == bufs[n].shape and b.name != n and b.kind != "weight"])
    if other is None:
        return None
    ranges = {(other if key == n else key): v for key, v in t.ranges.items()}
    if k < len(t.inputs):
        ins = list(t.inputs)
        ins[k] = other
        return _with_task(s, i, inputs=tuple(ins), ranges=ranges)
    outs = list(t.outputs)
    outs[k - len(t.inputs)] = other
    return _with_task(s, i, outputs=tuple(outs), ranges=ranges)


def m_narrow_range(s: Schedule, rng: random.Random) -> Schedule | None:
    """A declared ``ranges`` entry narrower than what the op touches (a lying footprint)."""
    cands = [(i, n) for i, t in enumerate(s.tasks) for n, (lo, hi) in t.ranges.items() if hi - lo > 1]
    pick = _pick(rng, cands)
    if pick is None:
        return None
    i, n = pick
    lo, hi = s.tasks[i].ranges[n]
    cut = rng.randint(lo + 1, hi - 1)
    new = (lo, cut) if rng.random() < 0.5 else (cut, hi)
    return _with_task(s, i, ranges={**s.tasks[i].ranges, n: new})


def m_unwritten_output(s: Schedule, rng: random.Random) -> Schedule | None:
    """An output no task writes: a new output buffer, or an output's writers retargeted elsewhere."""
    if rng.random() < 0.5:
        name = f"out.extra{rng.randrange(100)}"
        return attrs.evolve(s, buffers=(*s.buffers, Buffer(name, "f32", (rng.randint(1, 8),), "output")),
                            outputs=(*s.outputs, name))
    out = _pick(rng, list(s.outputs))
    writers = [i for i, t in enumerate(s.tasks) if out in t.outputs]
    if not writers:
        return None
    i = _pick(rng, writers)
    t = s.tasks[i]
    spare = f"{out}.spare"
    b = {x.name: x for x in s.buffers}[out]
    ranges = {(spare if k == out else k): v for k, v in t.ranges.items()}
    s2 = attrs.evolve(s, buffers=(*s.buffers, Buffer(spare, b.dtype, b.shape, "scratch")))
    return _with_task(s2, i, outputs=tuple(spare if o == out else o for o in t.outputs), ranges=ranges)


# ---- one class per validator rule: each injects exactly one rule's violation and nothing else, so the
# validator rejects it with that one diagnostic code (RULE_CLASSES; tests/test_audit.py holds it). The
# mutators read only the schedule's structure (never the validator) to keep the injection single.

def _successors(s: Schedule, i: int, queue: bool = False) -> set[int]:
    """Tasks that cannot start before task ``i`` finishes: its transitive waiters over producer -> waiter
    edges (satisfiable thresholds), and with ``queue`` the later tasks of each SM queue reached too."""
    waiters: dict[int, list[int]] = {}
    for j, t in enumerate(s.tasks):
        for w in t.waits:
            if w.threshold >= 1:
                waiters.setdefault(w.counter, []).append(j)
    nxt: dict[int, int] = {}
    if queue:
        last: dict[int, int] = {}
        for j, t in enumerate(s.tasks):
            if t.sm in last:
                nxt[last[t.sm]] = j
            last[t.sm] = j
    seen: set[int] = set()
    todo = [i]
    while todo:
        k = todo.pop()
        nexts = list(waiters.get(s.tasks[k].signal, ()))
        if k in nxt:
            nexts.append(nxt[k])
        for j in nexts:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return seen


def _add_wait(s: Schedule, rng: random.Random, ok: Callable[[int, list[int]], bool], tries: int = 10) -> Schedule | None:
    """Task ``i`` (fewer than 8 waits) gains an all-join wait on a counter whose producers ``ok(i, producers)``."""
    prods = _producers(s)
    free = [i for i, t in enumerate(s.tasks) if len(t.waits) < MAX_WAITS]
    for _ in range(tries):
        i = _pick(rng, free)
        if i is None:
            return None
        cands = [c for c, p in sorted(prods.items()) if i not in p and ok(i, p)]
        c = _pick(rng, cands)
        if c is not None:
            return _with_task(s, i, waits=(*s.tasks[i].waits, Wait(c, len(prods[c]))))
    return None


def m_oob_sm(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task placed on an SM the grid does not have (malformed); never one with page operations (its SM's pages
    would break too)."""
    i = _pick(rng, _unpaged(s))
    if i is None:
        return None
    return _with_task(s, i, sm=_pick(rng, [s.num_sms, s.num_sms + rng.randrange(1, 50), -1]))


def m_wait_overflow(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task's waits repeated past the descriptor's 8 slots (capacity; the repeats order nothing new)."""
    i = _pick(rng, [i for i, t in enumerate(s.tasks) if t.waits])
    if i is None:
        return None
    w = s.tasks[i].waits
    extra = MAX_WAITS + 1 + rng.randrange(3) - len(w)
    return _with_task(s, i, waits=w + tuple(w[k % len(w)] for k in range(extra)))


def m_wait_unsignalled(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task gains a wait on a fresh counter that no task signals (unsatisfiable-wait: it never passes)."""
    i = _pick(rng, [i for i, t in enumerate(s.tasks) if len(t.waits) < MAX_WAITS])
    if i is None:
        return None
    s2 = attrs.evolve(s, num_counters=s.num_counters + 1)
    return _with_task(s2, i, waits=(*s.tasks[i].waits, Wait(s.num_counters, 1)))


def m_cross_sm_cycle(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task gains a wait on a counter whose later producers all transitively wait on it, none on its own
    SM (cycle, through producer -> waiter edges alone)."""
    def ok(i: int, p: list[int]) -> bool:
        later = [j for j in p if j > i]
        if not later or any(s.tasks[j].sm == s.tasks[i].sm for j in later):
            return False
        succ = _successors(s, i)
        return all(j in succ for j in later)
    return _add_wait(s, rng, ok)


def m_wait_later_in_queue(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task gains a wait on a counter whose later producers are all behind it in its own SM queue and do
    not depend on it otherwise (queue-order: the SM blocks on work queued behind it)."""
    def ok(i: int, p: list[int]) -> bool:
        later = [j for j in p if j > i]
        if not later or any(s.tasks[j].sm != s.tasks[i].sm for j in later):
            return False
        succ = _successors(s, i)
        return not any(j in succ for j in later)
    return _add_wait(s, rng, ok)


def m_wait_later_in_list(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task gains a wait on a counter produced later in the list on other SMs by tasks that do not
    depend on it, through waits or queue order (list-order: no deadlock, the list is just not topological)."""
    def ok(i: int, p: list[int]) -> bool:
        later = [j for j in p if j > i]
        if not later or any(s.tasks[j].sm == s.tasks[i].sm for j in later):
            return False
        succ = _successors(s, i, queue=True)
        return not any(j in succ for j in later)
    return _add_wait(s, rng, ok)


def m_extra_partial_wait(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task that all-joins a counter of >= 3 producers gains a second wait on it with 1 < threshold <
    producers (partial-join; the all-join still orders everything, so the oracle sees nothing)."""
    prods = _producers(s)
    cands = [(i, w.counter) for i, t in enumerate(s.tasks) if len(t.waits) < MAX_WAITS for w in t.waits
             if len(prods.get(w.counter, ())) >= 3 and w.threshold == len(prods[w.counter])]
    pick = _pick(rng, cands)
    if pick is None:
        return None
    i, c = pick
    return _with_task(s, i, waits=(*s.tasks[i].waits, Wait(c, rng.randint(2, len(prods[c]) - 1))))


def m_drop_wait_non_kv(s: Schedule, rng: random.Random) -> Schedule | None:
    """drop-wait on a task that neither appends to nor reads a KV cache (unordered-read on activations)."""
    i = _pick(rng, [i for i, t in enumerate(s.tasks) if t.waits and t.op not in KV_OPS and t.op not in KV_READERS])
    if i is None:
        return None
    w = list(s.tasks[i].waits)
    w.pop(rng.randrange(len(w)))
    return _with_task(s, i, waits=tuple(w))


def m_phantom_output(s: Schedule, rng: random.Random) -> Schedule | None:
    """A new schedule output that no task writes (unreachable-output)."""
    name = f"out.phantom{rng.randrange(100)}"
    kind = _pick(rng, ["output", "activation", "scratch"])
    return attrs.evolve(s, buffers=(*s.buffers, Buffer(name, "f32", (rng.randint(1, 8),), kind)),
                        outputs=(*s.outputs, name))


def m_unread_write_race(s: Schedule, rng: random.Random) -> Schedule | None:
    """A copy of a task whose outputs no task reads (e.g. the final argmax), on another SM, signalling a fresh
    counter: two unordered writers of the same elements and no reader between them (write-race)."""
    if s.num_sms < 2:
        return None
    bufs = {b.name: b for b in s.buffers}
    read = {n for t in s.tasks for n in t.inputs}
    cands = [i for i, t in enumerate(s.tasks)
             if t.outputs and all(o in bufs and bufs[o].kind != "weight" and o not in read for o in t.outputs)]
    i = _pick(rng, cands)
    if i is None:
        return None
    t = s.tasks[i]
    new = attrs.evolve(t, id=max(x.id for x in s.tasks) + 1, signal=s.num_counters,
                       sm=_pick(rng, [k for k in range(s.num_sms) if k != t.sm]))
    tasks = list(s.tasks)
    tasks.insert(rng.randint(i + 1, len(tasks)), new)
    return attrs.evolve(s, tasks=tuple(tasks), num_counters=s.num_counters + 1)


# ---- the page protocol: one class per page rule (a page base: lowered with ScheduleConfig.pages), each injecting that
# rule's violation alone

def _paged_queues(s: Schedule) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, t in enumerate(s.tasks):
        out.setdefault(t.sm, []).append(i)
    return out


def _add_pages(t: Task, acquire: tuple = (), use: tuple = (), release: tuple = ()) -> Task:
    pg = t.pages or TaskPages()
    return attrs.evolve(t, pages=TaskPages(pg.acquire + acquire, pg.use + use, pg.release + release))


def _page_states(s: Schedule, q: list[int]) -> list[dict[int, bool]]:
    """Per queue position: the pages the SM holds (page -> still held) once the loader has acquired that task's
    fills, before the task's uses (its own acquires counted)."""
    held: dict[int, bool] = {}
    out = []
    for i in q:
        pg = s.tasks[i].pages
        for fl in pg.acquire if pg else ():
            held[fl.page] = True
        out.append(dict(held))
        for p in pg.release if pg else ():
            held[p] = False
    return out


def m_page_pool_shrink(s: Schedule, rng: random.Random) -> Schedule | None:
    """One SM's page pool loses its highest page (the ring's last page falls outside the pool), or its pages shrink
    below its largest fill (page-oversubscribed: more pages, or bytes, held than the pool has)."""
    pools = {p.sm: k for k, p in enumerate(s.page_pools)}
    bufs = {b.name: b for b in s.buffers}
    used: dict[int, list[int]] = {}  # sm -> [highest page, largest fill bytes]
    for t in s.tasks:
        for fl in t.pages.acquire if t.pages else ():
            b = bufs.get(fl.buffer)
            if b is not None and t.sm in pools:
                u = used.setdefault(t.sm, [0, 0])
                u[0] = max(u[0], fl.page)
                u[1] = max(u[1], (fl.rows[1] - fl.rows[0]) * row_bytes(b.dtype, b.shape))
    sm = _pick(rng, sorted(used))
    if sm is None:
        return None
    k = pools[sm]
    pool = s.page_pools[k]
    high, size = used[sm]
    if high >= 1 and (size <= 1 or rng.random() < 0.5):
        new = attrs.evolve(pool, count=high)
    elif size > 1:
        new = attrs.evolve(pool, page_bytes=rng.randint(max(1, size // 4), size - 1))
    else:
        return None
    return attrs.evolve(s, page_pools=(*s.page_pools[:k], new, *s.page_pools[k + 1:]))


def m_page_use_unheld(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task gains a use of a page of its SM's pool that the SM does not hold at that task: released by an earlier
    task, or not acquired yet (page-unheld)."""
    pools = {p.sm: p.count for p in s.page_pools}
    cands = []
    for sm, q in _paged_queues(s).items():
        if sm not in pools:
            continue
        for i, held in zip(q, _page_states(s, q), strict=True):
            pg = s.tasks[i].pages
            if pg is not None and len(pg.use) >= MAX_PAGE_OPS:
                continue
            cands.extend((i, p) for p in range(pools[sm]) if not held.get(p, False))
    pick = _pick(rng, cands)
    if pick is None:
        return None
    i, p = pick
    return _with_task(s, i, pages=_add_pages(s.tasks[i], use=(p,)).pages)


def m_page_refill_unordered(s: Schedule, rng: random.Random) -> Schedule | None:
    """A refill of a page loses its waits: the loader may overwrite the page before the previous reader released it
    (page-reuse; the fills of the lowering load weights, which need no other wait)."""
    cands = [(i, k) for i, t in enumerate(s.tasks) if t.pages for k, fl in enumerate(t.pages.acquire) if fl.waits]
    pick = _pick(rng, cands)
    if pick is None:
        return None
    i, k = pick
    pg = s.tasks[i].pages
    acq = list(pg.acquire)
    acq[k] = attrs.evolve(acq[k], waits=())
    return _with_task(s, i, pages=attrs.evolve(pg, acquire=tuple(acq)))


def m_page_fill_unordered(s: Schedule, rng: random.Random) -> Schedule | None:
    """A task that reads an activation (or other buffer written in the launch) gets those rows prefetched into a new
    page of its SM's pool, acquired at or before it in its queue with no wait: the fill may run ahead of the data's
    writer (page-fill-ahead)."""
    bufs = {b.name: b for b in s.buffers}
    pools = {p.sm: k for k, p in enumerate(s.page_pools)}
    written = {o for t in s.tasks for o in t.outputs}
    queues = _paged_queues(s)
    cands = []
    for i, t in enumerate(s.tasks):
        if t.sm not in pools or (t.pages and len(t.pages.use) >= MAX_PAGE_OPS):
            continue
        pool = s.page_pools[pools[t.sm]]
        if (pool.count + 1) * pool.page_bytes > MAX_POOL_BYTES:
            continue
        for name in t.inputs:
            b = bufs.get(name)
            if b is None or b.kind == "weight" or name not in written:
                continue
            fit = pool.page_bytes // row_bytes(b.dtype, b.shape)
            if fit >= 1:
                cands.append((i, name, fit))
    pick = _pick(rng, cands)
    if pick is None:
        return None
    i, name, fit = pick
    t = s.tasks[i]
    lo, hi = t.ranges.get(name, (0, bufs[name].shape[0]))
    lo = rng.randint(lo, hi - 1)
    rows = (lo, min(hi, lo + fit))
    q = queues[t.sm]
    at = _pick(rng, [j for j in q[:q.index(i) + 1]
                     if not (s.tasks[j].pages and len(s.tasks[j].pages.acquire) >= MAX_PAGE_OPS)])
    if at is None:
        return None
    k = pools[t.sm]
    pool = s.page_pools[k]
    page = pool.count
    s2 = attrs.evolve(s, page_pools=(*s.page_pools[:k], attrs.evolve(pool, count=pool.count + 1),
                                     *s.page_pools[k + 1:]))
    tasks = list(s2.tasks)
    tasks[at] = _add_pages(tasks[at], acquire=(PageFill(page, name, rows),))
    tasks[i] = _add_pages(tasks[i], use=(page,), release=(page,))
    return attrs.evolve(s2, tasks=tuple(tasks))


MUTATORS: dict[str, Callable[[Schedule, random.Random], Schedule | None]] = {
    "drop-wait": m_drop_wait,
    "add-cycle": m_add_cycle,
    "swap-queue-order": m_swap_queue,
    "partial-threshold": m_partial_threshold,
    "first-of-n": m_first_of_n,
    "over-threshold": m_over_threshold,
    "zero-threshold": m_zero_threshold,
    "oob-counter": m_oob_counter,
    "oob-buffer": m_oob_buffer,
    "capacity-overflow": m_capacity,
    "kv-read-before-append": m_kv_before_append,
    "self-wait": m_self_wait,
    "write-race": m_write_race,
    "reassign-sm": m_reassign_sm,
    "move-in-list": m_move_in_list,
    "retarget-signal": m_retarget_signal,
    "swap-buffer": m_swap_buffer,
    "narrow-range": m_narrow_range,
    "unwritten-output": m_unwritten_output,
    # one class per validator rule (RULE_CLASSES)
    "oob-sm": m_oob_sm,
    "wait-overflow": m_wait_overflow,
    "wait-unsignalled": m_wait_unsignalled,
    "cross-sm-cycle": m_cross_sm_cycle,
    "wait-later-in-queue": m_wait_later_in_queue,
    "wait-later-in-list": m_wait_later_in_list,
    "extra-partial-wait": m_extra_partial_wait,
    "drop-wait-non-kv": m_drop_wait_non_kv,
    "phantom-output": m_phantom_output,
    "unread-write-race": m_unread_write_race,
    # the page protocol (drawn from the page bases only: PAGE_CLASSES)
    "page-pool-shrink": m_page_pool_shrink,
    "page-use-unheld": m_page_use_unheld,
    "page-refill-unordered": m_page_refill_unordered,
    "page-fill-unordered": m_page_fill_unordered,
}
# The class that targets each validator rule (diagnostic code): its mutants, when rejected, carry that code alone.
RULE_CLASSES: dict[str, str] = {
    "malformed": "oob-sm",
    "capacity": "wait-overflow",
    "unsatisfiable-wait": "wait-unsignalled",
    "cycle": "cross-sm-cycle",
    "queue-order": "wait-later-in-queue",
    "list-order": "wait-later-in-list",
    "partial-join": "extra-partial-wait",
    "unordered-read": "drop-wait-non-kv",
    "kv-order": "kv-read-before-append",
    "unreachable-output": "phantom-output",
    "write-race": "unread-write-race",
    "page-oversubscribed": "page-pool-shrink",
    "page-unheld": "page-use-unheld",
    "page-reuse": "page-refill-unordered",
    "page-fill-ahead": "page-fill-unordered",
}
# the classes that mutate the page protocol: their mutants are drawn from the bases lowered with pages
PAGE_CLASSES = frozenset(("page-pool-shrink", "page-use-unheld", "page-refill-unordered", "page-fill-unordered"))


def bases_for(name: str, bases: list[Schedule]) -> list[Schedule]:
    """The bases a class draws from: the page bases for a page class (all of them when there are none)."""
    if name in PAGE_CLASSES:
        return [s for s in bases if s.has_pages()] or bases
    return bases


# ------------------------------------------------------------------------------------------ random DAGs

def random_dag(rng: random.Random) -> Schedule:
    """A random schedule of real ops over small buffers. Half are built disciplined (every read waits,
    all-join, on the producers of what it reads; list order topological) and then perturbed once by a
    random mutator; half are wild (random waits, thresholds, counters and SMs)."""
    width = 8
    n_sms = rng.randint(1, 4)
    n_tasks = rng.randint(2, 20)
    bufs = [Buffer("x", "f32", (width,), "input"), Buffer("w", "f32", (width, width), "weight"),
            Buffer("g", "f32", (width,), "weight")]
    acts = [f"a{k}" for k in range(rng.randint(1, max(2, n_tasks // 2)))]
    bufs += [Buffer(a, "f32", (width,), "activation") for a in acts]
    disciplined = rng.random() < 0.5
    n_counters = n_tasks if disciplined else rng.randint(1, n_tasks + 1)
    tasks: list[Task] = []
    written: dict[str, list[int]] = {}  # buffer -> writer task indices (so far)
    for i in range(n_tasks):
        readable = ["x"] + [a for a in acts if a in written or not disciplined]
        op = rng.choice(("add", "silu_mul", "rmsnorm", "gemv", "gemv"))
        out = rng.choice(acts)
        params: dict = {}
        ranges: dict = {}
        if op in ("add", "silu_mul"):
            ins = [rng.choice(readable), rng.choice(readable)]
        elif op == "rmsnorm":
            ins, params = [rng.choice(readable), "g"], {"eps": 1e-5}
        else:
            r0 = rng.randrange(width)
            r1 = rng.randint(r0 + 1, width)
            ins = [rng.choice(readable), "w"]
            params = {"row_start": r0, "row_end": r1, "bias": False, "residual": False}
            ranges = {"w": (r0, r1), out: (r0, r1)}
        if disciplined:
            signal = i
            deps = sorted({j for n in ins for j in written.get(n, ())} | {j for j in written.get(out, ())})
            # readers of `out` since its last writers must finish first too (write-after-read)
            deps = sorted(set(deps) | {j for j, t in enumerate(tasks) if out in t.inputs})
            waits = tuple(Wait(j, 1) for j in deps)[:8]
        else:
            signal = rng.randrange(n_counters)
            waits = tuple(Wait(rng.randrange(n_counters), rng.randint(0, 3)) for _ in range(rng.randint(0, 3)))
        tasks.append(Task(id=i, op=op, sm=rng.randrange(n_sms), inputs=tuple(ins), outputs=(out,), waits=waits,
                          signal=signal, params=params, ranges=ranges))
        written.setdefault(out, []).append(i)
    outputs = tuple(sorted({t.outputs[0] for t in tasks[-2:]}))
    s = Schedule(num_sms=n_sms, buffers=tuple(bufs), num_counters=n_counters, tasks=tuple(tasks), outputs=outputs)
    if disciplined and rng.random() < 0.8:
        name = rng.choice(sorted(MUTATORS))
        mutant = MUTATORS[name](s, rng)
        if mutant is not None:
            s = mutant
    return s


# ------------------------------------------------------------------------------------------ running

@attrs.define
class ClassRow:
    name: str
    schedules: int = 0
    oracle_unsafe: int = 0
    rejected: int = 0
    false_accepts: int = 0
    stricter: int = 0  # rejected although the oracle saw nothing
    not_applicable: int = 0  # draws of a base with nothing to mutate (another base is drawn instead)

    def add(self, other: ClassRow) -> None:
        for f in ("schedules", "oracle_unsafe", "rejected", "false_accepts", "stricter", "not_applicable"):
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def to_json(self) -> dict:
        return attrs.asdict(self)


@attrs.define
class AuditReport:
    n: int
    seed: int
    oracle_runs: int
    bases: str
    rows: list[ClassRow]
    real: ClassRow
    examples: list[dict]
    seconds: float = 0.0
    workers: int = 1
    commit: str | None = None  # git HEAD of the checkout that ran it
    amk_clean: bool | None = None  # whether packages/amk had no uncommitted change then

    @property
    def total(self) -> int:
        return sum(r.schedules for r in self.rows) + self.real.schedules

    @property
    def false_accepts(self) -> int:
        return sum(r.false_accepts for r in self.rows) + self.real.false_accepts

    @property
    def adversarial(self) -> ClassRow:
        tot = ClassRow("total (adversarial)")
        for r in self.rows:
            tot.add(r)
        return tot

    @property
    def schedules_per_s(self) -> float:
        return self.total / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        targets = {c: code for code, c in RULE_CLASSES.items()}
        return {"n": self.n, "total_schedules": self.total, "seed": self.seed, "oracle_runs": self.oracle_runs,
                "bases": self.bases, "seconds": round(self.seconds, 2), "workers": self.workers,
                "schedules_per_s": round(self.schedules_per_s, 1), "commit": self.commit, "amk_clean": self.amk_clean,
                "false_accepts": self.false_accepts, "real_lowerings": self.real.to_json(),
                "classes": [{**r.to_json(), "targets": targets.get(r.name), "control": r.name in CONTROL}
                            for r in self.rows],
                "totals": {"adversarial": self.adversarial.to_json(),
                           "all": {k: v + getattr(self.real, k) if k != "name" else "total (all)"
                                   for k, v in self.adversarial.to_json().items()}},
                "false_accept_examples": self.examples}


def git_state() -> tuple[str | None, bool | None]:
    """(HEAD commit, packages/amk clean) of the checkout this module is in; (None, None) outside git."""
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=here, capture_output=True, text=True,
                             check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "packages/amk"], cwd=top, capture_output=True,
                               text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head or None, not dirty


_BASES: list[Schedule] = []


def _job(args: tuple) -> tuple[list[ClassRow], list[dict]]:
    name, start, count, seed, runs = args
    row = ClassRow(name)
    examples: list[dict] = []
    pool = bases_for(name, _BASES)
    for k in range(start, start + count):
        rng = random.Random(f"{seed}/{name}/{k}")
        if name == "random-dag":
            s = random_dag(rng)
        else:
            s = None
            for _ in range(20):  # a base with nothing to mutate (e.g. no SM with two tasks): draw another
                s = MUTATORS[name](pool[rng.randrange(len(pool))], rng)
                if s is not None:
                    break
                row.not_applicable += 1
            if s is None:
                continue
        row.schedules += 1
        verdict = explore(s, runs=runs, seed=k)
        ok = validate(s).ok
        if not verdict.safe:
            row.oracle_unsafe += 1
            if ok:
                row.false_accepts += 1
                if len(examples) < 3:
                    examples.append({"class": name, "index": k, "seed": seed,
                                     "oracle": [f.line() for f in verdict.findings], "schedule": s.to_json()})
        if not ok:
            row.rejected += 1
            if verdict.safe:
                row.stricter += 1
    return [row], examples


def run_audit(n: int, seed: int = 0, workers: int | None = None, runs: int = ORACLE_RUNS,
              bases: list[tuple[str, Schedule]] | None = None, classes: tuple[str, ...] | None = None,
              progress: Callable[[str], None] | None = None) -> AuditReport:
    """Audit ``n`` adversarial schedules (a quarter random DAGs, the rest split evenly over the
    mutation classes) plus every real lowering used as a base."""
    t0 = time.perf_counter()
    commit, clean = git_state()  # the code that runs: HEAD when the audit starts
    base_list = bases if bases is not None else real_lowerings(quick=n < 5000)
    real = ClassRow("real-lowerings")
    for _, s in base_list:
        real.schedules += 1
        verdict = explore(s, runs=runs, seed=0)
        ok = validate(s).ok
        real.oracle_unsafe += not verdict.safe
        real.rejected += not ok
        real.false_accepts += (not verdict.safe) and ok
        real.stricter += (not ok) and verdict.safe
    names = list(classes or MUTATORS)
    n_dag = n // 4 if "random-dag" not in names and classes is None else 0
    per = (n - n_dag) // max(len(names), 1)
    plan = [(name, per + (1 if k < (n - n_dag) % len(names) else 0)) for k, name in enumerate(names)]
    if n_dag:
        plan.append(("random-dag", n_dag))
    chunk = 500
    jobs = [(name, start, min(chunk, count - start), seed, runs)
            for name, count in plan for start in range(0, count, chunk)]
    _BASES[:] = [s for _, s in base_list]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    rows = {name: ClassRow(name) for name, _ in plan}
    examples: list[dict] = []
    done = 0
    if workers > 1 and len(jobs) > 1:
        with get_context("fork").Pool(workers) as pool:
            results = pool.imap_unordered(_job, jobs)
            for got, ex in results:
                for r in got:
                    rows[r.name].add(r)
                    done += r.schedules
                examples.extend(ex)
                if progress:
                    progress(f"{done}/{n}")
    else:
        for job in jobs:
            got, ex = _job(job)
            for r in got:
                rows[r.name].add(r)
                done += r.schedules
            examples.extend(ex)
            if progress:
                progress(f"{done}/{n} ({job[0]})")
    label = f"{len(base_list)} real lowerings of tiny random-init checkpoints (mosaic_amk.lowering)"
    return AuditReport(n, seed, runs, label, list(rows.values()), real, examples[:10],
                       time.perf_counter() - t0, workers, commit, clean)


def table(report: AuditReport, markdown: bool = False) -> str:
    """The per-class table: schedules, oracle-unsafe, rejected, false accepts, stricter, n/a, and the rule a
    class targets (RULE_CLASSES); totals; a summary line. ``markdown``: a GitHub table."""
    targets = {c: code for code, c in RULE_CLASSES.items()}
    header = ["class", "targets", "schedules", "oracle-unsafe", "rejected", "false-accepts", "stricter", "n/a"]
    cells = lambda r, name, tgt: [name, tgt, r.schedules, r.oracle_unsafe, r.rejected, r.false_accepts,  # noqa: E731
                                  r.stricter, r.not_applicable]
    rows = [cells(r, r.name + (" (control)" if r.name in CONTROL else ""), targets.get(r.name, "")) for r in report.rows]
    tot = report.adversarial
    re = report.real
    rows.append(cells(tot, tot.name, ""))
    rows.append(cells(re, re.name, ""))
    every = ClassRow("total (all)")
    every.add(tot)
    every.add(re)
    rows.append(cells(every, every.name, ""))
    summary = (f"real lowerings accepted: {re.schedules - re.rejected}/{re.schedules}; "
               f"false accepts: {report.false_accepts}; {report.total} schedules in {report.seconds:.1f}s "
               f"({report.schedules_per_s:.1f} schedules/s, {report.workers} worker(s), {report.oracle_runs} oracle "
               f"interleavings each); seed {report.seed}, n {report.n}, commit {report.commit or 'unknown'}"
               + ("" if report.amk_clean in (True, None) else " (packages/amk modified)"))
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if k < 2 else "---:" for k in range(len(header))) + "|"]
        lines += ["| " + " | ".join(f"**{c}**" if k == 5 and c else str(c) for k, c in enumerate(r)) + " |" for r in rows]
        return "\n".join([*lines, "", summary])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).rjust(w) if k > 1 else str(c).ljust(w) for k, (c, w) in enumerate(zip(r, widths, strict=True)))  # noqa: E731
    lines = [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    lines.append(summary)
    return "\n".join(lines)
