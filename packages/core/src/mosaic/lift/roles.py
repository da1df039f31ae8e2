"""Warp roles: branches on the warp or warpgroup index that give different warps different work.

A value is *warp-derived* when it comes from the thread index shifted right by 5 or more bits (or divided
by a multiple of 32), or is broadcast from such a value by a shuffle; *thread-derived* when it comes from
the thread index through arithmetic with constants only. A conditional branch (or exit) is a role branch
when its predicate compares a warp-derived value with a constant, or a thread-derived value with a
multiple of 32 (``tid < 128``). Each side of a role branch whose blocks it dominates is a role region if
it holds a loop or at least ``MIN_ROLE_INSNS`` instructions. Regions are named from what they do:
``setmaxnreg`` decrease or async-copy issue without MMA -> ``producer``; ``setmaxnreg`` increase or MMA /
the hottest math -> ``consumer``; otherwise ``role<n>``. No role branch -> one role, ``all``.
"""

from __future__ import annotations

import functools
import re

import attrs

from mosaic.lift.cfg import CFG

MIN_ROLE_INSNS = 16
_SHIFT_OPS = {"SHF", "SHR", "USHF", "USHR", "shr"}
_CMP_OPS = {"ISETP", "UISETP", "setp"}
_PRED = re.compile(r"U?P(\d+|T)")
_PRED_OPS = {"PLOP3", "UPLOP3", "mov", "and", "or"}
_SINKS = {"PT", "UPT", "RZ", "URZ"}
_PRODUCE = {"tma.load", "bulk.copy", "cp.async", "mbar.arrive.tx"}
_CMP_KINDS = {"EQ", "NE", "LT", "LE", "GT", "GE"}


@attrs.define
class Role:
    name: str
    blocks: frozenset
    branch_index: int  # instruction index of the role branch
    setmaxnreg: int | None = None
    # threads on this side of the branch: ("n", k) exactly k, ("rest", k) all but k; None when unknown
    threads: tuple | None = None

    def warpgroups(self, block_threads: int | None) -> int | None:
        if self.threads is None or not block_threads:
            return None
        kind, k = self.threads
        n = k if kind == "n" else block_threads - k
        return n // 128 if n > 0 and n % 128 == 0 else None


@functools.lru_cache(maxsize=65536)
def _imm(op: str) -> int | None:
    op = op.strip()
    if op in ("RZ", "URZ"):
        return 0
    m = re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", op)
    if not m:
        return None
    return int(op, 0) if not op.startswith("-") else -int(op[1:], 0)


def _is_tid_source(insn) -> bool:
    if insn.opcode in ("S2R", "S2UR", "CS2R"):
        return any("SR_TID" in o or "SR_LANEID" in o for o in insn.operands[1:])
    if insn.opcode == "mov":
        return any(o.startswith("%tid") for o in insn.operands[1:])
    return False


@functools.lru_cache(maxsize=65536)
def _key(op: str) -> str:
    return op.lstrip("-!|").removesuffix(".reuse")


def split_dests(insn) -> tuple[list[str], tuple]:
    """(destinations, sources). SASS writes a second destination when the first is a predicate
    (``SHFL.IDX PT, R14, ...``, ``LOP3.LUT P0, RZ, ...``) or the second is one (``ISETP P0, PT, ...``,
    ``IADD3 R1, P2, ...``); PTX has one (``setp`` pairs are ``%p1|%p2``)."""
    ops = insn.operands
    first = ops[0].split("|")
    if len(first) > 1 or insn.opcode.islower():
        return first, ops[1:]
    if len(ops) > 2 and (_PRED.fullmatch(ops[0]) or _PRED.fullmatch(ops[1])):
        return [ops[0], ops[1]], ops[2:]
    return [ops[0]], ops[1:]


def role_branches(cfg: CFG, max_threads: int | None = None) -> dict[int, tuple | None]:
    """Conditional branches/exits whose guard is a role predicate when they execute: index -> the compare
    (``(op, constant, threads per unit of the compared value)``, e.g. ``("NE", 2, 128)`` for ``warpgroup != 2``)
    when the guard is that compare's own predicate, else ``None``."""
    taint: dict[str, str] = {}  # register -> "tid" | "warp"
    unit: dict[str, int] = {}  # register -> threads per unit of its value (tid: 1, tid >> 7: 128); 0 unknown
    preds: dict[str, int] = {}
    cmp_info: dict[str, tuple | None] = {}
    found: dict[int, tuple | None] = {}
    for insn in cfg.program.instructions:
        if insn.opclass in ("branch", "exit") and insn.pred.lstrip("!") in preds:
            found[insn.index] = cmp_info.get(insn.pred.lstrip("!"))
        ops = insn.operands
        if not ops:
            continue
        if not (taint or preds) and not _is_tid_source(insn):
            continue
        if not any(_key(o) in taint or _key(o).replace("%", "") in preds for o in ops) and \
                not _is_tid_source(insn):
            continue  # touches nothing tracked (the common case: a fast path)
        dests, srcs = split_dests(insn)
        srcs = tuple(x.removesuffix(".reuse") for x in srcs)
        dst = next((d for d in dests if d not in _SINKS), dests[0])
        carried = [preds[x.lstrip("!")] for x in srcs if x.lstrip("!") in preds] \
            if insn.opcode in _PRED_OPS else []
        for d in dests:
            preds.pop(d.replace("%", ""), None)
        if carried:  # PLOP3.LUT P0, PT, PT, PT, UP0 (a role predicate moved between files)
            preds[dst.replace("%", "")] = carried[0]
            cmp_info[dst.replace("%", "")] = None
            continue
        if _is_tid_source(insn):
            taint[dst] = "tid"
            unit[dst] = 1 if any("SR_TID.X" in o or o == "%tid.x" for o in insn.operands[1:]) else 0
            continue
        if not taint:
            continue
        for d in dests:
            if d != dst:
                taint.pop(d, None)
        kinds = [taint.get(s.lstrip("-!|")) for s in srcs]
        tainted = [k for k in kinds if k]
        if not tainted:
            taint.pop(dst, None)
            continue
        if insn.opcode in _CMP_OPS:
            # SASS: ISETP.<cmp> Pd, Pq, a, b, Pc ; PTX: setp.<cmp> %p, a, b
            regs = [s for s in srcs if taint.get(s)]
            consts = [_imm(s) for s in srcs if _imm(s) is not None and not s.startswith("P") and s != "PT"]
            if regs and consts:
                kind = taint[regs[0]]
                c = consts[0]
                # a thread-derived value against a constant past the block is a loop bound, not a split
                splits = max_threads is None or kind != "tid" or c < max_threads - 1
                if splits and (kind == "warp" or (kind == "tid" and c >= 31 and ((c + 1) % 32 == 0 or c % 32 == 0))):
                    preds[dst.replace("%", "")] = insn.index
                    op = next((m.upper() for m in insn.mods if m.upper() in _CMP_KINDS), None)
                    combined = insn.opcode != "setp" and srcs[-1] not in ("PT", "UPT")
                    cmp_info[dst.replace("%", "")] = None if combined or op is None or len(regs) != 1 or \
                        srcs.index(regs[0]) > srcs.index(next(s for s in srcs if _imm(s) == c)) else \
                        (op, c, unit.get(regs[0], 0))
            continue
        others = [s for s, k in zip(srcs, kinds, strict=False) if not k and _imm(s) is None
                  and s not in ("PT", "UPT", "RZ", "URZ") and not s.startswith("0x")]
        if not tainted or others and insn.opcode not in ("SHFL", "shfl"):
            taint.pop(dst, None)
            continue
        kind = "warp" if "warp" in tainted else "tid"
        src_unit = next((unit.get(s.lstrip("-!|"), 0) for s, k in zip(srcs, kinds, strict=False) if k), 0)
        new_unit = 0
        if insn.opcode in _SHIFT_OPS or insn.opcode == "div":
            amounts = [_imm(s) for s in srcs if _imm(s) is not None]
            if amounts and max(amounts) >= 5 and (insn.opcode != "div" or max(amounts) % 32 == 0):
                kind = "warp"
            right = insn.opcode in ("SHR", "USHR", "shr", "div") or "R" in insn.mods
            if amounts and right and insn.opcode != "div":
                new_unit = src_unit << max(amounts)
            elif amounts and insn.opcode == "div":
                new_unit = src_unit * max(amounts)
        if insn.opcode in ("SHFL", "shfl", "R2UR", "MOV", "UMOV", "mov"):
            new_unit = src_unit
        if insn.opcode in ("SHFL", "shfl"):
            kind = "warp" if tainted and "IDX" in insn.mods or "idx" in insn.mods else kind
        taint[dst] = kind
        unit[dst] = new_unit
    return found


def find_roles(cfg: CFG, loop_headers: set[int], max_threads: int | None = None) -> tuple[list[Role], int]:
    """Role regions and the number of role branches. ``max_threads`` (the launch bound or block, when known)
    drops thread-index compares that cannot split the block (``tid > 511`` guarding a block-stride loop in a
    block of 128)."""
    role_br = role_branches(cfg, max_threads)
    insns = cfg.program.instructions
    regions: list[Role] = []
    branches = 0
    for blk in cfg.blocks:
        if blk.id not in cfg.reachable:
            continue
        last = insns[blk.end - 1]
        if last.index not in role_br:
            continue
        guarded_exit = last.opclass == "exit" and len(blk.succs) == 1
        if len(blk.succs) < 2 and not guarded_exit:
            continue
        sides = []
        for s in blk.succs:
            dom = frozenset(b for b in cfg.reachable if cfg.dominates(s, b) and s != blk.id)
            sides.append((s, dom))
        branches += 1
        for s, dom in sides:
            other = [o for o, _ in sides if o != s]
            # a side that the other side flows into is the join, not a role
            if any(o in dom for o in other) or any(_reaches(cfg, o, s, blk.id) for o in other):
                continue
            has_loop = bool(dom & loop_headers)
            # a side that flows back into the other (``if (warp == 0) { init barriers }``) or the warps left
            # after a role-guarded exit are a role only when they loop over work
            if (guarded_exit or any(_reaches(cfg, s, o, blk.id) for o in other)) and not has_loop:
                continue
            size = sum(cfg.blocks[b].end - cfg.blocks[b].start for b in dom)
            if has_loop or size >= MIN_ROLE_INSNS:
                regions.append(Role("", dom, last.index, threads=_side_threads(cfg, blk, s, role_br[last.index])))
    branches = len({r.branch_index for r in regions})
    # keep outermost regions only
    regions = [r for r in regions if not any(r is not q and r.blocks < q.blocks for q in regions)]
    _name(cfg, regions)
    return regions, branches


def _side_threads(cfg: CFG, blk, side: int, info: tuple | None) -> tuple | None:
    """Threads that take ``side`` of the role branch ending ``blk``, from its compare (``warpgroup != 2``: the
    fall-through side holds one warpgroup, 128 threads; the taken side the rest)."""
    if info is None:
        return None
    op, c, per = info
    if not per or c < 0:
        return None
    last = cfg.program.instructions[blk.end - 1]
    if last.opclass == "branch":
        taken = side != blk.id + 1
    else:  # a guarded exit: the side left is where the guard is false
        taken = False
    true_side = taken != last.pred.startswith("!")
    if op in ("EQ", "NE"):
        k, holds = per, op == "EQ"
    elif op in ("LT", "GE"):
        k, holds = c * per, op == "LT"
    else:  # LE, GT
        k, holds = (c + 1) * per, op == "LE"
    return ("n", k) if holds == true_side else ("rest", k)


def _reaches(cfg: CFG, a: int, b: int, avoid: int) -> bool:
    """``a`` flows to ``b`` without passing ``avoid`` (the role branch: going round a persistent loop that
    holds the branch, as jax's Pallas matmul does, re-enters it and is no join)."""
    seen, stack = {avoid}, [a]
    while stack:
        x = stack.pop()
        if x == b:
            return True
        if x in seen:
            continue
        seen.add(x)
        stack.extend(cfg.blocks[x].succs)
    return False


#: how an epilogue role's results leave (with tensor-memory reads and no tile loads: an sm_100 epilogue warp)
_EPILOGUE_STORES = frozenset({"st.global", "st.shared", "tma.store", "stsm", "bulk.store"})


def _name(cfg: CFG, regions: list[Role]) -> None:
    used: set[str] = set()
    for n, r in enumerate(regions):
        insns = cfg.instructions(r.blocks)
        classes = {i.opclass for i in insns}
        maxnreg = [i for i in insns if i.opclass == "setmaxnreg"]
        name = ""
        if maxnreg:
            m = maxnreg[0]
            dec = "DEALLOC" in m.mods or "dec" in m.mods
            name = "producer" if dec else "consumer"
            val = next((_imm(o) for o in reversed(m.operands) if _imm(o) is not None), None)
            r.setmaxnreg = val
        elif "mma" in classes:
            name = "consumer"
        elif "tmem" in classes and classes & _EPILOGUE_STORES and not classes & {"tma.load", "cp.async"}:
            name = "epilogue"  # sm_100: reads the accumulator out of tensor memory (tcgen05.ld) and stores it
        elif classes & _PRODUCE or ("ld.global" in classes and "st.shared" in classes and "mbar.arrive" in classes):
            name = "producer"
        if not name or name in used:
            name = f"role{n}"
        used.add(name)
        r.name = name
