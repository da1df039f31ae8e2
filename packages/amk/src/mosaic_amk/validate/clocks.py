"""Happens-before as vector clocks: linear memory in the schedule, exact.

``pred[i]``, the set of tasks guaranteed to finish before task ``i`` starts (docs/amk-schedule.md), is
built from three operations: the SM predecessor and its ``pred``, the *union* of ``pred[j] | {j}`` over
the producers of an all-join wait, and the *intersection* of them for a first-of-N wait. Every such set
is closed downwards along each SM queue (an SM runs its queue in order, so a task's ``pred`` holds
every earlier task of its own SM), and unions and intersections of queue-prefix sets are queue-prefix
sets. So ``pred[i] | {i}`` is exactly one number per SM: the latest task (list index) of that SM it
holds, ``-1`` for none; the union is the elementwise maximum and the intersection the elementwise
minimum. ``j`` happens before ``i`` iff ``clock_i[slot(sm(j))] >= j``.

Clocks are produced in list order and only the live ones are kept (the last clock of each SM, and the
running join of each counter until its last waiter), so memory is bounded by (SMs used) x (counters
with a pending waiter), never by the square of the task count as a bitset per task would be.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

# more distinct SMs than this (only a malformed schedule: num_sms is bounded) and no clocks are built
MAX_SLOTS = 4096


def slots_of(sms: Sequence[int]) -> dict[int, int] | None:
    """SM id -> dense slot (in order of first use), or None when there are more than MAX_SLOTS."""
    slot: dict[int, int] = {}
    for s in sms:
        if s not in slot:
            slot[s] = len(slot)
            if len(slot) > MAX_SLOTS:
                return None
    return slot


def inclusive_clocks(sms: Sequence[int], signals: Sequence[int], waits: Sequence[Sequence[tuple[int, int]]],
                     num_counters: int, slot: dict[int, int]) -> Iterator[np.ndarray]:
    """For each task in list order, its clock of ``pred[i] | {i}`` (an int64 array over the SM slots).

    ``waits[i]`` holds task i's (counter, threshold) pairs. Only waits that order something count (as in
    the bitset definition): 1 <= threshold <= #producers on an in-range counter; threshold == #producers
    is an all-join (maximum), anything lower a first-of-N (minimum). Call it only when every producer of
    a waited counter is earlier in the list than the waiter (no backward edge, no self-wait). A yielded
    array must not be modified by the caller."""
    n, size = len(sms), len(slot)
    nprod: dict[int, int] = {}
    for sig in signals:
        if 0 <= sig < num_counters:
            nprod[sig] = nprod.get(sig, 0) + 1
    uses: list[tuple] = [()] * n
    last_use: dict[tuple[int, bool], int] = {}  # (counter, all-join?) -> index of its last waiter
    for i, ws in enumerate(waits):
        got = []
        for c, th in ws:
            p = nprod.get(c, 0) if 0 <= c < num_counters else 0
            if th < 1 or p == 0 or th > p:
                continue
            key = (c, th == p)
            got.append(key)
            last_use[key] = i
        if got:
            uses[i] = tuple(got)
    acc: dict[tuple[int, bool], np.ndarray] = {}
    last_on: dict[int, np.ndarray] = {}
    empty = np.full(size, -1, np.int64)
    maximum, minimum = np.maximum, np.minimum
    for i in range(n):
        s = slot[sms[i]]
        prev = last_on.get(s)
        clk = (empty if prev is None else prev).copy()
        for key in uses[i]:
            v = acc.get(key)
            if v is not None:
                maximum(clk, v, out=clk)
        for key in uses[i]:
            if last_use.get(key) == i:
                acc.pop(key, None)
                del last_use[key]
        clk[s] = i
        last_on[s] = clk
        sig = signals[i]
        for every in (True, False):
            key = (sig, every)
            if key in last_use:
                a = acc.get(key)
                if a is None:
                    acc[key] = clk.copy()
                elif every:
                    maximum(a, clk, out=a)
                else:
                    minimum(a, clk, out=a)
        yield clk


__all__ = ["MAX_SLOTS", "inclusive_clocks", "slots_of"]
