"""Normalisation: what is left of a kernel once register names, addresses and constants are abstracted.

Register numbers are renamed to their file (``R``, ``UR``, ``P``, ``UP``, ``B``; PTX ``%r`` ...), immediates
become ``imm``, constant-bank and parameter references ``const``, memory operands ``[addr]``. Loops are
split into work loops and spin loops (an mbarrier try-wait or a setmaxnreg retried in place is a wait, and
ptxas's elect-one TMA issue loop an issue, not a loop of work; see ``is_spin_loop``),
and each work loop's kernel is cut into prologue (straight-line code that dominates its header), the
steady-state body (the loop's own blocks, without nested work loops) and epilogue (straight-line code after
it).
"""

from __future__ import annotations

import math
import re

import attrs

from mosaic.lift.cfg import CFG, Loop
from mosaic.lift.opclass import REPLICATED

_REG_RE = re.compile(r"^-?!?\|?(U?R|U?P|B|SR_)[\dZT]*")
_SPIN_OK = {"mbar.wait", "branch", "sync", "nop", "int", "uniform", "move", "shuffle"}
_WORK = {"mma", "ld.global", "st.global", "ld.shared", "st.shared", "tma.load", "tma.store", "cp.async",
         "fp32.fma", "fp32.add", "fp32.mul", "fp16", "fp64", "mufu", "ldsm", "stsm"}
_ISSUED = {"tma.load", "tma.store", "bulk.copy", "mbar.arrive.tx", "mbar.arrive", "other.prefetch", "fence"}


def operand_shape(op: str) -> str:
    op = op.strip()
    if op.startswith("["):
        return "[addr]"
    if op.startswith("c[") or op.startswith("desc[") or op.startswith("gdesc["):
        return "const" if op.startswith("c[") else "desc"
    if op.startswith("%"):
        return "%" + re.sub(r"\d+", "", op[1:]).split(".")[0]
    m = _REG_RE.match(op)
    if m:
        return m.group(1)
    if op.startswith("`") or op.startswith("$") or op.startswith(".L"):
        return "label"
    return "imm"


def normal_form(insn) -> str:
    """Opcode with modifiers and abstract operands: the same for two compiles that differ only in names."""
    return f"{insn.full} " + ",".join(operand_shape(o) for o in insn.operands)


def is_spin_loop(cfg: CFG, loop: Loop) -> bool:
    """A loop that repeats one step in place rather than iterating over work (at most 12 instructions):
    an mbarrier try-wait retried until the phase flips; ``USETMAXREG.TRY_ALLOC`` retried until the register
    pool grants; or ptxas's elect-one issue loop (``ELECT`` ... ``UTMALDG`` ... ``BRA.U.ANY``), which issues
    a TMA/bulk copy once per distinct uniform operand and runs once when the operands are warp-uniform."""
    insns = cfg.instructions(loop.blocks)
    if len(insns) > 12:
        return False
    classes = {i.opclass for i in insns}
    if "mbar.wait" in classes and classes <= _SPIN_OK:
        return True
    if any(i.opcode in ("NANOSLEEP", "nanosleep") for i in insns) and not classes & _WORK:
        return True  # a back-off retry (sm_100's tcgen05.alloc: UTCATOMSWS.FIND_AND_SET ... NANOSLEEP)
    if "setmaxnreg" in classes and classes <= _SPIN_OK | {"setmaxnreg"}:
        return True
    elect = any(i.opcode == "ELECT" for i in insns)
    uniform_back = any(i.opclass == "branch" and {"U", "ANY"} <= set(i.mods) for i in insns)
    return elect and uniform_back and classes <= _SPIN_OK | _ISSUED


@attrs.define
class WorkLoop:
    """A loop of work with its steady-state body split from the code around it."""

    loop: Loop
    depth: int
    body: list  # instructions of the loop's own blocks (nested work loops excluded), in address order
    prologue: list
    epilogue: list
    name: str = ""
    spin: frozenset = frozenset()  # indices of the body's instructions that sit in spin (wait/issue) loops
    spin_waits: tuple = ()  # barrier operands of the body's spin loops that wait in line (not a failed wait's retry)
    outer: bool = False  # holds another work loop (a persistent tile loop around its k-loops)

    @property
    def header(self) -> int:
        return self.loop.header


def class_counts(insns) -> dict:
    out: dict[str, int] = {}
    for i in insns:
        out[i.opclass] = out.get(i.opclass, 0) + 1
    return out


def unroll_estimate(counts: dict) -> int:
    """Replication factor of a loop body: the gcd of the counts of the classes unrolling copies."""
    vals = [counts[c] for c in REPLICATED if counts.get(c)]
    return math.gcd(*vals) if vals else 1


def _barrier(insn) -> str:
    return next((o for o in insn.operands if o.startswith("[")), "")


def _waits_in_line(cfg: CFG, q: Loop) -> bool:
    """A spin loop that waits on an mbarrier and is entered in line (PTX's ``LAB_WAIT: try_wait; @P bra DONE;
    bra LAB_WAIT``), not only as the retry of a wait that failed (ptxas's ``TRYWAIT P1; @!P1 BRA retry``)."""
    insns = cfg.program.instructions
    if not any(i.opclass == "mbar.wait" for i in cfg.instructions(q.blocks)):
        return False
    for p in cfg.blocks[q.header].preds:
        if p in q.blocks or p not in cfg.reachable:
            continue
        target = q.header
        blk = cfg.blocks[p]
        last = insns[blk.end - 1]
        for _ in range(4):  # a retry stub that sets up the parity and falls into the spin loop
            if last.opclass == "branch" or len(blk.preds) != 1:
                break
            target = blk.id
            blk = cfg.blocks[blk.preds[0]]
            last = insns[blk.end - 1]
        if not (last.opclass == "branch" and last.predicated and last.targets and
                cfg.block_of[cfg.program.labels[last.targets[0]]] == target):
            return True
        guard = last.pred.lstrip("!")
        writer = next((i for i in reversed(insns[blk.start:blk.end - 1])
                       if i.operands and i.operands[0].replace("%", "") == guard), None)
        if writer is None or writer.opclass != "mbar.wait":
            return True
    return False


_STEP_ADD = {"VIADD", "IADD3", "UIADD3", "IADD", "add"}


def _int(op: str) -> int | None:
    return int(op, 0) if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", op) else None


def stepped_counters(body) -> dict[str, int]:
    """Registers stepped by a small constant in the loop, with the step: ``R = R + 1`` or read by an ``x + 1``
    (the next index); a loop unrolled twice steps its stage counter by 2 (``UIADD3 UR22, UR22, 0x2``)."""
    out: dict[str, int] = {}
    for i in body:
        if i.opcode in _STEP_ADD and len(i.operands) >= 3:
            srcs = [o for o in i.operands[1:] if o not in ("RZ", "URZ", "PT", "UPT")]
            steps = [_int(o) for o in srcs if _int(o) is not None]
            if steps and steps[0] in (1, 2, 4, 8):
                regs = [o.removesuffix(".reuse") for o in srcs if _int(o) is None]
                for r in [*regs, i.operands[0]]:
                    out[r] = min(out.get(r, steps[0]), steps[0])
    return out


def pipeline_steps(w: WorkLoop) -> int:
    """Pipeline steps one trip of a loop runs: each step waits on one stage's mbarrier (a consumer on *full*,
    a producer on *empty*). Counted as the waits issued in line; the retry loop a failed wait jumps to is kept
    out of line by ptxas and is the same step, and so is CUTLASS's test-then-wait (``TRYWAIT P2, [UR12], R11;
    @P2 BRA`` past a second ``TRYWAIT`` of the same operands). A loop whose waits all sit in their own spin
    loops counts those. 0 without mbarrier waits."""
    inline = [i for i in w.body if i.opclass == "mbar.wait" and i.index not in w.spin]
    steps, last, counted = 0, None, []
    for i in inline:
        if last is not None and last.operands[1:] == i.operands[1:] and i.index - last.index <= 4:
            continue
        steps += 1
        counted.append(i)
        last = i
    # CUTLASS's consumer tests the barrier (``try_wait`` into a token) and only then spins on the same barrier
    tested = {_barrier(i) for i in inline}
    spins = [b for b in w.spin_waits if not (b and b in tested)]
    return steps + len(spins) - _same_stage_waits([_barrier(i) for i in counted] + spins, w.body)


_SLOT = re.compile(r"\[([^\]+]+?)(?:\+(0x[0-9a-fA-F]+|\d+))?\]")


def _slot(addr: str, defs: dict) -> tuple[str, int] | None:
    """(base, byte offset) of an mbarrier operand: ``[UR10+0x1e020]``, or PTX's ``[%r61]`` with ``add.s32 %r61,
    %r77, 122912`` in the loop."""
    m = _SLOT.fullmatch(addr)
    if m is None:
        return None
    base, off = m.group(1), int(m.group(2), 0) if m.group(2) else 0
    while base in defs and off < 2**31:
        base, extra = defs.pop(base)
        off += extra
    return base, off


def _same_stage_waits(addrs: list[str], body) -> int:
    """Waits of one trip on one stage of different rings, counted once: Triton's pipelined ``tl.dot`` loop keeps
    one mbarrier ring per group of loads and waits on each at the same stage (``[UR10+0x1e000]`` and
    ``[UR10+0x1e020]``: two arrays of 8-byte barriers, not successive stages, which sit 8 bytes apart). For the
    waits on one base: their count minus the longest run of offsets 8 bytes apart."""
    defs = {}
    for i in body:
        if i.opcode == "add" and len(i.operands) == 3 and re.fullmatch(r"-?\d+", i.operands[2]):
            defs[i.operands[0]] = (i.operands[1], int(i.operands[2]))
    by_base: dict[str, set[int]] = {}
    for a in addrs:
        slot = _slot(a, dict(defs))
        if slot is not None:
            by_base.setdefault(slot[0], set()).add(slot[1])
    extra = 0
    for offsets in by_base.values():
        if len(offsets) < 2:
            continue
        ordered, run, best = sorted(offsets), 1, 1
        for a, b in zip(ordered, ordered[1:], strict=False):
            run = run + 1 if b - a == 8 else 1
            best = max(best, run)
        extra += len(ordered) - best
    return extra


def loop_unroll(w: WorkLoop) -> int:
    """Source iterations per trip. A pipelined (innermost) loop runs one pipeline step per source iteration, so
    its unroll is its step count (``pipeline_steps``), not the gcd of its operation counts (a producer issues
    several TMA loads per stage, a consumer several wgmma per k-step); other loops: ``unroll_estimate``."""
    steps = 0 if w.outer else pipeline_steps(w)  # an outer loop's waits belong to its k-loops' prologues
    if steps:
        return steps
    if exit_counter_step(w) == 1:
        return 1  # one trip per count of the counter the loop exits on: nothing replicated (wmma's k-loop)
    return unroll_estimate(class_counts(w.body))


def exit_counter_step(w: WorkLoop) -> int | None:
    """The step of the counter the back edge tests (``UIADD3 UR5, UR5, 0x1; ISETP.LE P0, PT, R30, UR5; @!P0
    BRA header`` -> 1), following predicate copies (``PLOP3.LUT P1, PT, PT, PT, UP0``); None when unclear."""
    body = w.body
    back = [i for i in body if i.opclass == "branch" and i.predicated and i.index not in w.spin]
    if not back:
        return None
    guard = back[-1].pred.lstrip("!").replace("%", "")
    counters = stepped_counters(body)
    for i in reversed(body[:body.index(back[-1])]):
        if not i.operands or i.operands[0].replace("%", "") != guard:
            continue
        srcs = [o.removesuffix(".reuse") for o in i.operands[1:]]
        if i.opcode in ("PLOP3", "UPLOP3", "mov"):
            nxt = next((o for o in srcs if o.lstrip("!") not in ("PT", "UPT") and o.lstrip("!")[:1] in "UP%"), None)
            if nxt is None:
                return None
            guard = nxt.lstrip("!").replace("%", "")
            continue
        if i.opcode in ("ISETP", "UISETP", "setp"):
            steps = {counters[o] for o in srcs if o in counters}
            return min(steps) if steps else None
        return None
    return None


def work_loops(cfg: CFG) -> list[WorkLoop]:
    loops = [lp for lp in cfg.loops if not is_spin_loop(cfg, lp)]
    ids = {lp.id for lp in loops}
    by_id = {lp.id: lp for lp in cfg.loops}
    in_any = set().union(*(lp.blocks for lp in loops)) if loops else set()
    out = []
    for lp in loops:
        depth, p = 1, lp.parent
        while p is not None:
            if p in ids:
                depth += 1
            p = by_id[p].parent
        nested = set().union(*(q.blocks for q in loops if q is not lp and q.blocks < lp.blocks)) \
            if len(loops) > 1 else set()
        spin_blocks = set().union(*(q.blocks for q in cfg.loops if q.id not in ids)) if len(cfg.loops) > len(loops) \
            else set()
        own = (lp.blocks - nested) | (lp.blocks & spin_blocks)
        body = cfg.instructions(own)
        straight = [b for b in cfg.reachable if b not in in_any]
        pro = [b for b in straight if cfg.dominates(b, lp.header)]
        first = cfg.blocks[lp.header].start
        last = max(cfg.blocks[b].end for b in lp.blocks)
        epi = [b for b in straight if cfg.blocks[b].start >= last and cfg.dominates(lp.header, b)]
        spin = frozenset(i.index for i in cfg.instructions(lp.blocks & spin_blocks)) if spin_blocks else frozenset()
        inline_spins = tuple(_barrier(next(i for i in cfg.instructions(q.blocks) if i.opclass == "mbar.wait"))
                             for q in cfg.loops if q.id not in ids and q.blocks <= lp.blocks and q is not lp
                             and _waits_in_line(cfg, q))
        out.append(WorkLoop(lp, depth, body, cfg.instructions(pro), cfg.instructions(epi), spin=spin,
                            spin_waits=inline_spins, outer=bool(nested)))
        del first
    out.sort(key=lambda w: cfg.blocks[w.header].start)
    for n, w in enumerate(out):
        w.name = f"L{n}"
    return out
