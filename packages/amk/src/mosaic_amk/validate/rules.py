"""The static schedule validator's rule table: one rule function per diagnostic code, as data.

Every rule in :data:`RULES` runs on every schedule (tinygrad ``uop/spec.py`` style): a rule reads the
shared :class:`~mosaic_amk.validate.facts.Facts` and returns each problem of its code as a structured
:class:`~mosaic.errors.Diagnostic` (a stable ``code``, the task ids in ``where``, expected and actual
values), each with a report key. :func:`validate_rules` merges them by key, so the report lists problems
in schedule order (schedule fields, buffers, outputs, tasks, waits, ordering, accesses, outputs
produced), whatever order the table is in. The argument that an accepted schedule cannot deadlock or
race, rule by rule, is in docs/amk-schedule.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
from mosaic.errors import CheckFailed, Diagnostic

from mosaic_amk.footprints import numel
from mosaic_amk.schedule import (
    FORMAT,
    MAX_COUNTERS,
    MAX_ELEMENTS,
    MAX_HEAD_DIM,
    MAX_INPUTS,
    MAX_OUTPUTS,
    MAX_RANK,
    MAX_SMS,
    MAX_WAITS,
    VERSION,
    Buffer,
    PagePool,
    Schedule,
    Task,
)
from mosaic_amk.validate.facts import INIT_KINDS, SPECS, Facts, where

Found = list[tuple[tuple, Diagnostic]]  # (report key, diagnostic)


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


@attrs.frozen
class Rule:
    """One diagnostic code: what it means, and the function that finds every instance of it."""

    code: str
    doc: str
    run: Callable[[Facts], Found]


# Report keys: (0, k) schedule fields, (1, buffer, k) buffers, (2, k) outputs, (3, task, k, ...) tasks,
# (4, task, wait) waits, (5, kind, k) ordering, (6, k) accesses, (7, k) outputs produced.

def rule_malformed(f: Facts) -> Found:
    """A bad reference, arity or parameter; an out-of-bounds counter, SM, buffer or rows; a duplicate id
    or name; a write to a weight (not-a-schedule structure is found before the facts, in raw JSON)."""
    s, out = f.s, []
    add = out.append
    if s.num_sms < 1:
        add(((0, 0), Diagnostic("malformed", "schedule", ">= 1", s.num_sms, "num_sms must be at least 1")))
    if s.num_counters < 0:
        add(((0, 1), Diagnostic("malformed", "schedule", ">= 0", s.num_counters, "num_counters must be >= 0")))
    names: set[str] = set()
    for j, b in enumerate(s.buffers):
        if b.name in names:
            add(((1, j, 0), Diagnostic("malformed", f"buffer {b.name}", "unique names", "duplicate",
                                       "buffer name repeated")))
        names.add(b.name)
        if not b.shape or any(d < 1 for d in b.shape):
            add(((1, j, 2), Diagnostic("malformed", f"buffer {b.name}", "rank >= 1 and extents >= 1",
                                       list(b.shape), "bad buffer shape")))
    for k, name in enumerate(s.outputs):
        if name not in names:
            add(((2, k), Diagnostic("malformed", "schedule outputs", "a declared buffer", name,
                                    "unknown output buffer")))
    nsm, ncnt = s.num_sms, s.num_counters
    seen: set[int] = set()
    unfit = f.unfit
    for i, t in enumerate(f.tasks):
        tid = t.id
        if tid in seen:
            add(((3, i, 0), Diagnostic("malformed", where(tid), "unique task ids", "duplicate", "task id repeated")))
        seen.add(tid)
        if not 0 <= t.sm < nsm:
            add(((3, i, 1), Diagnostic("malformed", where(tid), f"sm in [0, {nsm})", t.sm, "SM out of bounds")))
        if not 0 <= t.signal < ncnt:
            add(((3, i, 2), Diagnostic("malformed", where(tid), f"signal in [0, {ncnt})", t.signal,
                                       "signal counter out of bounds")))
        for k, w in enumerate(t.waits):
            if not 0 <= w.counter < ncnt:
                add(((3, i, 4, k), Diagnostic("malformed", where(tid), f"counter in [0, {ncnt})", w.counter,
                                              "wait on an out-of-bounds counter")))
        for k, (expected, actual, message) in enumerate(unfit.get(i, ())):
            add(((3, i, 5, k), Diagnostic("malformed", where(tid), expected, actual, message)))
    return out + _paged(f, "malformed")


def _paged(f: Facts, code: str) -> Found:
    """The page protocol's static problems of one code (validate/pages.py), none without pages."""
    return f.pages.found(code) if f.pages is not None else []


def rule_capacity(f: Facts) -> Found:
    """More than 8 inputs, 4 outputs or 8 waits on a task, or a buffer of rank > 4 (the VM ABI); more SMs,
    counters, buffer elements or a larger head_dim than any GPU or VM has (schedule.MAX_*)."""
    out = []
    s = f.s
    if s.num_sms > MAX_SMS:
        out.append(((0, 2), Diagnostic("capacity", "schedule", f"num_sms <= {MAX_SMS}", _short(s.num_sms),
                                       "more SMs than any GPU has")))
    if s.num_counters > MAX_COUNTERS:
        out.append(((0, 3), Diagnostic("capacity", "schedule", f"num_counters <= {MAX_COUNTERS}",
                                       _short(s.num_counters), "more counters than the VM holds")))
    for j, b in enumerate(s.buffers):
        if len(b.shape) > MAX_RANK:
            out.append(((1, j, 1), Diagnostic("capacity", f"buffer {b.name}", f"rank <= {MAX_RANK}", len(b.shape),
                                              "buffer rank exceeds the VM ABI")))
        elif b.shape and min(b.shape) >= 1 and numel(b.shape) > MAX_ELEMENTS:
            out.append(((1, j, 3), Diagnostic("capacity", f"buffer {b.name}", f"<= {MAX_ELEMENTS} elements",
                                              _short(numel(b.shape)), "buffer larger than any GPU's memory")))
    for i, t in enumerate(f.tasks):
        ins, outs, waits = t.inputs, t.outputs, t.waits
        if len(ins) > MAX_INPUTS or len(outs) > MAX_OUTPUTS or len(waits) > MAX_WAITS:
            out.append(((3, i, 3), Diagnostic(
                "capacity", where(t.id), f"<= {MAX_INPUTS} inputs, {MAX_OUTPUTS} outputs, {MAX_WAITS} waits",
                f"{len(ins)} inputs, {len(outs)} outputs, {len(waits)} waits", "task descriptor exceeds the VM ABI")))
        spec = SPECS.get(t.op)
        hd = t.params.get("head_dim") if spec is not None and "head_dim" in spec.params else None
        if _is_int(hd) and hd > MAX_HEAD_DIM:
            out.append(((3, i, 3, 1), Diagnostic("capacity", where(t.id), f"head_dim <= {MAX_HEAD_DIM}", _short(hd),
                                                 "head_dim larger than any VM's attention")))
    return out + _paged(f, "capacity")


def _short(v: int) -> Any:
    """An integer as itself, or its digit count when it is too long to print."""
    return v if abs(v) < 10**40 else f"an integer of {len(str(abs(v)))} digits"


def rule_unsatisfiable_wait(f: Facts) -> Found:
    """Threshold < 1, a counter with no producer, or threshold > its producer count."""
    out, tasks = [], f.tasks
    for i, k, c, th, n in f.wait_sites:
        if th < 1 or n == 0 or th > n:
            out.append(((4, i, k), Diagnostic("unsatisfiable-wait", where(tasks[i].id),
                                              f"1 <= threshold <= {n} producer(s)", th,
                                              f"wait on counter {c}" + ("" if n else " which no task signals"))))
    for fid, k, c, th, n in f.pages.wait_sites if f.pages is not None else ():
        fl = f.pages.fills[fid]
        if th < 1 or n == 0 or th > n:
            out.append(((4, fl.task, 8, fl.k, k), Diagnostic(
                "unsatisfiable-wait", where(tasks[fl.task].id), f"1 <= threshold <= {n} producer(s)", th,
                f"fill of page {fl.page}: wait on counter {c}" + ("" if n else " which no task signals"))))
    return out


def rule_partial_join(f: Facts) -> Found:
    """A wait with 1 < threshold < producers on a shared counter (a first-k-of-N race)."""
    out, tasks = [], f.tasks
    for i, k, c, th, n in f.wait_sites:
        if 1 < th < n:
            out.append(((4, i, k), Diagnostic("partial-join", where(tasks[i].id, *(tasks[j].id for j in f.prods[c])),
                                              f"threshold {n} (all producers) or 1", th,
                                              f"counter {c} has {n} producers: a first-{th}-of-{n} wait")))
    for fid, k, c, th, n in f.pages.wait_sites if f.pages is not None else ():
        fl = f.pages.fills[fid]
        if 1 < th < n:
            out.append(((4, fl.task, 8, fl.k, k), Diagnostic(
                "partial-join", where(tasks[fl.task].id, *(tasks[j].id for j in f.prods[c])),
                f"threshold {n} (all producers) or 1", th,
                f"fill of page {fl.page}: counter {c} has {n} producers: a first-{th}-of-{n} wait")))
    return out


def rule_cycle(f: Facts) -> Found:
    """A cycle in the wait-for graph (producer -> consumer edges, or those plus SM queue order),
    including a task that waits on its own signal."""
    tasks, out = f.tasks, []
    for k, i in enumerate(f.self_waits):
        out.append(((5, 0, k), Diagnostic("cycle", where(tasks[i].id), "a producer other than itself",
                                          tasks[i].signal, "task waits on its own signal counter")))
    o = f.ordering()
    for k, comp in enumerate(o.producer_cycles):
        out.append(((5, 1, k), Diagnostic("cycle", where(*(tasks[v].id for v in comp)), "an acyclic producer graph",
                                          len(comp), "producer -> consumer cycle")))
    for k, comp in enumerate(o.wait_cycles):
        out.append(((5, 3, k), Diagnostic("cycle", where(*(tasks[v].id for v in comp)), "an acyclic wait-for graph",
                                          len(comp), "wait-for cycle through SM queue order (deadlock)")))
    return out


def rule_queue_order(f: Facts) -> Found:
    """A wait whose producer is later in the waiter's own SM queue."""
    tasks = f.tasks
    return [((5, 2, k), Diagnostic("queue-order", where(tasks[i].id, tasks[j].id),
                                   f"producer {tasks[j].id} before consumer {tasks[i].id} on SM {tasks[i].sm}",
                                   "after", "consumer is queued before its producer on the same SM"))
            for k, (j, i) in enumerate(f.ordering().queue_pairs)]


def rule_list_order(f: Facts) -> Found:
    """A wait whose producer comes later in the task list (which must be a topological order) without
    forming a cycle."""
    tasks = f.tasks
    out = [((5, 4, k), Diagnostic("list-order", where(tasks[i].id, tasks[j].id),
                                  f"producer {tasks[j].id} listed before consumer {tasks[i].id}", "after",
                                  "the task list is not a topological order"))
           for k, (j, i) in enumerate(f.ordering().list_pairs)]
    for k, (fid, j) in enumerate(f.pages.backward if f.pages is not None else ()):
        fl = f.pages.fills[fid]
        i = fl.task
        out.append(((5, 5, k), Diagnostic("list-order", where(tasks[i].id, tasks[j].id),
                                          f"producer {tasks[j].id} listed before task {tasks[i].id}, whose fill "
                                          f"of page {fl.page} waits on it", "at or after",
                                          "a loader fill waits on a counter produced at or after its acquiring task "
                                          "(the loader would wait on work queued behind it)")))
    return out


_MESSAGES = {"waw": "{op} writes {name} unordered with writer(s) {ids}",
             "war": "{op} overwrites rows of {name} that reader(s) {ids} may not have read yet",
             "raw": "{op} reads {name}, whose writer(s) {ids} are not transitive predecessors"}


def _conflict(f: Facts, k: int, code: str, kind: str, i: int, name: str, others: set) -> tuple:
    t = f.tasks[i]
    if kind == "uninit":
        return ((6, k), Diagnostic(code, where(t.id), f"rows of {name} written before the read", "none",
                                   f"{t.op} reads rows of {name} that no earlier task writes"))
    ids = sorted(f.tasks[j].id for j in others)
    return ((6, k), Diagnostic(code, where(t.id, *ids), "happens-before", "unordered",
                               _MESSAGES[kind].format(op=t.op, name=name, ids=ids)))


def rule_unordered_read(f: Facts) -> Found:
    """A read of rows whose writer is not a transitive predecessor (or is an unordered later writer, or
    no task writes them)."""
    kv = {n for n, b in f.bufs.items() if b.kind == "kv_cache"}
    return [_conflict(f, k, "unordered-read", kind, i, name, others)
            for k, (kind, i, name, others) in enumerate(f.conflicts())
            if kind == "uninit" or (kind in ("raw", "war") and name not in kv)]


def rule_kv_order(f: Facts) -> Found:
    """A KV-cache read not ordered with a same-pass append to those rows."""
    kv = {n for n, b in f.bufs.items() if b.kind == "kv_cache"}
    return [_conflict(f, k, "kv-order", kind, i, name, others)
            for k, (kind, i, name, others) in enumerate(f.conflicts()) if kind in ("raw", "war") and name in kv]


def rule_write_race(f: Facts) -> Found:
    """Two writers of overlapping rows of one buffer with no happens-before between them."""
    return [_conflict(f, k, "write-race", kind, i, name, others)
            for k, (kind, i, name, others) in enumerate(f.conflicts()) if kind == "waw"]


def rule_unreachable_output(f: Facts) -> Found:
    """An output buffer (or rows of it) that no task writes."""
    out = []
    written: dict[str, list[tuple[int, int]]] = {}
    for _, writes in f.access:
        for name, lo, hi in writes:
            written.setdefault(name, []).append((lo, hi))
    for k, name in enumerate(f.s.outputs):
        b = f.bufs.get(name)
        if b is None or not b.shape:
            continue  # malformed, reported
        spans = sorted(written.get(name, ()))
        if not spans:
            out.append(((7, k), Diagnostic("unreachable-output", f"output {name}", "a task that writes it", "none",
                                           "no task produces this output")))
            continue
        if b.kind in INIT_KINDS:
            continue
        reach, gaps = 0, []
        for lo, hi in spans:
            if lo > reach:
                gaps.append([reach, lo])
            reach = max(reach, hi)
        size = numel(b.shape)
        if reach < size:
            gaps.append([reach, size])
        if gaps:
            out.append(((7, k), Diagnostic("unreachable-output", f"output {name}", "every element written", gaps,
                                           "elements of this output that no task writes")))
    return out


def rule_page_oversubscribed(f: Facts) -> Found:
    """More pages held than an SM's pool: a page outside the pool (or an SM without one), a fill larger than a
    page, or a pool larger than an SM's shared memory."""
    return _paged(f, "page-oversubscribed")


def rule_page_unheld(f: Facts) -> Found:
    """A use of a page that the task's SM did not acquire before it (in queue order) or released already, or a
    release of a page the SM does not hold."""
    return _paged(f, "page-unheld")


def rule_page_reuse(f: Facts) -> Found:
    """A page re-acquired before its previous reader released it: an acquire of a page still held, or a refill
    not ordered (happens-before, through the fill's waits) after every reader of the page's previous fill and the
    task that released it."""
    out = _paged(f, "page-reuse")
    if f.pages is None:
        return out
    f.conflicts()
    tasks = f.tasks
    for k, (fid, late) in enumerate(f.page_order):
        fl = f.pages.fills[fid]
        ids = sorted({tasks[j].id for j in late})
        out.append(((8, 4, k), Diagnostic("page-reuse", where(tasks[fl.task].id, *ids), "happens-before",
                                          "unordered", f"the fill of page {fl.page} of SM {fl.sm} is not ordered "
                                          f"after task(s) {ids}, which read or release its previous contents")))
    return out


_FILL_MESSAGES = {
    "fill-raw": "the fill of {name} rows into page {page} may run ahead of writer(s) {ids} (not ordered before it)",
    "fill-uninit": "the fill of {name} rows into page {page} loads rows that no earlier task writes",
    "fill-war": "writer(s) {ids} of {name} are not ordered after the fill of page {page}, which loads those rows",
    "fill-stale": "writer(s) {ids} of {name} run between the fill of page {page} and a task that reads the page"}


def rule_page_fill_ahead(f: Facts) -> Found:
    """A loader fill that runs ahead of a counter its data depends on: the rows it loads have a writer not ordered
    before the fill (or none), a later writer is not ordered after it, or a writer runs between the fill and a
    reader of the page (the page would hold data older than the reader's)."""
    if f.pages is None:
        return []
    f.conflicts()
    tasks, out = f.tasks, []
    for k, (kind, i, name, others) in enumerate(f.fill_conflicts):
        ids = sorted(tasks[j].id for j in others)
        pages = sorted({fl.page for fl in f.pages.fills if fl.task == i and fl.buffer == name})
        out.append(((8, 5, k), Diagnostic("page-fill-ahead", where(tasks[i].id, *ids), "happens-before",
                                          "unordered" if ids else "none",
                                          _FILL_MESSAGES[kind].format(name=name, ids=ids,
                                                                      page="/".join(map(str, pages))))))
    return out


RULES: tuple[Rule, ...] = (
    Rule("malformed", "bad reference, bad arity, missing parameter, out-of-bounds counter, SM, buffer or rows, "
                      "duplicate id or name, a write to a weight, not a schedule structure", rule_malformed),
    Rule("capacity", "more than 8 inputs, 4 outputs or 8 waits on a task, or a buffer of rank > 4 (the VM ABI); "
                     "more SMs, counters, buffer elements or a larger head_dim than any GPU or VM has",
         rule_capacity),
    Rule("unsatisfiable-wait", "threshold < 1, a counter with no producer, or threshold > its producer count",
         rule_unsatisfiable_wait),
    Rule("cycle", "a cycle in the wait-for graph (producer -> consumer edges, or those plus SM queue order), "
                  "including a task that waits on its own signal", rule_cycle),
    Rule("queue-order", "a wait whose producer is later in the waiter's own SM queue", rule_queue_order),
    Rule("list-order", "a wait whose producer comes later in the task list (which must be a topological order) "
                       "without forming a cycle", rule_list_order),
    Rule("partial-join", "a wait with 1 < threshold < producers on a shared counter (a first-k-of-N race)",
         rule_partial_join),
    Rule("unordered-read", "a read of rows whose writer is not a transitive predecessor (or is an unordered later "
                           "writer, or no task writes them)", rule_unordered_read),
    Rule("kv-order", "a KV-cache read not ordered with a same-pass append to those rows", rule_kv_order),
    Rule("unreachable-output", "an output buffer (or rows of it) that no task writes", rule_unreachable_output),
    Rule("write-race", "two writers of overlapping rows of one buffer with no happens-before between them",
         rule_write_race),
    # the page protocol (docs/amk-schedule.md "Pages"; validate/pages.py)
    Rule("page-oversubscribed", "more pages held than an SM's pool: a page outside the pool (or an SM without one), "
                                "a fill larger than a page, or a pool larger than an SM's shared memory",
         rule_page_oversubscribed),
    Rule("page-unheld", "a use of a page the task's SM did not acquire before it or released already, or a release "
                        "of a page the SM does not hold", rule_page_unheld),
    Rule("page-reuse", "a page re-acquired before its previous reader released it: an acquire of a page still held, "
                       "or a refill not ordered after the readers and the releaser of the page's previous fill",
         rule_page_reuse),
    Rule("page-fill-ahead", "a loader fill that runs ahead of a counter its data depends on: a writer of the rows it "
                            "loads not ordered before it (or none), a later writer not ordered after it, or a writer "
                            "between the fill and a reader of the page", rule_page_fill_ahead),
)
CODES: dict[str, str] = {r.code: r.doc for r in RULES}


def validate_rules(schedule: Any) -> ValidationResult:
    """The rule table alone, without the screen: the reference the screen is tested against. Total:
    every rule runs; an internal failure is itself reported as ``malformed`` (fails closed)."""
    if not isinstance(schedule, Schedule):
        built, diags = _build_lenient(schedule)
        if built is None:
            return ValidationResult(tuple(diags), 0)
        schedule = built
    try:
        facts = Facts(schedule)
        found: Found = []
        for rule in RULES:
            found.extend(rule.run(facts))
    except Exception as exc:  # noqa: BLE001 - totality: fail closed, never raise on data
        return ValidationResult((Diagnostic("malformed", "schedule", "an analysable schedule",
                                            type(exc).__name__, f"validator could not analyse it: {exc}"),),
                                len(getattr(schedule, "tasks", ())))
    found.sort(key=_key)
    return ValidationResult(tuple(d for _, d in found), facts.n)


def _key(item: tuple) -> tuple:
    return item[0]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
    known = {"format", "version", "num_sms", "buffers", "num_counters", "tasks", "outputs", "meta", "page_pools"}
    for k in sorted(set(map(str, data)) - known):
        bad("schedule", "unknown top-level field", k)
    for k in ("num_sms", "num_counters"):
        if not _is_int(data.get(k)):
            bad("schedule", f"{k} must be an integer", data.get(k))
    if "meta" in data and not isinstance(data["meta"], Mapping):
        bad("schedule", "meta must be a JSON object", type(data["meta"]).__name__)
    for key, cls in (("buffers", Buffer), ("tasks", Task), ("page_pools", PagePool)):
        if key == "page_pools" and key not in data:
            continue
        items = data.get(key)
        if not isinstance(items, list):
            bad("schedule", f"{key} must be a list", type(items).__name__)
            continue
        for n, item in enumerate(items):
            try:
                cls.from_json(item)
            except Exception as exc:  # noqa: BLE001 - BadInput/RecordError and anything odd in the data
                where_ = f"{key}[{n}]"
                if isinstance(item, Mapping) and "id" in item and key == "tasks":
                    where_ += f" (task {item.get('id')!r})"
                bad(where_, getattr(exc, "what", str(exc)))
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
