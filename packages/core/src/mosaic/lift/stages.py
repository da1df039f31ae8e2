"""Pipeline stages: how many shared-memory buffers a kernel's main loop cycles through.

A Hopper GEMM's pipeline is not a straight-line prologue of async-copy groups: a producer (warpgroup or
elected thread) waits on an *empty* mbarrier, issues TMA loads that arrive on the matching *full* mbarrier,
and a consumer waits on *full* and arrives on *empty*, with the stage index cycling modulo the number of
stages. What the machine code holds, and the rules read from it, in order (the first that gives a value
wins; its code is reported with the value):

- ``S1`` stage index wrap: in the hot loop, a counter stepped by one (``VIADD R, R, 0x1``, ``UIADD3``,
  ``add``) is compared for (in)equality with a constant N (``ISETP.NE.AND P, PT, R, 0x6``: CUTLASS's
  ``PipelineState`` wraps its index at N) or masked with N-1 (``LOP3.LUT R, c, 0x3, RZ, 0xc0``: index mod
  a power of two, as Pallas lowers ``step % max_concurrent_steps``) -> N.
- ``S2`` unrolled barrier ring: the hot loop waits on mbarriers at N >= 2 distinct constant offsets 8 bytes
  apart (``TRYWAIT [UR17+0x20]`` ... ``[UR17+0x38]``: the loop unrolled over the whole ring) -> N.
- ``S3`` prologue groups: async-copy groups (``cp.async`` commits, mbarrier expect-tx arrivals) issued in
  the straight-line prologue of the loop that issues them, plus the one issued per iteration.
- ``S4`` mbarrier pairs: the kernel initialises 2N mbarriers (``SYNCS.EXCH.64`` / ``mbarrier.init``) and
  no rule above applies -> N (one full and one empty barrier per stage). Weakest: a kernel with other
  barriers (epilogue pipelines, cluster order barriers) over-counts, so it is used only as the last resort.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

import attrs

from mosaic.lift.normalize import WorkLoop

MAX_STAGES = 32
_ADD = {"VIADD", "IADD3", "UIADD3", "IADD", "add"}
_CMP = {"ISETP", "UISETP", "setp"}
_AND = {"LOP3", "ULOP3", "and"}
_ZERO = {"RZ", "URZ", "PT", "UPT"}


def _imm(op: str) -> int | None:
    if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", op):
        return int(op, 0)
    return None


def _counters(body) -> set[str]:
    """Registers stepped by one in the loop: ``R = R + 1`` or read by an ``x + 1`` (the next index)."""
    out: set[str] = set()
    for i in body:
        if i.opcode in _ADD and len(i.operands) >= 3:
            srcs = [o for o in i.operands[1:] if o not in _ZERO]
            if any(_imm(o) == 1 for o in srcs):
                regs = [o.removesuffix(".reuse") for o in srcs if _imm(o) is None]
                out.update(regs)
                out.add(i.operands[0])
    return out


def stage_index_wrap(loop: WorkLoop, kernel) -> int | None:
    counters = _counters(loop.body)
    found: Counter = Counter()
    for i in loop.body:
        ops = [o.removesuffix(".reuse") for o in i.operands]
        if i.opcode in _CMP and ({"NE", "EQ", "ne", "eq"} & set(i.mods)):
            regs = [o for o in ops if o in counters]
            consts = [_imm(o) for o in ops[1:] if _imm(o) is not None]
            if regs and consts and 2 <= consts[0] <= MAX_STAGES:
                found[consts[0]] += 1
        elif i.opcode in _AND and len(ops) >= 3 and (i.opcode == "and" or "0xc0" in ops):
            srcs = ops[1:]
            regs = [o for o in srcs if o in counters]
            masks = [_imm(o) for o in srcs[:2] if _imm(o) is not None]
            if regs and masks and masks[0] >= 3 and (masks[0] + 1) & masks[0] == 0 and masks[0] < MAX_STAGES:
                found[masks[0] + 1] += 1
    return found.most_common(1)[0][0] if found else None


def barrier_ring(loop: WorkLoop, kernel) -> int | None:
    offsets = set()
    for i in loop.body:
        if i.opclass != "mbar.wait":
            continue
        for o in i.operands:
            m = re.fullmatch(r"\[[^\]]*?\+(0x[0-9a-fA-F]+)\]", o)
            if m:
                offsets.add(int(m.group(1), 16))
    if len(offsets) < 2:
        return None
    ordered = sorted(offsets)
    if all(b - a == 8 for a, b in zip(ordered, ordered[1:], strict=False)):
        return len(ordered)
    return None


def prologue_groups(loop: WorkLoop, kernel) -> int | None:
    if not any(i.opclass in ("cp.async.commit", "mbar.arrive.tx") for i in loop.body):
        return None
    return sum(1 for i in loop.prologue if i.opclass in ("cp.async.commit", "mbar.arrive.tx")) + 1


def mbarrier_pairs(loop: WorkLoop, kernel) -> int | None:
    inits = sum(1 for i in kernel if i.opclass == "mbar.init")
    if inits >= 4 and inits % 2 == 0 and inits // 2 <= MAX_STAGES:
        return inits // 2
    return None


@attrs.frozen
class StageRule:
    code: str
    name: str
    find: Callable


RULES = (
    StageRule("S1", "stage index wraps", stage_index_wrap),
    StageRule("S2", "unrolled barrier ring", barrier_ring),
    StageRule("S3", "prologue groups", prologue_groups),
    StageRule("S4", "mbarrier full/empty pairs", mbarrier_pairs),
)


def pipeline_stages(hot: WorkLoop | None, issuing: WorkLoop | None, kernel) -> tuple[int | None, str | None]:
    """(stages, rule code and name) for a role whose hot loop is ``hot``; ``issuing`` is the loop that issues
    async-copy groups (S3). ``kernel`` is every reachable instruction (S4)."""
    for rule in RULES:
        loop = issuing if rule.code == "S3" else hot
        if loop is None or hot is None:
            continue
        value = rule.find(loop, kernel)
        if value is not None:
            return value, f"{rule.code} {rule.name}"
    return None, None
