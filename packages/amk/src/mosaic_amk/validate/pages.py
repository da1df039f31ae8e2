"""The page protocol's derived facts (docs/amk-schedule.md "Pages"): what the page rules of the validator read.

A schedule may give SMs a pool of shared-memory pages (``Schedule.page_pools``) and its tasks page operations
(``Task.pages``: the fills the SM's loader *acquires* at the task's place in the queue, the pages the task *uses*,
the pages it *releases* after it runs). :class:`PageFacts` derives, once per schedule:

1. *static problems*, each with its diagnostic code: a malformed pool or fill (``malformed``), too many page
   operations or fill waits (``capacity``), a page outside its SM's pool or a fill larger than a page
   (``page-oversubscribed``), a use or release of a page the SM does not hold at that point of its queue
   (``page-unheld``), an acquire of a page still held (``page-reuse``);
2. the fills in *extended list order* (an SM's loader walks its queue in order, so a task's fills are placed
   just before the task), each fill's wait sites (checked by ``unsatisfiable-wait``/``partial-join`` like a
   task's) and its backward waits (a producer at or after the acquiring task: ``list-order``);
3. per use the fill it reads (the latest acquire of that page on the SM at or before the task) and per fill its
   users and, when it refills a page, the tasks that must happen before it (the previous fill's users and its
   releaser);
4. :meth:`PageFacts.events`: the extended list as events for the happens-before clocks
   (:mod:`mosaic_amk.validate.clocks`): each fill is an event of its SM's *loader* (a clock slot of its own) that
   waits on its fill waits and signals a virtual counter that each of its users waits on (threshold 1), exactly
   the edges of the execution model: a fill knows what its waits acquired and the loader's earlier fills, a user
   knows what its fill knew.

The happens-before checks themselves (a refill ordered after the previous readers, a fill ordered after the
writers of the rows it loads) run inside :meth:`Facts.conflicts <mosaic_amk.validate.facts.Facts.conflicts>`,
which walks the extended list.
"""

from __future__ import annotations

from typing import Any

import attrs
from mosaic.errors import Diagnostic

from mosaic_amk.footprints import row_len
from mosaic_amk.schedule import MAX_PAGE_OPS, MAX_POOL_BYTES, MAX_WAITS, row_bytes

PAGE_CODES = ("page-oversubscribed", "page-unheld", "page-reuse", "page-fill-ahead")


def _where(*ids: Any) -> str:
    uniq = sorted({i for i in ids if isinstance(i, int)})
    return f"task {uniq[0]}" if len(uniq) == 1 else "tasks " + ", ".join(map(str, uniq))


@attrs.frozen
class Fill:
    """One loader fill: its index, the acquiring task (list index), its place in that task's acquire list, the SM,
    page, buffer, rows, waits, and the element interval it reads when the buffer is tracked (else None)."""

    fid: int
    task: int
    k: int
    sm: int
    page: int
    buffer: str
    rows: tuple
    waits: tuple
    elems: tuple | None


class PageFacts:
    """The page protocol of one schedule, derived from :class:`~mosaic_amk.validate.facts.Facts`."""

    def __init__(self, f: Any):
        self.problems: list[tuple[str, tuple, Diagnostic]] = []  # (code, report key, diagnostic)
        self.fills: list[Fill] = []
        self.fills_of: dict[int, list[int]] = {}  # task index -> its fills (acquire order)
        self.use_fill: dict[int, list[int]] = {}  # task index -> the fills its uses read (resolved)
        self.users: dict[int, list[int]] = {}  # fill -> tasks that read it while held
        self.refill: dict[int, tuple[int, list[int]]] = {}  # fill -> (previous fill of the page, tasks before it)
        self.wait_sites: list[tuple[int, int, int, int, int]] = []  # (fill, wait index, counter, threshold, #prods)
        self.backward: list[tuple[int, int]] = []  # (fill, producer task index at or after its acquiring task)
        self.pools: dict[int, tuple[int, int]] = {}
        self._pools(f)
        self._fills(f)
        self._walk(f)

    def add(self, code: str, key: tuple, where: str, expected: Any, actual: Any, message: str) -> None:
        self.problems.append((code, key, Diagnostic(code, where, expected, actual, message)))

    def found(self, code: str) -> list[tuple[tuple, Diagnostic]]:
        return [(key, d) for c, key, d in self.problems if c == code]

    # pools ----------------------------------------------------------------------------------------------
    def _pools(self, f: Any) -> None:
        s = f.s
        for k, pool in enumerate(s.page_pools):
            where = f"page pool {k} (SM {pool.sm})"
            if not 0 <= pool.sm < s.num_sms:
                self.add("malformed", (0, 4, k), where, f"sm in [0, {s.num_sms})", pool.sm, "page pool of an SM the "
                         "grid does not have")
                continue
            if pool.sm in self.pools:
                self.add("malformed", (0, 4, k), where, "one pool per SM", "duplicate", "second page pool for an SM")
                continue
            if pool.count < 1 or pool.page_bytes < 1:
                self.add("malformed", (0, 4, k), where, "count >= 1 and page_bytes >= 1",
                         [pool.count, pool.page_bytes], "empty page pool")
                continue
            if pool.count * pool.page_bytes > MAX_POOL_BYTES:
                self.add("page-oversubscribed", (8, 0, k), where, f"count * page_bytes <= {MAX_POOL_BYTES}",
                         pool.count * pool.page_bytes, "page pool larger than an SM's shared memory")
            self.pools[pool.sm] = (pool.count, pool.page_bytes)

    # fills ----------------------------------------------------------------------------------------------
    def _fills(self, f: Any) -> None:
        s, bufs, prods, ncnt = f.s, f.bufs, f.prods, f.s.num_counters
        for i, t in enumerate(f.tasks):
            pg = t.pages
            if pg is None:
                continue
            if len(pg.acquire) > MAX_PAGE_OPS or len(pg.use) > MAX_PAGE_OPS or len(pg.release) > MAX_PAGE_OPS:
                self.add("capacity", (3, i, 3, 2), _where(t.id), f"<= {MAX_PAGE_OPS} acquires, uses, releases",
                         f"{len(pg.acquire)} acquires, {len(pg.use)} uses, {len(pg.release)} releases",
                         "page operations exceed the task descriptor")
            mine = self.fills_of[i] = []
            for k, fl in enumerate(pg.acquire):
                fid = len(self.fills)
                mine.append(fid)
                b = bufs.get(fl.buffer)
                lo, hi = fl.rows
                elems = None
                rows_ok = False
                if b is None:
                    self.add("malformed", (3, i, 6, k, 0), _where(t.id), "a declared buffer", fl.buffer,
                             f"fill of page {fl.page}: unknown buffer")
                elif not b.shape or min(b.shape) < 1 or not 0 <= lo < hi <= b.shape[0]:
                    self.add("malformed", (3, i, 6, k, 0), _where(t.id),
                             f"0 <= lo < hi <= {b.shape[0] if b.shape else 0}", [lo, hi],
                             f"fill of page {fl.page}: rows of {fl.buffer} out of bounds")
                else:
                    rows_ok = True
                    if fl.buffer in f.tracked:
                        rl = row_len(b.shape)
                        elems = (lo * rl, hi * rl)
                if len(fl.waits) > MAX_WAITS:
                    self.add("capacity", (3, i, 6, k, 1), _where(t.id), f"<= {MAX_WAITS} waits", len(fl.waits),
                             f"fill of page {fl.page}: waits exceed the descriptor")
                for kw, w in enumerate(fl.waits):
                    c, th = w.counter, w.threshold
                    if not 0 <= c < ncnt:
                        self.add("malformed", (3, i, 6, k, 2, kw), _where(t.id), f"counter in [0, {ncnt})", c,
                                 f"fill of page {fl.page}: wait on an out-of-bounds counter")
                        continue
                    p = prods.get(c)
                    n = len(p) if p else 0
                    self.wait_sites.append((fid, kw, c, th, n))
                    if th >= 1 and n and p[-1] >= i:
                        self.backward.extend((fid, j) for j in p if j >= i)
                # the page in the SM's pool, the rows in a page
                if 0 <= t.sm < s.num_sms:
                    pool = self.pools.get(t.sm)
                    if pool is None:
                        self.add("page-oversubscribed", (8, 1, i, k), _where(t.id), f"a page pool on SM {t.sm}",
                                 "none", f"acquires page {fl.page} on an SM without a page pool")
                    elif not 0 <= fl.page < pool[0]:
                        self.add("page-oversubscribed", (8, 1, i, k), _where(t.id), f"page in [0, {pool[0]})",
                                 fl.page, f"acquires page {fl.page}: more pages than SM {t.sm}'s pool holds")
                    elif rows_ok and (hi - lo) * row_bytes(b.dtype, b.shape) > pool[1]:
                        self.add("page-oversubscribed", (8, 1, i, k), _where(t.id), f"<= {pool[1]} bytes",
                                 (hi - lo) * row_bytes(b.dtype, b.shape),
                                 f"fill of page {fl.page} ({fl.buffer} rows {lo}..{hi - 1}) larger than a page")
                self.fills.append(Fill(fid, i, k, t.sm, fl.page, fl.buffer, (lo, hi), fl.waits, elems))

    # the walk of each SM's queue ------------------------------------------------------------------------
    def _walk(self, f: Any) -> None:
        s, tasks = f.s, f.tasks
        # per (sm, page): [holding fill or None, released?, releasing task]
        state: dict[tuple[int, int], list] = {}
        for i, t in enumerate(tasks):
            pg = t.pages
            if pg is None or not 0 <= t.sm < s.num_sms:
                continue
            sm = t.sm
            for fid in self.fills_of.get(i, ()):
                fl = self.fills[fid]
                st = state.setdefault((sm, fl.page), [None, False, None])
                prev = st[0]
                if prev is not None and not st[1]:
                    a = self.fills[prev].task
                    self.add("page-reuse", (8, 3, i, fl.k), _where(t.id, tasks[a].id),
                             f"page {fl.page} released before it is acquired again", "held",
                             f"acquires page {fl.page} of SM {sm} while the fill acquired by task {tasks[a].id} still "
                             "holds it (no task released it before this one)")
                elif prev is not None:
                    self.refill[fid] = (prev, [*self.users[prev], st[2]])
                st[0], st[1], st[2] = fid, False, None
                self.users[fid] = []
            resolved = self.use_fill[i] = []
            for k, p in enumerate(pg.use):
                st = state.get((sm, p))
                if st is None:
                    self.add("page-unheld", (8, 2, i, 0, k), _where(t.id), f"page {p} acquired on SM {sm} before "
                             "this task", "not acquired", f"uses page {p}, which no task of SM {sm} acquired before it")
                    continue
                resolved.append(st[0])
                if st[1]:
                    self.add("page-unheld", (8, 2, i, 0, k), _where(t.id, tasks[st[2]].id),
                             f"page {p} held until this task", f"released by task {tasks[st[2]].id}",
                             f"uses page {p} of SM {sm} after task {tasks[st[2]].id} released it")
                    continue
                self.users[st[0]].append(i)
                fl = self.fills[st[0]]
                if fl.buffer not in t.inputs:
                    self.add("malformed", (3, i, 7, k), _where(t.id), "a page holding rows of an input",
                             fl.buffer, f"uses page {p}, which holds {fl.buffer}, not one of its inputs")
            for k, p in enumerate(pg.release):
                st = state.get((sm, p))
                if st is None or st[1]:
                    self.add("page-unheld", (8, 2, i, 1, k), _where(t.id), f"page {p} held by SM {sm}",
                             "not held", f"releases page {p}, which SM {sm} does not hold at this task")
                    continue
                st[1], st[2] = True, i

    # events for the clocks ------------------------------------------------------------------------------
    def events(self, f: Any) -> tuple:
        """The extended list: per event its agent (an SM, or ``("loader", sm)``), signal, waits (real counters, and
        per use the virtual counter ``num_counters + fill`` of the fill it reads), accesses ``(reads, writes)``,
        its task (the acquiring task for a fill), and {event: fill}, {task: event}, {fill: event}."""
        tasks, ncnt = f.tasks, f.s.num_counters
        agents, signals, waits, access, ev_task = [], [], [], [], []
        fill_ev: dict[int, int] = {}
        task_ev: list[int] = []
        of_fill: dict[int, int] = {}
        for i, t in enumerate(tasks):
            for fid in self.fills_of.get(i, ()):
                fl = self.fills[fid]
                of_fill[fid] = len(agents)
                fill_ev[len(agents)] = fid
                agents.append(("loader", t.sm))
                signals.append(ncnt + fid)
                waits.append([(w.counter, w.threshold) for w in fl.waits if 0 <= w.counter < ncnt])
                access.append((((fl.buffer, *fl.elems),) if fl.elems else (), ()))
                ev_task.append(i)
            task_ev.append(len(agents))
            agents.append(t.sm)
            signals.append(t.signal if 0 <= t.signal < ncnt else -1)
            waits.append([(w.counter, w.threshold) if 0 <= w.counter < ncnt else (-1, w.threshold) for w in t.waits]
                         + [(ncnt + fid, 1) for fid in self.use_fill.get(i, ())])
            access.append(f.access[i])
            ev_task.append(i)
        return agents, signals, waits, access, ev_task, fill_ev, task_ev, of_fill


__all__ = ["PAGE_CODES", "Fill", "PageFacts"]
