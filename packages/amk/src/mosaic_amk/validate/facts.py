"""Derived graph facts that the validator's rules share: computed once per schedule, lazily, in list order.

:class:`Facts` reads a :class:`~mosaic_amk.schedule.Schedule` record and derives what more than one
rule needs (no diagnostic is decided here; the rules in :mod:`mosaic_amk.validate.rules` decide):

1. *scan*: the buffers by name, the producers of every counter (list order), the in-bounds wait sites,
   and per task its access footprint (element intervals per operand, from the op's declared footprint,
   ``ops.OpSpec.footprint``), or the reasons a footprint cannot be derived (``unfit``);
2. *ordering*: the backward edges (a producer not earlier in the list than its waiter) and self-waits;
   :meth:`Facts.ordering` classifies them with a strongly-connected-components pass that runs only when
   there are any;
3. *happens-before*: over the list order, ``pred[i]`` is the set of tasks guaranteed
   to finish before task ``i`` starts: its SM predecessor and that one's ``pred``, and for each wait
   ``(c, t)`` on a counter with producers ``P``: the union of ``P`` and their ``pred`` when ``t == |P|``
   (an all-join), else only the *intersection* (whatever precedes every producer, since some unknown
   ``t`` of them have finished); held as vector clocks (one latest task per SM, exact and linear in
   memory: :mod:`mosaic_amk.validate.clocks`);
4. *conflicts*: each buffer is a list of element segments holding its last writer and the readers
   since; each access (list order) is checked against every conflicting earlier access in its ``pred``
   (:meth:`Facts.conflicts`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from itertools import chain
from typing import Any

import attrs

from mosaic_amk import ops as _ops
from mosaic_amk.footprints import numel, row_len
from mosaic_amk.schedule import Buffer, Schedule, Task
from mosaic_amk.validate.clocks import inclusive_clocks, slots_of
from mosaic_amk.validate.pages import PageFacts

INIT_KINDS = frozenset(("weight", "input", "kv_cache"))  # valid before the launch starts
SPECS = _ops.OP_SPECS
# ops whose every operand is read or written whole (declared so in ops.py: no row roles, no footprint_fn)
WHOLE_OPS = frozenset(k for k, v in SPECS.items() if not v.row_roles and v.footprint_fn is None)
_UNINIT, _LAUNCH = -2, -1  # segment writer markers: never written / written before the launch


def where(*ids: Any) -> str:
    """``task 3`` or ``tasks 1, 4``: the ids sorted (integers first), each once."""
    uniq = {i for i in ids if i is not None}
    ids = sorted(i for i in uniq if isinstance(i, int)) + sorted(str(i) for i in uniq if not isinstance(i, int))
    if len(ids) == 1:
        return f"task {ids[0]}"
    return "tasks " + ", ".join(map(str, ids))


@attrs.frozen
class Ordering:
    """The backward edges classified (list positions): what the cycle, queue-order and list-order rules
    report, in the order they report it."""

    producer_cycles: tuple = ()  # components (sets) of the producer -> waiter graph with > 1 task
    queue_pairs: tuple = ()  # (producer, waiter) on one SM, the waiter queued first
    wait_cycles: tuple = ()  # components of producer->waiter + queue order, not explained otherwise
    list_pairs: tuple = ()  # (producer, waiter): the list is not a topological order, no cycle


class Facts:
    """What the rules read: computed once per schedule, lazily, in list order."""

    def __init__(self, s: Schedule):
        self.s = s
        self.tasks: tuple[Task, ...] = s.tasks
        self.n = len(s.tasks)
        self.bufs: dict[str, Buffer] = {}
        self.prods: dict[int, list[int]] = {}  # counter -> producer indices (list order)
        self.access: list[tuple] = []  # per task: (reads, writes): tuples of (buffer, lo, hi)
        # per task index: why its footprint is not the op's (expected, actual, message), in check order
        self.unfit: dict[int, list[tuple]] = {}
        # every wait on an in-bounds counter: (task index, wait index, counter, threshold, #producers)
        self.wait_sites: list[tuple[int, int, int, int, int]] = []
        self.memo: dict = {}  # footprints per (op, params, shapes)
        self.rowlen: dict[str, int] = {}  # elements per row of axis 0, per buffer (lazily)
        self.segments: dict[str, list] = {}  # filled by conflicts(): buffer -> [starts, writers, readers]
        self._ordering: Ordering | None = None
        self._conflicts: list | None = None
        self.fill_conflicts: list[tuple[str, int, str, set]] = []  # filled by conflicts(): see there
        self.page_order: list[tuple[int, list[int]]] = []  # filled by conflicts(): (refill, tasks not before it)
        self._scan()
        self._order()
        # the page protocol (validate/pages.py), only for a schedule that uses it
        self.pages = PageFacts(self) if s.has_pages() else None

    # 1. references, producers, footprints --------------------------------------------------------------
    def _scan(self) -> None:
        s, bufs = self.s, self.bufs
        for b in s.buffers:
            bufs[b.name] = b
        # buffers whose accesses the race rules track (elements): all but weights and bad shapes
        self.tracked = {b.name: numel(b.shape) for b in bufs.values()
                        if b.kind != "weight" and b.shape and min(b.shape) >= 1}
        ncnt = s.num_counters
        prods = self.prods
        access = self.access
        spec_of = SPECS.get
        for i, t in enumerate(self.tasks):
            sig = t.signal
            if 0 <= sig < ncnt:
                p = prods.get(sig)
                if p is None:
                    prods[sig] = [i]
                else:
                    p.append(i)
            access.append(self._footprint(i, t, spec_of(t.op)))

    def _footprint(self, i: int, t: Task, spec: Any) -> tuple:
        """(reads, writes) as (buffer, lo, hi) element intervals; notes in ``unfit[i]`` the references,
        arity, parameters and bounds that keep it from being the op's, and ranges narrower than the op's
        own footprint."""
        bufs = self.bufs
        ranges, params = t.ranges, t.params
        problems: list[tuple] = []
        add = problems.append
        ok = True
        for name in (*t.inputs, *t.outputs):
            if name not in bufs:
                add(("a declared buffer", name, "unknown buffer"))
                ok = False
        for name in t.outputs:
            b = bufs.get(name)
            if b is not None and b.kind == "weight":
                add(("a writable buffer", name, "task writes a weight"))
        for name, (lo, hi) in ranges.items():
            b = bufs.get(name)
            if name not in t.inputs and name not in t.outputs:
                add(("a buffer the task names", name, "ranges entry for a buffer the task does not access"))
                ok = False
            elif b is not None and not 0 <= lo < hi <= b.shape[0]:
                add((f"0 <= lo < hi <= {b.shape[0]}", [lo, hi], f"rows of {name} out of bounds"))
                ok = False
        if spec is None:
            add(("an op of the op table", t.op, "unknown op"))
            ok = False
        else:
            missing = [p for p in spec.params if p not in params]
            if missing:
                add((list(spec.params), sorted(params), f"{t.op}: missing parameter(s) {', '.join(missing)}"))
                ok = False
            else:
                roles = spec.input_roles(params)
                if len(t.inputs) != len(roles) or len(t.outputs) != len(spec.outputs):
                    add((f"{len(roles)} inputs, {len(spec.outputs)} outputs",
                         f"{len(t.inputs)} inputs, {len(t.outputs)} outputs", f"{t.op}: bad arity"))
                    ok = False
        # Footprints: the elements the op touches, as its OpSpec declares them (exact for writes, which
        # the must-write analyses need), checked against the declared ranges (rows of axis 0); weights are
        # valid at launch and never written (a write is malformed), so no race involves them: untracked.
        track = self.tracked
        try:
            if ok and (ranges or t.op not in WHOLE_OPS):
                need = op_elems(t, bufs, self.memo)
                if isinstance(need, str):
                    add(("op parameters within the buffers", need, f"{t.op}: {need}"))
                else:
                    if ranges:
                        rowlen = self.rowlen
                        for name, lo, hi in need:
                            got = ranges.get(name)
                            if got is None or hi <= lo:
                                continue
                            rl = rowlen.get(name)
                            if rl is None:
                                rl = rowlen[name] = row_len(bufs[name].shape)
                            if lo < got[0] * rl or hi > got[1] * rl:
                                add((f"ranges[{name}] covering rows [{lo // rl}, {-(-hi // rl)})",
                                     list(got), "declared rows narrower than what the op touches"))
                    k = len(t.inputs)
                    return (tuple(x for x in need[:k] if x[0] in track and x[2] > x[1]),
                            tuple(x for x in need[k:] if x[0] in track and x[2] > x[1]))

            def declared(n: str) -> tuple:
                if n not in ranges:
                    return (n, 0, track[n])
                rl = row_len(bufs[n].shape)
                return (n, ranges[n][0] * rl, ranges[n][1] * rl)

            reads = tuple(declared(n) for n in t.inputs if n in track)
            writes = tuple(declared(n) for n in t.outputs if n in track)
            return reads, writes
        finally:
            if problems:
                self.unfit[i] = problems

    # 2. ordering --------------------------------------------------------------------------------------
    def _order(self) -> None:
        """Wait sites, and backward edges (producer not earlier in the list) and self-waits."""
        self.backward: list[tuple[int, int]] = []  # (producer index, waiter index)
        self.self_waits: list[int] = []
        prods, ncnt = self.prods, self.s.num_counters
        sites = self.wait_sites
        for i, t in enumerate(self.tasks):
            for k, w in enumerate(t.waits):
                c, th = w.counter, w.threshold
                if not 0 <= c < ncnt:
                    continue
                p = prods.get(c)
                n = len(p) if p else 0
                sites.append((i, k, c, th, n))
                if th < 1 or n == 0:
                    continue
                if p[-1] >= i:
                    for j in p:
                        if j == i:
                            self.self_waits.append(i)
                        elif j > i:
                            self.backward.append((j, i))

    def ordering(self) -> Ordering:
        """The backward edges classified: producer cycles, queue-order pairs, wait-for cycles through
        SM queue order, and the remaining list-order pairs (empty without backward edges)."""
        if self._ordering is not None:
            return self._ordering
        if not self.backward:
            self._ordering = Ordering()
            return self._ordering
        tasks = self.tasks
        pc_edges: dict[int, set[int]] = {}
        all_edges: dict[int, set[int]] = {}
        for i, t in enumerate(tasks):  # producer -> waiter edges (satisfiable waits) and queue order
            for w in t.waits:
                if w.threshold >= 1:
                    for j in self.prods.get(w.counter, ()):
                        if j != i:
                            pc_edges.setdefault(j, set()).add(i)
                            all_edges.setdefault(j, set()).add(i)
        last: dict[int, int] = {}
        for i, t in enumerate(tasks):
            if t.sm in last:
                all_edges.setdefault(last[t.sm], set()).add(i)
            last[t.sm] = i
        pc_sccs = [c for c in sccs(pc_edges) if len(c) > 1]
        in_pc = set().union(*pc_sccs) if pc_sccs else set()
        explained: set[tuple[int, int]] = set()
        queue = []
        for j, i in self.backward:
            if tasks[j].sm == tasks[i].sm:
                explained.add((j, i))
                queue.append((j, i))
        wait_cycles = []
        for comp in (c for c in sccs(all_edges) if len(c) > 1):
            back = [(j, i) for j, i in self.backward if j in comp and i in comp]
            if not (comp & in_pc) and not all(e in explained for e in back):
                wait_cycles.append(comp)
            explained.update(back)
        listed = [(j, i) for j, i in self.backward if (j, i) not in explained and not (j in in_pc and i in in_pc)]
        self._ordering = Ordering(tuple(pc_sccs), tuple(queue), tuple(wait_cycles), tuple(listed))
        return self._ordering

    # 3. happens-before --------------------------------------------------------------------------------
    def clocks(self):
        """Per task (list order) its vector clock of ``pred[i] | {i}`` (:mod:`mosaic_amk.validate.clocks`),
        and the SM slot of every task; None when the schedule uses more SMs than clocks are built for. List
        order must be topological: call only without backward edges or self-waits."""
        tasks = self.tasks
        sms = [t.sm for t in tasks]
        slot = slots_of(sms)
        if slot is None:
            return None
        waits = [[(w.counter, w.threshold) for w in t.waits] for t in tasks]
        clocks = inclusive_clocks(sms, [t.signal for t in tasks], waits, self.s.num_counters, slot)
        return clocks, [slot[s] for s in sms]

    # 4. conflicting accesses --------------------------------------------------------------------------
    def conflicts(self) -> list[tuple[str, int, str, set]]:
        """Every access not ordered with a conflicting earlier one, as ``(kind, task index, buffer,
        other task indices)`` in the order found: ``raw`` (a read whose writer is not a transitive
        predecessor), ``uninit`` (a read of rows nothing writes before it), ``waw`` (unordered writers),
        ``war`` (a write over rows that unordered readers may not have read yet). Empty when the list is
        cyclic or not topological (happens-before is undefined there; the ordering rules report it), and
        when a malformed schedule spreads its tasks over more SMs than any GPU has (clocks.MAX_SLOTS).

        With the page protocol the walk is over the extended list (``PageFacts.events``: each loader fill an
        event before its acquiring task, reading the rows it loads) and also fills :attr:`fill_conflicts`
        (``(kind, acquiring task index, buffer, other task indices)``, kinds ``fill-raw`` / ``fill-uninit``: the
        fill's rows have a writer not ordered before it, or none; ``fill-war``: a later writer not ordered after
        the fill; ``fill-stale``: a writer between the fill and a task that reads the page) and
        :attr:`page_order` (a refill not ordered after the readers and the releaser of the page's previous fill)."""
        if self._conflicts is not None:
            return self._conflicts
        pg = self.pages
        if pg is None:
            got = None if (self.backward or self.self_waits) else self.clocks()
            if got is not None:
                clocks, slot = got
                events, ev_task, fill_ev, of_fill, task_ev = self.access, range(self.n), {}, {}, None
        else:
            got = None if (self.backward or self.self_waits or pg.backward) else self._page_clocks(pg)
            if got is not None:
                clocks, slot, events, ev_task, fill_ev, task_ev, of_fill = got
        if got is None:
            self._conflicts = []
            return self._conflicts
        bufs = self.bufs
        segs = self.segments
        found: dict[tuple, set] = {}
        last_user: dict[int, int] = {}  # fill event -> the event of its last user
        if fill_ev:
            for fid, users in pg.users.items():
                if users:
                    last_user[of_fill[fid]] = task_ev[users[-1]]
        for i, (reads, writes) in enumerate(events):
            clk = next(clocks)
            fid = fill_ev.get(i) if fill_ev else None
            if fid is not None and fid in pg.refill:  # a refill: after the previous fill's readers and releaser
                mine = clk.tolist()
                late = [j for j in pg.refill[fid][1] if mine[slot[task_ev[j]]] < task_ev[j]]
                if late:
                    self.page_order.append((fid, late))
            if not reads and not writes:
                continue
            mine = clk.tolist()  # j happens before i (or is i) iff mine[slot[j]] >= j
            ti = ev_task[i]
            raw, uninit = ("raw", "uninit") if fid is None else ("fill-raw", "fill-uninit")
            for name, lo, hi in reads:
                st = segs.get(name)
                if st is None:
                    st = segs[name] = [[0], [_LAUNCH if bufs[name].kind in INIT_KINDS else _UNINIT], [[]]]
                starts, writers, readers = st
                a, b = _split(st, lo, hi)
                for k in range(a, b):
                    w = writers[k]
                    if w >= 0:
                        if mine[slot[w]] < w:
                            found.setdefault((raw, ti, name), set()).add(ev_task[w])
                    elif w == _UNINIT:
                        found.setdefault((uninit, ti, name), set())
                    rd = readers[k]
                    if not rd or rd[-1] != i:
                        rd.append(i)
            for name, lo, hi in writes:
                st = segs.get(name)
                if st is None:
                    st = segs[name] = [[0], [_LAUNCH if bufs[name].kind in INIT_KINDS else _UNINIT], [[]]]
                starts, writers, readers = st
                a, b = _split(st, lo, hi)
                for k in range(a, b):
                    w = writers[k]
                    if w >= 0 and mine[slot[w]] < w:
                        found.setdefault(("waw", ti, name), set()).add(ev_task[w])
                    bad = [r for r in readers[k] if mine[slot[r]] < r]
                    if fill_ev:
                        for r in readers[k]:
                            if r in fill_ev:
                                if last_user.get(r, -1) > i:  # the page's reader comes after this write
                                    found.setdefault(("fill-stale", ev_task[r], name), set()).add(ti)
                                if r in bad:
                                    found.setdefault(("fill-war", ev_task[r], name), set()).add(ti)
                        bad = [r for r in bad if r not in fill_ev]
                    if bad:
                        found.setdefault(("war", ti, name), set()).update(ev_task[r] for r in bad)
                    writers[k] = i
                    readers[k] = []
        self._conflicts = [(kind, i, name, others) for (kind, i, name), others in found.items()
                           if not kind.startswith("fill-")]
        self.fill_conflicts = [(kind, i, name, others) for (kind, i, name), others in found.items()
                               if kind.startswith("fill-")]
        return self._conflicts

    def _page_clocks(self, pg: PageFacts):
        """The clocks of the extended list (fills as loader events; ``PageFacts.events``), or None when the
        schedule spreads over more agents than clocks are built for."""
        agents, signals, waits, access, ev_task, fill_ev, task_ev, of_fill = pg.events(self)
        slot = slots_of(agents)
        if slot is None:
            return None
        clocks = inclusive_clocks(agents, signals, waits, self.s.num_counters + len(pg.fills), slot)
        return clocks, [slot[a] for a in agents], access, ev_task, fill_ev, task_ev, of_fill


def op_elems(t: Any, bufs: Mapping[str, Any], memo: dict | None = None) -> list[tuple[str, int, int]] | str:
    """The op's declared footprint (``ops.OpSpec.footprint``): one (buffer, lo, hi) element interval per
    operand role (a buffer in two roles appears twice: its one declared range must cover both), or a
    problem (parameters that are not integers, or that reach outside a buffer). ``memo`` caches the
    footprint per (op, parameters with their types, operand shapes): the layers repeat them."""
    spec = SPECS[t.op]
    ins, outs = t.inputs, t.outputs
    if spec.writes == "kv_slot" and bufs[outs[0]].kind != "kv_cache":
        return f"appends into {outs[0]}, which is not a kv_cache buffer"
    shp = [bufs[n].shape for n in chain(ins, outs)]
    key = None
    if memo is not None:
        try:
            key = (t.op, *t.params.items(), *map(type, t.params.values()), *shp)
            got = memo.get(key)
        except TypeError:  # unhashable parameter values
            key = got = None
        if got is not None:
            return [(n, lo, hi) for n, (lo, hi) in zip(chain(ins, outs), got, strict=True)]
    k = len(ins)
    got = spec.footprint(t.params, shp[:k], shp[k:])
    if isinstance(got, str):
        return got
    if key is not None:
        memo[key] = got
    return [(n, lo, hi) for n, (lo, hi) in zip(chain(ins, outs), got, strict=True)]


def sccs(edges: Mapping[int, set[int]]) -> list[set[int]]:
    """Tarjan's strongly connected components, iterative."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on: set[int] = set()
    stack: list[int] = []
    out: list[set[int]] = []
    counter = 0
    for root in list(edges):
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges.get(w, ()))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                out.append(comp)
    return out


def _split(st: list, lo: int, hi: int) -> tuple[int, int]:
    """Make segment boundaries at lo and hi; return the index range of the segments in [lo, hi)."""
    starts, writers, readers = st
    a = bisect_right(starts, lo) - 1
    if starts[a] != lo:
        a += 1
        starts.insert(a, lo)
        writers.insert(a, writers[a - 1])
        readers.insert(a, readers[a - 1][:])
    b = bisect_right(starts, hi) - 1
    if starts[b] != hi:
        b += 1
        starts.insert(b, hi)
        writers.insert(b, writers[b - 1])
        readers.insert(b, readers[b - 1][:])
    return a, b

