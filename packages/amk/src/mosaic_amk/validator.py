"""The static schedule validator: a total function over a schedule, written as a rule table.

``validate(schedule_or_raw_json) -> ValidationResult`` never raises on bad data: it returns every
:class:`~mosaic.errors.Diagnostic` it finds (a stable ``code``, the task ids in ``where``, expected and
actual values). A schedule it accepts cannot deadlock or race under any legal interleaving of the
execution model in docs/amk-schedule.md; the argument, rule by rule, is in docs/amk-schedule.md.

How it works (one pass each, no search):

1. *facts*: per task, the checked references, capacity, op arity/parameters and access footprints
   (element intervals per operand, from the op's declared footprint, ``ops.OpSpec.footprint``; a
   ``ranges`` entry narrower than that footprint is ``malformed``);
2. *ordering*: every producer of every waited counter must come earlier in the task list. Then the
   wait-for graph (producer -> waiter, plus each SM's queue order) is acyclic, and with satisfiable
   thresholds no SM can block forever. Violations are classified (``cycle``, ``queue-order``,
   ``list-order``) with a strongly-connected-components pass that runs only when there are any;
3. *happens-before*: over the list order, ``pred[i]`` is the bitset (a Python int) of tasks
   guaranteed to finish before task ``i`` starts: its SM predecessor and that one's ``pred``, and for
   each wait ``(c, t)`` on a counter with producers ``P``: the union of ``P`` and their ``pred`` when
   ``t == |P|`` (an all-join), else only the *intersection* (whatever precedes every producer, since
   some unknown ``t`` of them have finished);
4. *races*: each buffer is a list of element segments holding its last writer and the readers since;
   each access (list order) must have every conflicting earlier access in its ``pred``.

Speed: ``validate`` first runs ``_screen`` over the columnar form (``mosaic_amk.columns``), the same
rules as whole-column numpy checks. It can only conclude "no diagnostic at all"; anything it flags or
does not recognise goes to the rule table above, which names every problem. The
rule table alone is ``validate_rules``; the parity tests hold ``validate`` equal to it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import attrs
import numpy as np
from mosaic.errors import CheckFailed, Diagnostic

from mosaic_amk import columns as _columns
from mosaic_amk import ops as _ops
from mosaic_amk.schedule import (
    FORMAT,
    MAX_INPUTS,
    MAX_OUTPUTS,
    MAX_RANK,
    MAX_WAITS,
    VERSION,
    Buffer,
    Schedule,
    Task,
)

CODES: dict[str, str] = {
    "malformed": "bad reference, bad arity, missing parameter, out-of-bounds counter, SM, buffer or rows, "
                 "duplicate id or name, a write to a weight, not a schedule structure",
    "capacity": "more than 8 inputs, 4 outputs or 8 waits on a task, or a buffer of rank > 4 (the VM ABI)",
    "unsatisfiable-wait": "threshold < 1, a counter with no producer, or threshold > its producer count",
    "cycle": "a cycle in the wait-for graph (producer -> consumer edges, or those plus SM queue order), "
             "including a task that waits on its own signal",
    "queue-order": "a wait whose producer is later in the waiter's own SM queue",
    "list-order": "a wait whose producer comes later in the task list (which must be a topological order) "
                  "without forming a cycle",
    "partial-join": "a wait with 1 < threshold < producers on a shared counter (a first-k-of-N race)",
    "unordered-read": "a read of rows whose writer is not a transitive predecessor (or is an unordered later "
                      "writer, or no task writes them)",
    "kv-order": "a KV-cache read not ordered with a same-pass append to those rows",
    "unreachable-output": "an output buffer (or rows of it) that no task writes",
    "write-race": "two writers of overlapping rows of one buffer with no happens-before between them",
}

_INIT_KINDS = frozenset(("weight", "input", "kv_cache"))  # valid before the launch starts
_SPECS = _ops.OP_SPECS
# ops whose every operand is read or written whole (declared so in ops.py: no row roles, no footprint_fn)
_WHOLE_OPS = frozenset(k for k, v in _SPECS.items() if not v.row_roles and v.footprint_fn is None)
_UNINIT, _LAUNCH = -2, -1  # segment writer markers: never written / written before the launch


@attrs.frozen
class ValidationResult:
    """Every diagnostic found; ``ok`` when there are none."""

    diagnostics: tuple = ()
    num_tasks: int = 0

    @property
    def ok(self) -> bool:
        return not self.diagnostics

    def codes(self) -> set[str]:
        return {d.code for d in self.diagnostics}

    def by_code(self, code: str) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.code == code]

    def lines(self) -> list[str]:
        return [d.line() for d in self.diagnostics]

    def to_json(self) -> dict:
        return {"ok": self.ok, "num_tasks": self.num_tasks,
                "diagnostics": [d.to_json() for d in self.diagnostics]}

    def check(self) -> None:
        """Raise :class:`CheckFailed` (exit 1) carrying every diagnostic unless the schedule is safe."""
        if self.diagnostics:
            raise CheckFailed("schedule is unsafe", list(self.diagnostics))


def _where(*ids: Any) -> str:
    uniq = {i for i in ids if i is not None}
    ids = sorted(i for i in uniq if isinstance(i, int)) + sorted(str(i) for i in uniq if not isinstance(i, int))
    if len(ids) == 1:
        return f"task {ids[0]}"
    return "tasks " + ", ".join(map(str, ids))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --------------------------------------------------------------------------------------------------- facts

class Facts:
    """What the rules read: computed once per schedule, lazily, in list order."""

    def __init__(self, s: Schedule):
        self.s = s
        self.tasks: tuple[Task, ...] = s.tasks
        self.n = len(s.tasks)
        self.diags: list[Diagnostic] = []  # malformed + capacity, filled by _scan
        self.bufs: dict[str, Buffer] = {}
        self.prods: dict[int, list[int]] = {}  # counter -> producer indices (list order)
        self.access: list[tuple] = []  # per task: (reads, writes): tuples of (buffer, lo, hi)
        self.memo: dict = {}  # footprints per (op, params, shapes)
        self.rowlen: dict[str, int] = {}  # elements per row of axis 0, per buffer (lazily)
        self._scan()
        self._order()

    # 1. structure, references, capacity, footprints ---------------------------------------------------
    def _scan(self) -> None:
        s, diags = self.s, self.diags
        add = diags.append
        if s.num_sms < 1:
            add(Diagnostic("malformed", "schedule", ">= 1", s.num_sms, "num_sms must be at least 1"))
        if s.num_counters < 0:
            add(Diagnostic("malformed", "schedule", ">= 0", s.num_counters, "num_counters must be >= 0"))
        bufs = self.bufs
        for b in s.buffers:
            if b.name in bufs:
                add(Diagnostic("malformed", f"buffer {b.name}", "unique names", "duplicate", "buffer name repeated"))
            bufs[b.name] = b
            if len(b.shape) > MAX_RANK:
                add(Diagnostic("capacity", f"buffer {b.name}", f"rank <= {MAX_RANK}", len(b.shape),
                               "buffer rank exceeds the VM ABI"))
            if not b.shape or any(d < 1 for d in b.shape):
                add(Diagnostic("malformed", f"buffer {b.name}", "rank >= 1 and extents >= 1", list(b.shape),
                               "bad buffer shape"))
        # buffers whose accesses the race rules track (elements): all but weights and bad shapes
        self.tracked = {b.name: _ops.numel(b.shape) for b in bufs.values()
                        if b.kind != "weight" and b.shape and min(b.shape) >= 1}
        for name in s.outputs:
            if name not in bufs:
                add(Diagnostic("malformed", "schedule outputs", "a declared buffer", name, "unknown output buffer"))
        nsm, ncnt = s.num_sms, s.num_counters
        prods = self.prods
        seen: set[int] = set()
        access = self.access
        spec_of = _SPECS.get
        for i, t in enumerate(self.tasks):
            tid = t.id
            if tid in seen:
                add(Diagnostic("malformed", _where(tid), "unique task ids", "duplicate", "task id repeated"))
            seen.add(tid)
            if not 0 <= t.sm < nsm:
                add(Diagnostic("malformed", _where(tid), f"sm in [0, {nsm})", t.sm, "SM out of bounds"))
            sig = t.signal
            if not 0 <= sig < ncnt:
                add(Diagnostic("malformed", _where(tid), f"signal in [0, {ncnt})", sig, "signal counter out of bounds"))
            else:
                p = prods.get(sig)
                if p is None:
                    prods[sig] = [i]
                else:
                    p.append(i)
            ins, outs, waits = t.inputs, t.outputs, t.waits
            if len(ins) > MAX_INPUTS or len(outs) > MAX_OUTPUTS or len(waits) > MAX_WAITS:
                add(Diagnostic("capacity", _where(tid), f"<= {MAX_INPUTS} inputs, {MAX_OUTPUTS} outputs, {MAX_WAITS} waits",
                               f"{len(ins)} inputs, {len(outs)} outputs, {len(waits)} waits",
                               "task descriptor exceeds the VM ABI"))
            for w in waits:
                if not 0 <= w.counter < ncnt:
                    add(Diagnostic("malformed", _where(tid), f"counter in [0, {ncnt})", w.counter,
                                   "wait on an out-of-bounds counter"))
            access.append(self._footprint(t, spec_of(t.op)))

    def _footprint(self, t: Task, spec: Any) -> tuple:
        """(reads, writes) as (buffer, lo, hi) element intervals; reports malformed references, arity,
        parameters, bounds, and ranges narrower than the op's own footprint."""
        bufs, add, tid = self.bufs, self.diags.append, t.id
        ranges, params = t.ranges, t.params
        ok = True
        for name in (*t.inputs, *t.outputs):
            if name not in bufs:
                add(Diagnostic("malformed", _where(tid), "a declared buffer", name, "unknown buffer"))
                ok = False
        for name in t.outputs:
            b = bufs.get(name)
            if b is not None and b.kind == "weight":
                add(Diagnostic("malformed", _where(tid), "a writable buffer", name, "task writes a weight"))
        for name, (lo, hi) in ranges.items():
            b = bufs.get(name)
            if name not in t.inputs and name not in t.outputs:
                add(Diagnostic("malformed", _where(tid), "a buffer the task names", name,
                               "ranges entry for a buffer the task does not access"))
                ok = False
            elif b is not None and not 0 <= lo < hi <= b.shape[0]:
                add(Diagnostic("malformed", _where(tid), f"0 <= lo < hi <= {b.shape[0]}", [lo, hi],
                               f"rows of {name} out of bounds"))
                ok = False
        if spec is None:
            add(Diagnostic("malformed", _where(tid), "an op of the op table", t.op, "unknown op"))
            ok = False
        else:
            missing = [p for p in spec.params if p not in params]
            if missing:
                add(Diagnostic("malformed", _where(tid), list(spec.params), sorted(params),
                               f"{t.op}: missing parameter(s) {', '.join(missing)}"))
                ok = False
            else:
                roles = spec.input_roles(params)
                if len(t.inputs) != len(roles) or len(t.outputs) != len(spec.outputs):
                    add(Diagnostic("malformed", _where(tid), f"{len(roles)} inputs, {len(spec.outputs)} outputs",
                                   f"{len(t.inputs)} inputs, {len(t.outputs)} outputs", f"{t.op}: bad arity"))
                    ok = False
        # Footprints: the elements the op touches, as its OpSpec declares them (exact for writes, which
        # the must-write analyses need), checked against the declared ranges (rows of axis 0); weights are
        # valid at launch and never written (a write is malformed), so no race involves them: untracked.
        track = self.tracked
        if ok and (ranges or t.op not in _WHOLE_OPS):
            need = _op_elems(t, bufs, self.memo)
            if isinstance(need, str):
                add(Diagnostic("malformed", _where(tid), "op parameters within the buffers", need, f"{t.op}: {need}"))
            else:
                if ranges:
                    rowlen = self.rowlen
                    for name, lo, hi in need:
                        got = ranges.get(name)
                        if got is None or hi <= lo:
                            continue
                        rl = rowlen.get(name)
                        if rl is None:
                            rl = rowlen[name] = _ops.row_len(bufs[name].shape)
                        if lo < got[0] * rl or hi > got[1] * rl:
                            add(Diagnostic("malformed", _where(tid),
                                           f"ranges[{name}] covering rows [{lo // rl}, {-(-hi // rl)})",
                                           list(got), "declared rows narrower than what the op touches"))
                k = len(t.inputs)
                return (tuple(x for x in need[:k] if x[0] in track and x[2] > x[1]),
                        tuple(x for x in need[k:] if x[0] in track and x[2] > x[1]))

        def declared(n: str) -> tuple:
            if n not in ranges:
                return (n, 0, track[n])
            rl = _ops.row_len(bufs[n].shape)
            return (n, ranges[n][0] * rl, ranges[n][1] * rl)

        reads = tuple(declared(n) for n in t.inputs if n in track)
        writes = tuple(declared(n) for n in t.outputs if n in track)
        return reads, writes

    # 2. ordering --------------------------------------------------------------------------------------
    def _order(self) -> None:
        """Satisfiability, partial joins, and backward edges (producer not earlier in the list)."""
        self.backward: list[tuple[int, int]] = []  # (producer index, waiter index)
        self.self_waits: list[int] = []
        prods, add, ncnt = self.prods, self.diags.append, self.s.num_counters
        for i, t in enumerate(self.tasks):
            for w in t.waits:
                c, th = w.counter, w.threshold
                if not 0 <= c < ncnt:
                    continue
                p = prods.get(c)
                n = len(p) if p else 0
                if th < 1 or n == 0 or th > n:
                    add(Diagnostic("unsatisfiable-wait", _where(t.id), f"1 <= threshold <= {n} producer(s)",
                                   th, f"wait on counter {c}" + ("" if n else " which no task signals")))
                    if th < 1 or n == 0:
                        continue
                elif 1 < th < n:
                    add(Diagnostic("partial-join", _where(t.id, *(self.tasks[j].id for j in p)),
                                   f"threshold {n} (all producers) or 1", th,
                                   f"counter {c} has {n} producers: a first-{th}-of-{n} wait"))
                if p[-1] >= i:
                    for j in p:
                        if j == i:
                            self.self_waits.append(i)
                        elif j > i:
                            self.backward.append((j, i))

    # 3. happens-before --------------------------------------------------------------------------------
    def happens_before(self) -> list[int]:
        """pred[i]: bitset of tasks guaranteed to have finished before task i starts (list order must
        be topological: call only without backward edges)."""
        tasks, prods, ncnt = self.tasks, self.prods, self.s.num_counters
        pred = [0] * self.n
        last_on: dict[int, int] = {}
        join_all: dict[int, int] = {}
        join_any: dict[int, int] = {}
        for i, t in enumerate(tasks):
            prev = last_on.get(t.sm)
            acc = (pred[prev] | (1 << prev)) if prev is not None else 0
            last_on[t.sm] = i
            for w in t.waits:
                c, th = w.counter, w.threshold
                if th < 1 or not 0 <= c < ncnt:
                    continue
                p = prods.get(c)
                if not p or th > len(p):
                    continue
                if th == len(p):
                    v = join_all.get(c)
                    if v is None:
                        v = 0
                        for j in p:
                            v |= pred[j] | (1 << j)
                        join_all[c] = v
                else:
                    v = join_any.get(c)
                    if v is None:
                        v = -1
                        for j in p:
                            v &= pred[j] | (1 << j)
                        join_any[c] = v
                acc |= v
            pred[i] = acc
        return pred


def _op_elems(t: Any, bufs: Mapping[str, Any], memo: dict | None = None) -> list[tuple[str, int, int]] | str:
    """The op's declared footprint (``ops.OpSpec.footprint``): one (buffer, lo, hi) element interval per
    operand role (a buffer in two roles appears twice: its one declared range must cover both), or a
    problem (parameters that are not integers, or that reach outside a buffer). ``memo`` caches the
    footprint per (op, parameters with their types, operand shapes): the layers repeat them."""
    spec = _SPECS[t.op]
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


# --------------------------------------------------------------------------------------------------- rules

@attrs.frozen
class Rule:
    code: str
    doc: str
    run: Callable[[Facts, dict], list[Diagnostic]]


def rule_structure(f: Facts, ctx: dict) -> list[Diagnostic]:
    """malformed, capacity, unsatisfiable-wait, partial-join: found while scanning (facts)."""
    return list(f.diags)


def rule_ordering(f: Facts, ctx: dict) -> list[Diagnostic]:
    """cycle, queue-order, list-order: every producer of a waited counter must precede the waiter."""
    out: list[Diagnostic] = []
    tasks = f.tasks
    for i in f.self_waits:
        out.append(Diagnostic("cycle", _where(tasks[i].id), "a producer other than itself", tasks[i].signal,
                              "task waits on its own signal counter"))
    if not f.backward:
        return out
    pc_edges: dict[int, set[int]] = {}
    all_edges: dict[int, set[int]] = {}
    for i, t in enumerate(tasks):  # producer -> waiter edges (satisfiable waits) and queue order
        for w in t.waits:
            if w.threshold >= 1:
                for j in f.prods.get(w.counter, ()):
                    if j != i:
                        pc_edges.setdefault(j, set()).add(i)
                        all_edges.setdefault(j, set()).add(i)
    last: dict[int, int] = {}
    for i, t in enumerate(tasks):
        if t.sm in last:
            all_edges.setdefault(last[t.sm], set()).add(i)
        last[t.sm] = i
    pc_sccs = [c for c in _sccs(f.n, pc_edges) if len(c) > 1]
    in_pc = set().union(*pc_sccs) if pc_sccs else set()
    for comp in pc_sccs:
        out.append(Diagnostic("cycle", _where(*(tasks[k].id for k in comp)), "an acyclic producer graph",
                              len(comp), "producer -> consumer cycle"))
    explained: set[tuple[int, int]] = set()
    for j, i in f.backward:
        if tasks[j].sm == tasks[i].sm:
            explained.add((j, i))
            out.append(Diagnostic("queue-order", _where(tasks[i].id, tasks[j].id),
                                  f"producer {tasks[j].id} before consumer {tasks[i].id} on SM {tasks[i].sm}",
                                  "after", "consumer is queued before its producer on the same SM"))
    comp_of: dict[int, int] = {}
    for k, comp in enumerate(c for c in _sccs(f.n, all_edges) if len(c) > 1):
        for v in comp:
            comp_of[v] = k
        back = [(j, i) for j, i in f.backward if j in comp and i in comp]
        if not (comp & in_pc) and not all(e in explained for e in back):
            out.append(Diagnostic("cycle", _where(*(tasks[v].id for v in comp)), "an acyclic wait-for graph",
                                  len(comp), "wait-for cycle through SM queue order (deadlock)"))
        explained.update(back)
    for j, i in f.backward:
        if (j, i) not in explained and not (j in in_pc and i in in_pc):
            out.append(Diagnostic("list-order", _where(tasks[i].id, tasks[j].id),
                                  f"producer {tasks[j].id} listed before consumer {tasks[i].id}", "after",
                                  "the task list is not a topological order"))
    return out


def _sccs(n: int, edges: Mapping[int, set[int]]) -> list[set[int]]:
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


def rule_races(f: Facts, ctx: dict) -> list[Diagnostic]:
    """unordered-read, kv-order, write-race: every conflicting pair of accesses to overlapping rows
    must be ordered by happens-before (checked against each segment's last writer and readers since)."""
    if f.backward or f.self_waits:
        return []  # happens-before is undefined on a cyclic/unsorted list; already rejected
    pred = f.happens_before()
    bufs = f.bufs
    segs: dict[str, list] = {}  # buffer -> [starts, writers, readers]
    found: dict[tuple, set] = {}
    tasks = f.tasks
    for i, (reads, writes) in enumerate(f.access):
        mine = pred[i] | (1 << i)
        for name, lo, hi in reads:
            st = segs.get(name)
            if st is None:
                st = segs[name] = [[0], [_LAUNCH if bufs[name].kind in _INIT_KINDS else _UNINIT], [0]]
            starts, writers, readers = st
            a, b = _split(st, lo, hi)
            for k in range(a, b):
                w = writers[k]
                if w >= 0:
                    if not (mine >> w) & 1:
                        code = "kv-order" if bufs[name].kind == "kv_cache" else "unordered-read"
                        found.setdefault((code, i, name, "raw"), set()).add(w)
                elif w == _UNINIT:
                    found.setdefault(("unordered-read", i, name, "uninit"), set())
                readers[k] |= 1 << i
        for name, lo, hi in writes:
            st = segs.get(name)
            if st is None:
                st = segs[name] = [[0], [_LAUNCH if bufs[name].kind in _INIT_KINDS else _UNINIT], [0]]
            starts, writers, readers = st
            a, b = _split(st, lo, hi)
            for k in range(a, b):
                w = writers[k]
                if w >= 0 and not (mine >> w) & 1:
                    found.setdefault(("write-race", i, name, "waw"), set()).add(w)
                bad = readers[k] & ~mine
                if bad:
                    code = "kv-order" if bufs[name].kind == "kv_cache" else "unordered-read"
                    found.setdefault((code, i, name, "war"), set()).update(_bits(bad))
                writers[k] = i
                readers[k] = 0
    ctx["segments"] = segs
    out = []
    for (code, i, name, kind), others in found.items():
        t = tasks[i]
        if kind == "uninit":
            out.append(Diagnostic(code, _where(t.id), f"rows of {name} written before the read", "none",
                                  f"{t.op} reads rows of {name} that no earlier task writes"))
            continue
        ids = sorted(tasks[j].id for j in others)
        msg = {"waw": f"{t.op} writes {name} unordered with writer(s) {ids}",
               "war": f"{t.op} overwrites rows of {name} that reader(s) {ids} may not have read yet",
               "raw": f"{t.op} reads {name}, whose writer(s) {ids} are not transitive predecessors"}[kind]
        out.append(Diagnostic(code, _where(t.id, *ids), "happens-before", "unordered", msg))
    return out


def _split(st: list, lo: int, hi: int) -> tuple[int, int]:
    """Make segment boundaries at lo and hi; return the index range of the segments in [lo, hi)."""
    starts, writers, readers = st
    a = bisect_right(starts, lo) - 1
    if starts[a] != lo:
        a += 1
        starts.insert(a, lo)
        writers.insert(a, writers[a - 1])
        readers.insert(a, readers[a - 1])
    b = bisect_right(starts, hi) - 1
    if starts[b] != hi:
        b += 1
        starts.insert(b, hi)
        writers.insert(b, writers[b - 1])
        readers.insert(b, readers[b - 1])
    return a, b


def _bits(v: int) -> list[int]:
    out = []
    while v:
        low = v & -v
        out.append(low.bit_length() - 1)
        v ^= low
    return out


def rule_outputs(f: Facts, ctx: dict) -> list[Diagnostic]:
    """unreachable-output: every output buffer is written (all its rows) by some task."""
    out = []
    written: dict[str, list[tuple[int, int]]] = {}
    for _, writes in f.access:
        for name, lo, hi in writes:
            written.setdefault(name, []).append((lo, hi))
    for name in f.s.outputs:
        b = f.bufs.get(name)
        if b is None or not b.shape:
            continue  # malformed, reported
        spans = sorted(written.get(name, ()))
        if not spans:
            out.append(Diagnostic("unreachable-output", f"output {name}", "a task that writes it", "none",
                                  "no task produces this output"))
            continue
        if b.kind in _INIT_KINDS:
            continue
        reach, gaps = 0, []
        for lo, hi in spans:
            if lo > reach:
                gaps.append([reach, lo])
            reach = max(reach, hi)
        size = _ops.numel(b.shape)
        if reach < size:
            gaps.append([reach, size])
        if gaps:
            out.append(Diagnostic("unreachable-output", f"output {name}", "every element written", gaps,
                                  "elements of this output that no task writes"))
    return out


RULES: tuple[Rule, ...] = (
    Rule("malformed|capacity|unsatisfiable-wait|partial-join", "structure, references, ABI capacity, waits",
         rule_structure),
    Rule("cycle|queue-order|list-order", "the task list is a topological order of the wait-for graph",
         rule_ordering),
    Rule("unordered-read|kv-order|write-race", "conflicting accesses are ordered by happens-before",
         rule_races),
    Rule("unreachable-output", "every output is produced", rule_outputs),
)


# --------------------------------------------------------------------------------------------------- screen
# The fast screen: the same rules, restated over the columnar form (mosaic_amk.columns) as whole-column
# numpy checks. It answers one question: "would the rule table above return no diagnostic at all?". It
# may only answer True when the exact rules would return nothing (each check below implies the absence
# of the diagnostics named beside it); any doubt, any unusual shape (a buffer written after it is read,
# overlapping writes, an exception) answers False and the exact rule table runs and names every problem.
# So the screen decides nothing on its own about an unsafe schedule: it only lets safe ones skip the
# per-task walk. tests/test_validator_parity.py checks verdict and diagnostics against the frozen
# rule table alone (validate_rules).

_OPS = tuple(_SPECS)
_OPCODE = {name: k for k, name in enumerate(_OPS)}
# plain row-split ops, vectorised from their declaration: opcode -> leading input roles read whole
_ROW_OPS = {k: _SPECS[name].whole_prefix() for k, name in enumerate(_OPS) if _SPECS[name].whole_prefix() is not None}
_PER_TASK_OPS = frozenset(k for k, name in enumerate(_OPS) if name not in _WHOLE_OPS and k not in _ROW_OPS)
_INT_ONLY = frozenset((int,))


class _BufView:
    __slots__ = ("name", "shape", "kind")

    def __init__(self, name: str, shape: Any, kind: str):
        self.name, self.shape, self.kind = name, shape, kind


def _screen(c: Any) -> bool:
    """True only if the rule table would find nothing (see the section comment); never raises."""
    try:
        return _screen_checks(c)
    except Exception:  # noqa: BLE001 - any surprise: let the exact rules decide
        return False


def _screen_checks(c: Any) -> bool:  # noqa: C901, PLR0911, PLR0912, PLR0915 - one straight pass
    n, nsm, ncnt = c.n, c.num_sms, c.num_counters
    # -- malformed/capacity (schedule and buffers) ------------------------------------------------------
    if nsm < 1 or ncnt < 0:
        return False
    names, shapes, kinds = c.buf_names, c.buf_shapes, c.buf_kinds
    nb = len(names)
    bid = dict(zip(names, range(nb), strict=True))
    if len(bid) != nb:
        return False  # duplicate buffer name
    if nb and (min(map(len, shapes)) < 1 or max(map(len, shapes)) > MAX_RANK or min(map(min, shapes)) < 1):
        return False
    if not bid.keys() >= set(c.outputs):
        return False
    if n == 0:
        return not c.outputs  # unreachable-output otherwise
    if len(set(c.ids)) != n:
        return False
    sms, sigs = c.sms, c.signals
    if min(sms) < 0 or max(sms) >= nsm or min(sigs) < 0 or max(sigs) >= ncnt:
        return False
    ins, outs, wlen = c.inputs, c.task_outputs, c.wait_len
    in_len, out_len = list(map(len, ins)), list(map(len, outs))
    if max(in_len) > MAX_INPUTS or max(out_len) > MAX_OUTPUTS or max(wlen) > MAX_WAITS:
        return False
    wc, wt = c.wait_counter, c.wait_threshold
    if wc and (min(wc) < 0 or max(wc) >= ncnt):
        return False
    # -- unsatisfiable-wait, partial-join, cycle, queue-order, list-order ---------------------------------
    # every wait: 1 <= t <= #producers, t in {1, #producers}, and every producer earlier in the list
    # (then no producer is the waiter itself or later: no self-wait, no backward edge)
    ar = np.arange(n)
    sig = np.fromiter(sigs, np.int64, n)
    nprod = np.bincount(sig, minlength=ncnt)
    wc_a, wt_a = np.fromiter(wc, np.int64, len(wc)), np.fromiter(wt, np.int64, len(wt))
    w_task = np.repeat(ar, wlen)
    if len(wc):
        last = np.full(ncnt, -1, np.int64)
        np.maximum.at(last, sig, ar)
        np_w = nprod[wc_a]
        if not ((wt_a >= 1) & (wt_a <= np_w) & ((wt_a == 1) | (wt_a == np_w)) & (last[wc_a] < w_task)).all():
            return False
    # -- malformed: references, weights written, op table, parameters, arity ------------------------------
    rows = np.fromiter(map(itemgetter(0), shapes), np.int64, nb)
    size = np.fromiter(map(_ops.numel, shapes), np.int64, nb)  # elements
    rlen = size // rows  # elements per row of axis 0 (extents checked >= 1 above)
    is_weight = np.fromiter((k == "weight" for k in kinds), bool, nb)
    n_in, n_out = sum(in_len), sum(out_len)
    in_b = np.fromiter(map(bid.__getitem__, chain.from_iterable(ins)), np.int64, n_in)  # KeyError: unknown
    out_b = np.fromiter(map(bid.__getitem__, chain.from_iterable(outs)), np.int64, n_out)
    if is_weight[out_b].any():
        return False
    op_a = np.fromiter(map(_OPCODE.__getitem__, c.ops), np.int64, n)  # KeyError: unknown op
    in_len_a, out_len_a = np.fromiter(in_len, np.int64, n), np.fromiter(out_len, np.int64, n)
    in_task, out_task = np.repeat(ar, in_len_a), np.repeat(ar, out_len_a)
    in_off = np.cumsum(in_len_a) - in_len_a
    in_slot = np.arange(n_in) - in_off[in_task]
    in_lo, in_hi = np.zeros(n_in, np.int64), size[in_b]
    out_lo, out_hi = np.zeros(n_out, np.int64), size[out_b]
    params = c.params
    present = np.bincount(op_a, minlength=len(_OPS))
    rows_task = np.zeros(n, bool)
    prefix = np.zeros(n, np.int64)
    rs_all, re_all = np.zeros(n, np.int64), np.zeros(n, np.int64)
    per_task: list[int] = []
    for k in np.flatnonzero(present).tolist():
        spec = _SPECS[_OPS[k]]
        idx = np.flatnonzero(op_a == k)
        group = list(map(params.__getitem__, idx.tolist()))
        if spec.params:
            got = list(map(itemgetter(*spec.params), group))  # KeyError: a missing parameter
            if len(spec.params) == 1:
                got = [(v,) for v in got]
        want = len(spec.inputs)
        for flag, _ in spec.optional:  # every optional flag is a required parameter too
            vals = list(map(itemgetter(spec.params.index(flag)), got))
            if any(vals):
                want = want + np.fromiter(map(bool, vals), np.int64, len(vals))
        if not ((in_len_a[idx] == want).all() and (out_len_a[idx] == len(spec.outputs)).all()):
            return False
        if k in _ROW_OPS:
            p_rs, p_re = spec.params.index("row_start"), spec.params.index("row_end")
            rs = list(map(itemgetter(p_rs), got))
            re = list(map(itemgetter(p_re), got))
            if not (set(map(type, rs)) <= _INT_ONLY and set(map(type, re)) <= _INT_ONLY):
                return False
            rs_a, re_a = np.fromiter(rs, np.int64, len(rs)), np.fromiter(re, np.int64, len(re))
            if not ((rs_a >= 0) & (rs_a < re_a)).all():
                return False
            rows_task[idx] = True
            prefix[idx] = _ROW_OPS[k]
            rs_all[idx], re_all[idx] = rs_a, re_a
        elif k in _PER_TASK_OPS:
            per_task.extend(idx.tolist())
    if rows_task.any():  # y and every input role after the whole-read prefix: rows [row_start, row_end)
        sel = rows_task[in_task] & (in_slot >= prefix[in_task])
        t_sel = in_task[sel]
        b_sel = in_b[sel]
        sel_o = rows_task[out_task]  # arity checked: exactly one output
        t_o = out_task[sel_o]
        b_o = out_b[sel_o]
        if not ((re_all[t_sel] <= rows[b_sel]).all() and (re_all[t_o] <= rows[b_o]).all()):
            return False
        in_lo[sel], in_hi[sel] = rs_all[t_sel] * rlen[b_sel], re_all[t_sel] * rlen[b_sel]
        out_lo[sel_o], out_hi[sel_o] = rs_all[t_o] * rlen[b_o], re_all[t_o] * rlen[b_o]
    if per_task:  # kv appends, attention, argmax, ...: the declared footprint function, task by task
        recs = c.records
        if recs is not None:
            bufs = recs.buffer_map()
        else:
            bufs = {nm: _BufView(nm, sh, kd) for nm, sh, kd in zip(names, shapes, kinds, strict=True)}
        in_start = in_off.tolist()
        out_start = (np.cumsum(out_len_a) - out_len_a).tolist()
        pos_i, pos_o, need_i, need_o = [], [], [], []
        memo: dict = {}  # the layers repeat the same (op, params, shapes): one footprint call each
        for i in per_task:
            op, t_in, t_out, tp = c.ops[i], ins[i], outs[i], params[i]
            spec = _SPECS[op]
            if spec.writes == "kv_slot" and bufs[t_out[0]].kind != "kv_cache":
                return False
            shp = [bufs[nm].shape for nm in chain(t_in, t_out)]
            try:
                key = (op, *tp.items(), *map(type, tp.values()), *shp)  # types: 1, 1.0 and True differ
                need = memo.get(key)
            except TypeError:  # unhashable values (raw JSON lists): no memo
                key = need = None
            if need is None:
                need = spec.footprint(tp, shp[:len(t_in)], shp[len(t_in):])
                if isinstance(need, str):
                    return False
                if key is not None:
                    memo[key] = need
            m = in_len[i]
            pos_i.extend(range(in_start[i], in_start[i] + m))
            pos_o.extend(range(out_start[i], out_start[i] + out_len[i]))
            need_i.extend(need[:m])
            need_o.extend(need[m:])
        in_lo[pos_i] = [x[0] for x in need_i]
        in_hi[pos_i] = [x[1] for x in need_i]
        out_lo[pos_o] = [x[0] for x in need_o]
        out_hi[pos_o] = [x[1] for x in need_o]
    # -- malformed: ranges (named operands only, within bounds, covering what the op touches) ------------
    rngs = c.ranges
    r_len = np.fromiter(map(len, rngs), np.int64, n)
    n_r = int(r_len.sum())
    if n_r:
        r_b = np.fromiter(map(bid.get, chain.from_iterable(rngs), repeat(-1)), np.int64, n_r)
        lohi = np.fromiter(chain.from_iterable(chain.from_iterable(map(dict.values, rngs))), np.int64, 2 * n_r)
        r_lo, r_hi = lohi[0::2], lohi[1::2]
        if (r_b < 0).any() or not ((r_lo >= 0) & (r_lo < r_hi) & (r_hi <= rows[r_b])).all():
            return False
        r_lo, r_hi = r_lo * rlen[r_b], r_hi * rlen[r_b]
        # each task's operands as a padded row (inputs, then outputs): buffer id and the rows it needs
        mi = int(in_len_a.max())
        width = mi + int(out_len_a.max())
        op_b = np.full((n, width), -1, np.int64)
        op_lo, op_hi = np.zeros((n, width), np.int64), np.zeros((n, width), np.int64)
        out_slot = np.arange(n_out) - (np.cumsum(out_len_a) - out_len_a)[out_task] + mi
        op_b[in_task, in_slot], op_lo[in_task, in_slot], op_hi[in_task, in_slot] = in_b, in_lo, in_hi
        op_b[out_task, out_slot], op_lo[out_task, out_slot], op_hi[out_task, out_slot] = out_b, out_lo, out_hi
        r_t = np.repeat(ar, r_len)
        hit = op_b[r_t] == r_b[:, None]
        if not hit.any(axis=1).all():
            return False  # a ranges entry for a buffer the task does not name
        lo_t, hi_t = op_lo[r_t], op_hi[r_t]
        if (hit & (hi_t > lo_t) & ((lo_t < r_lo[:, None]) | (hi_t > r_hi[:, None]))).any():
            return False  # declared rows narrower than what the op touches
    # -- unordered-read, kv-order, write-race: per buffer, all writes (disjoint rows) before all reads ----
    tracked = ~is_weight
    wsel, rsel = tracked[out_b] & (out_hi > out_lo), tracked[in_b] & (in_hi > in_lo)  # empty: no access
    w_t, w_b, w_lo, w_hi = out_task[wsel], out_b[wsel], out_lo[wsel], out_hi[wsel]
    r_t, r_b2, r_lo2, r_hi2 = in_task[rsel], in_b[rsel], in_lo[rsel], in_hi[rsel]
    max_w = np.full(nb, -1, np.int64)
    np.maximum.at(max_w, w_b, w_t)
    min_r = np.full(nb, n, np.int64)
    np.minimum.at(min_r, r_b2, r_t)
    if not (max_w < min_r).all():
        return False  # a buffer read before (or by) one of its writers: the exact rules decide
    order = np.lexsort((w_lo, w_b))
    sb, slo, shi, st = w_b[order], w_lo[order], w_hi[order], w_t[order]
    if len(sb) > 1 and ((sb[1:] == sb[:-1]) & (shi[:-1] > slo[1:])).any():
        return False  # overlapping writes of one buffer
    big = int(size.max()) + 1
    k_hi, k_lo = sb * big + shi, sb * big + slo
    a = np.searchsorted(k_hi, r_b2 * big + r_lo2, "right")
    b = np.searchsorted(k_lo, r_b2 * big + r_hi2, "left")
    cnt = b - a
    init = np.fromiter((k in _INIT_KINDS for k in kinds), bool, nb)
    need_cover = ~init[r_b2]
    if need_cover.any():
        cum = np.concatenate(([0], np.cumsum(shi - slo)))
        has = cnt > 0
        ac, bc = np.minimum(a, len(sb) - 1), np.maximum(b - 1, 0)
        covered = np.where(has, cum[b] - cum[a] - np.maximum(0, r_lo2 - slo[ac]) - np.maximum(0, shi[bc] - r_hi2), 0)
        if (need_cover & (covered != r_hi2 - r_lo2)).any():
            return False  # rows read that nothing earlier writes
    total = int(cnt.sum())
    if total:
        rd = np.repeat(np.arange(len(r_t)), cnt)
        starts = np.cumsum(cnt) - cnt
        wpos = a[rd] + (np.arange(total) - starts[rd])
        wj, ri = st[wpos], r_t[rd]
        sm_a = np.fromiter(sms, np.int64, n)
        direct = sm_a[wj] == sm_a[ri]  # same SM, earlier (every writer precedes every reader)
        if len(wc):  # an all-join wait of the reader on the writer's counter
            full = wt_a == nprod[wc_a]
            aj = np.unique(w_task[full] * ncnt + wc_a[full])
            key = ri * ncnt + sig[wj]
            p = np.minimum(np.searchsorted(aj, key), max(len(aj) - 1, 0))
            if len(aj):
                direct |= aj[p] == key
        if not direct.all():  # transitive: through chains of all-join waits (counter level), else exact
            wj, ri = wj[~direct], ri[~direct]
            mine = _counter_closure(w_task[full], wc_a[full], sig, ncnt, ri)
            if not all(map(_has_bit, mine, sig[wj].tolist())):
                pred = _pred_bits(c, nprod)
                for j, i in zip(wj.tolist(), ri.tolist(), strict=True):
                    if not (pred[i] >> j) & 1:
                        return False
    # -- unreachable-output ---------------------------------------------------------------------------
    if c.outputs:
        n_w = np.bincount(w_b, minlength=nb)
        rows_w = np.bincount(w_b, weights=(w_hi - w_lo), minlength=nb)
        for name in c.outputs:
            k = bid[name]
            if not n_w[k] or (not init[k] and rows_w[k] != size[k]):
                return False
    return True


def _has_bit(bits: int, k: int) -> bool:
    return bool((bits >> k) & 1)


def _counter_closure(w_task: Any, w_counter: Any, sig: Any, ncnt: int, readers: Any) -> list[int]:
    """For each task in ``readers``, the bitset of counters all of whose producers are guaranteed to
    finish before it starts, following all-join waits only (``w_task``/``w_counter``: every all-join
    wait). An under-approximation of ``pred``: SM order and first-of-N waits are left out, so a pair it
    cannot show ordered goes to the exact ``_pred_bits``.

    ``kc[d]``: counters complete before *every* task that all-joins ``d`` starts. A producer ``p`` of
    ``d`` that all-joins ``e`` knows ``e`` and ``kc[e]``; a task that all-joins ``d`` knows all of
    ``d``'s producers, so (``pred`` is transitive) everything any of them knows: ``kc[d] |= bit(e) |
    kc[e]``. Edges are taken once each, in list order of their first waiter, so ``kc[e]`` is final
    when used (every producer of ``e`` precedes every waiter on ``e``)."""
    key = sig[w_task] * ncnt + w_counter  # edge: producer of sig -> all-joins w_counter
    uniq, first = np.unique(key, return_index=True)
    uniq = uniq[np.argsort(first, kind="stable")]
    kc = [0] * ncnt
    for d, e in zip((uniq // ncnt).tolist(), (uniq % ncnt).tolist(), strict=True):
        kc[d] |= kc[e] | (1 << e)
    r_uniq, r_inv = np.unique(readers, return_inverse=True)
    sel = np.isin(w_task, r_uniq)
    known = dict.fromkeys(r_uniq.tolist(), 0)
    for i, e in zip(w_task[sel].tolist(), w_counter[sel].tolist(), strict=True):
        known[i] |= kc[e] | (1 << e)
    per = [known[i] for i in r_uniq.tolist()]
    return [per[k] for k in r_inv.tolist()]


def _pred_bits(c: Any, nprod: Any) -> list[int]:
    """``Facts.happens_before`` over columns, for a schedule whose waits passed the screen (so every
    wait is satisfiable and all its producers are earlier): pred[i] as a bitset of task indices."""
    n, sms, wlen = c.n, c.sms, c.wait_len
    wc, wt = c.wait_counter, c.wait_threshold
    prods: dict[int, list[int]] = {}
    for i, s in enumerate(c.signals):
        p = prods.get(s)
        if p is None:
            prods[s] = [i]
        else:
            p.append(i)
    pb = [0] * n  # pred[i] | bit i
    pred = [0] * n
    last_on: dict[int, int] = {}
    joins: dict[tuple[int, bool], int] = {}
    k = 0
    for i in range(n):
        sm = sms[i]
        prev = last_on.get(sm)
        acc = pb[prev] if prev is not None else 0
        last_on[sm] = i
        for _ in range(wlen[i]):
            cn = wc[k]
            every = wt[k] == len(prods[cn])
            k += 1
            v = joins.get((cn, every))
            if v is None:
                if every:
                    v = 0
                    for j in prods[cn]:
                        v |= pb[j]
                else:
                    v = -1
                    for j in prods[cn]:
                        v &= pb[j]
                joins[(cn, every)] = v
            acc |= v
        pred[i] = acc
        pb[i] = acc | (1 << i)
    return pred


# --------------------------------------------------------------------------------------------------- entry

def validate(schedule: Any) -> ValidationResult:
    """Check a :class:`Schedule` (or its raw JSON object). Total: returns every diagnostic, never raises
    on bad data (an internal failure is itself reported as ``malformed``, so the verdict fails closed).

    The columnar screen may only say "no problem at all"; anything else goes to the rule table."""
    if isinstance(schedule, Schedule):
        if _screen(_columns.from_schedule(schedule)):
            return ValidationResult((), len(schedule.tasks))
    else:
        cols = _columns.from_raw(schedule)
        if cols is not None and _screen(cols):
            return ValidationResult((), cols.n)
    return validate_rules(schedule)


def validate_rules(schedule: Any) -> ValidationResult:
    """The rule table alone, without the screen: the reference the screen is tested against."""
    if not isinstance(schedule, Schedule):
        built, diags = _build_lenient(schedule)
        if built is None:
            return ValidationResult(tuple(diags), 0)
        schedule = built
    try:
        facts = Facts(schedule)
        ctx: dict = {}
        diags = []
        for rule in RULES:
            diags.extend(rule.run(facts, ctx))
    except Exception as exc:  # noqa: BLE001 - totality: fail closed, never raise on data
        return ValidationResult((Diagnostic("malformed", "schedule", "an analysable schedule",
                                            type(exc).__name__, f"validator could not analyse it: {exc}"),),
                                len(getattr(schedule, "tasks", ())))
    return ValidationResult(tuple(diags), facts.n)


def _build_lenient(data: Any) -> tuple[Schedule | None, list[Diagnostic]]:
    """Raw JSON -> Schedule, or every structural problem as a ``malformed`` diagnostic."""
    diags: list[Diagnostic] = []
    bad = lambda where, what, actual=None: diags.append(  # noqa: E731
        Diagnostic("malformed", where, None, actual, what))
    if not isinstance(data, Mapping):
        bad("schedule", f"not a JSON object ({type(data).__name__})")
        return None, diags
    if data.get("format") != FORMAT:
        bad("schedule", f"format tag must be {FORMAT!r}", data.get("format"))
    if data.get("version") != VERSION or isinstance(data.get("version"), bool):
        bad("schedule", f"version must be {VERSION}", data.get("version"))
    known = {"format", "version", "num_sms", "buffers", "num_counters", "tasks", "outputs", "meta"}
    for k in sorted(set(map(str, data)) - known):
        bad("schedule", "unknown top-level field", k)
    for k in ("num_sms", "num_counters"):
        if not _is_int(data.get(k)):
            bad("schedule", f"{k} must be an integer", data.get(k))
    if "meta" in data and not isinstance(data["meta"], Mapping):
        bad("schedule", "meta must be a JSON object", type(data["meta"]).__name__)
    for key, cls in (("buffers", Buffer), ("tasks", Task)):
        items = data.get(key)
        if not isinstance(items, list):
            bad("schedule", f"{key} must be a list", type(items).__name__)
            continue
        for n, item in enumerate(items):
            try:
                cls.from_json(item)
            except Exception as exc:  # noqa: BLE001 - BadInput/RecordError and anything odd in the data
                where = f"{key}[{n}]"
                if isinstance(item, Mapping) and "id" in item and key == "tasks":
                    where += f" (task {item.get('id')!r})"
                bad(where, getattr(exc, "what", str(exc)))
    outs = data.get("outputs")
    if not isinstance(outs, list) or any(not isinstance(o, str) for o in outs):
        bad("schedule", "outputs must be a list of buffer names", outs if not isinstance(outs, list) else None)
    if diags:
        return None, diags
    body = {k: v for k, v in data.items() if k not in ("format", "version")}
    try:
        return Schedule(**body), []
    except Exception as exc:  # noqa: BLE001
        bad("schedule", getattr(exc, "what", str(exc)))
        return None, diags


__all__ = ["CODES", "RULES", "Facts", "Rule", "ValidationResult", "validate"]
