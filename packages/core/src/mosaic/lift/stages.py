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
  (``mul.hi x, 0xAAAAAAAB; shr 1; mul.lo q, 3; sub``: index mod 3), or compared with N-1 (``GT``) / N
  (``GE``) by a predicate that resets it to 0 (Triton: ``setp.gt.s32 p, r, 2; selp.b32 r, 0, r, p``) -> N.
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

from mosaic.lift.normalize import WorkLoop, stepped_counters

MAX_STAGES = 32
_CMP = {"ISETP", "UISETP", "setp"}
_AND = {"LOP3", "ULOP3", "and"}


def _imm(op: str) -> int | None:
    if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", op):
        return int(op, 0)
    return None


#: an ordered compare of the next index with a constant c whose predicate resets the index to 0 (``i + 1 > 2 ?
#: 0 : i + 1``: Triton's ``setp.gt.s32 p, r, 2; selp.b32 r, 0, r, p``, ``UISETP.GT.AND UP0, UPT, UR7, 0x2;
#: USEL UR7, UR7, URZ, !UP0``): N = c + this
_ORDERED_WRAP = {"GT": 1, "GE": 0, "LT": 0, "LE": 1}
_SELECT = {"SEL", "USEL", "selp"}
_ZERO = {"RZ", "URZ", "0"}


def _resets_to_zero(body, pred: str) -> bool:
    """A select in the loop body that picks 0 under ``pred`` (or its negation)."""
    for i in body:
        if i.opcode in _SELECT and len(i.operands) >= 4 and i.operands[-1].lstrip("!") == pred and \
                _ZERO & {o.removesuffix(".reuse") for o in i.operands[1:3]}:
            return True
    return False


def stage_index_wrap(loop: WorkLoop, kernel) -> int | None:
    """S1. A compare whose predicate only guards a branch of the loop (``ISETP.NE P1, R155, 0x20; @P1 BRA``: the
    trip count of a 32-iteration key loop) is the loop's exit test, not a wrap: it counts only when no other
    compare gives a value."""
    counters = stepped_counters(loop.body)
    exits: Counter = Counter()
    found: Counter = Counter()
    for k, i in enumerate(loop.body):
        if i.opcode in _CMP and i.operands and _only_branches_read(loop.body, k, i.operands[0]):
            tally = exits  # the loop's exit test
        else:
            tally = found
        ops = [o.removesuffix(".reuse") for o in i.operands]
        ordered = [_ORDERED_WRAP[m.upper()] for m in i.mods if m.upper() in _ORDERED_WRAP]
        if i.opcode in _CMP and ({"NE", "EQ", "ne", "eq"} & set(i.mods)):
            regs = [o for o in ops if counters.get(o) == 1]
            consts = [_imm(o) for o in ops[1:] if _imm(o) is not None]
            if regs and consts and 2 <= consts[0] <= MAX_STAGES:
                tally[consts[0]] += 1
        elif i.opcode in _CMP and ordered and ops:
            regs = [o for o in ops[1:] if counters.get(o) == 1]
            consts = [_imm(o) for o in ops[1:] if _imm(o) is not None]
            if regs and consts and 2 <= consts[0] + ordered[0] <= MAX_STAGES and _resets_to_zero(loop.body, ops[0]):
                tally[consts[0] + ordered[0]] += 1
        elif i.opcode in _AND and len(ops) >= 3 and (i.opcode == "and" or "0xc0" in ops):
            srcs = ops[1:]
            regs = [o for o in srcs if o in counters]
            masks = [_imm(o) for o in srcs[:2] if _imm(o) is not None]
            if not (regs and masks):
                continue
            # index mod N with the index stepped by s: the mask is N-1 without the low bits that are always 0
            low = counters[regs[0]] - 1
            m = masks[0]
            if m & low == 0 and m > low and ((m | low) + 1) & (m | low) == 0 and m | low >= 3 and \
                    (m | low) < MAX_STAGES:
                found[(m | low) + 1] += 1
    found.update(_magic_modulo(loop.body, set(counters)))
    found = found or exits
    return found.most_common(1)[0][0] if found else None


def _reads(i, pred: str) -> bool:
    return i.pred.lstrip("!") == pred or any(o.removesuffix(".reuse").lstrip("!") == pred for o in i.operands[1:])


def _only_branches_read(body, k: int, pred: str) -> bool:
    """The predicate ``body[k]`` defines is read, until it is defined again, by branches alone (and at least one)."""
    branches = 0
    for i in body[k + 1:]:
        if _reads(i, pred):
            if i.opclass != "branch":
                return False
            branches += 1
        if i.operands and i.operands[0] == pred and i.opclass != "branch":
            break
    return branches > 0


def _is_magic(m: int, n: int) -> bool:
    """``m`` is the multiplier of an unsigned division by ``n`` (``ceil(2**(w+s) / n)``, w = 32 or 64)."""
    return any(m % 2**w == -(-(2 ** (w + s)) // n) for w in (8, 16, 32, 64) for s in range(6))


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
        if i.opcode in ("cvt", "mov", "MOV", "UMOV", "R2UR", "and", "or") and srcs and srcs[0] in derived:
            derived.add(d)  # copies, and the byte mask / low-bit set of jax's 16-bit ``(step | 1) % 3``
        elif i.opcode in ("mul", "IMAD", "UIMAD") and imms and any(o in derived for o in srcs) and \
                ({"hi", "HI"} & set(i.mods) or (i.opcode == "mul" and imms[0] > MAX_STAGES)):
            magic[d] = imms[0]  # mul.hi by the magic, or (8-bit range in 16 bits) mul.lo then shr by 9
        elif i.opcode in ("shr", "SHF", "USHF") and any(o in magic for o in srcs):
            magic[d] = next(magic[o] for o in srcs if o in magic)
        elif i.opcode in ("mul", "IMAD", "UIMAD") and imms and any(o in magic for o in srcs):
            n = abs(imms[0])
            if 2 <= n <= MAX_STAGES and _is_magic(next(magic[o] for o in srcs if o in magic), n):
                found[n] += 1
    return found


_ADDR_RE = re.compile(r"\[([^\]+]+?)(?:\+(0x[0-9a-fA-F]+|\d+))?\]")


def _ring(insns) -> int | None:
    """N >= 2 mbarriers at constant offsets 8 bytes apart from one base (``[UR17+0x20]`` ... ``[UR17+0x38]``;
    PTX's ``[%r1]``, ``[%r1+8]`` ...) -> N."""
    by_base: dict[str, set] = {}
    for i in insns:
        for o in i.operands:
            m = _ADDR_RE.fullmatch(o)
            if m:
                by_base.setdefault(m.group(1), set()).add(int(m.group(2), 0) if m.group(2) else 0)
    for offsets in sorted(by_base.values(), key=len, reverse=True):
        ordered = sorted(offsets)
        if len(ordered) >= 2 and all(b - a == 8 for a, b in zip(ordered, ordered[1:], strict=False)):
            return len(ordered)
    return None


def barrier_ring(loop: WorkLoop, kernel) -> int | None:
    """The hot loop unrolled over the whole ring: the mbarriers it waits on, else (PTX, whose waits go through
    registers) the full barriers it arms with expect-tx."""
    waits = _ring([i for i in loop.body if i.opclass == "mbar.wait"])
    return waits or _ring([i for i in loop.body if i.opclass == "mbar.arrive.tx"])


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
