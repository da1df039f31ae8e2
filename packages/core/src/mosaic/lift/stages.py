"""Pipeline stages: how many shared-memory buffers a kernel's main loop cycles through.

A Hopper GEMM's pipeline is not a straight-line prologue of async-copy groups: a producer (warpgroup or
elected thread) waits on an *empty* mbarrier, issues TMA loads that arrive on the matching *full* mbarrier,
and a consumer waits on *full* and arrives on *empty*, with the stage index cycling modulo the number of
stages. What the machine code holds, and the rules read from it, in order (the first that gives a value
wins; its code is reported with the value):

- ``S1`` stage index wrap: in the hot loop, a counter stepped by one (``VIADD R, R, 0x1``, ``UIADD3``,
  ``add``) is compared for (in)equality with a constant N (``ISETP.NE.AND P, PT, R, 0x6``: CUTLASS's
  ``PipelineState`` wraps its index at N) or masked with N-1 (``LOP3.LUT R, c, 0x3, RZ, 0xc0``: index mod
  a power of two, as Pallas lowers ``step % max_concurrent_steps``) or divided by N with a magic multiply
  (``mul.hi x, 0xAAAAAAAB; shr 1; mul.lo q, 3; sub``: index mod 3) -> N.
- ``S2`` unrolled barrier ring: the hot loop waits on mbarriers at N >= 2 distinct constant offsets 8 bytes
  apart (``TRYWAIT [UR17+0x20]`` ... ``[UR17+0x38]``: the loop unrolled over the whole ring) -> N.
- ``S3`` prologue groups: async-copy groups (``cp.async`` commits, mbarrier expect-tx arrivals) issued in
  the straight-line prologue of the loop that issues them, plus the one issued per iteration.
- ``S4`` mbarrier pairs: the kernel initialises 2N mbarriers (``SYNCS.EXCH.64`` / ``mbarrier.init``) with
  one arrival-count operand, or N and N with two, and no rule above applies -> N (one full and one empty
  barrier per stage). More count operands (CUTLASS: epilogue and order barriers too) -> unknown.
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
    found.update(_magic_modulo(loop.body, counters))
    return found.most_common(1)[0][0] if found else None


def _is_magic(m: int, n: int) -> bool:
    """``m`` is the multiplier of an unsigned division by ``n`` (``ceil(2**(w+s) / n)``, w = 32 or 64)."""
    return any(m % 2**w == -(-(2 ** (w + s)) // n) for w in (32, 64) for s in range(6))


def _magic_modulo(body, counters: set[str]) -> Counter:
    """``x % N`` for a non-power-of-two N: ``q = mul.hi(x, magic) >> s; r = x - q * N`` with x a counter."""
    derived = set(counters)
    magic: dict[str, int] = {}
    found: Counter = Counter()
    for i in body:
        if not i.operands:
            continue
        d, srcs = i.operands[0], [o.removesuffix(".reuse") for o in i.operands[1:]]
        imms = [int(o, 0) for o in srcs if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", o)]
        if i.opcode in ("cvt", "mov", "MOV", "UMOV", "R2UR") and srcs and srcs[0] in derived:
            derived.add(d)
        elif {"hi", "HI"} & set(i.mods) and i.opcode in ("mul", "IMAD", "UIMAD") and imms and \
                any(o in derived for o in srcs):
            magic[d] = imms[0]
        elif i.opcode in ("shr", "SHF", "USHF") and any(o in magic for o in srcs):
            magic[d] = next(magic[o] for o in srcs if o in magic)
        elif i.opcode in ("mul", "IMAD", "UIMAD") and imms and any(o in magic for o in srcs):
            n = abs(imms[0])
            if 2 <= n <= MAX_STAGES and _is_magic(next(magic[o] for o in srcs if o in magic), n):
                found[n] += 1
    return found


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
    """2N inits sharing one arrival-count operand, or N + N over two: one ring of full/empty pairs. More
    count operands mean more pipelines (epilogue, cluster order barriers) that cannot be told apart here."""
    groups = Counter(i.operands[-1] for i in kernel if i.opclass == "mbar.init" and i.operands)
    total = sum(groups.values())
    if len(groups) == 1 and total >= 4 and total % 2 == 0:
        n = total // 2
    elif len(groups) == 2 and len(set(groups.values())) == 1 and total >= 4:
        n = total // 2
    else:
        return None
    return n if n <= MAX_STAGES else None


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
