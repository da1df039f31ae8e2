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
_WORK = {"mma", "ld.global", "st.global", "ld.shared", "st.shared", "tma.load", "tma.store", "bulk.store", "cp.async",
         "fp32.fma", "fp32.add", "fp32.mul", "fp16", "fp64", "mufu", "ldsm", "stsm"}
_ISSUED = {"tma.load", "tma.store", "bulk.copy", "bulk.store", "mbar.arrive.tx", "mbar.arrive", "other.prefetch", "fence"}


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
    over_rings = _steps_over_rings([(_barrier(i), i.index) for i in counted] + [(b, None) for b in spins], w.body)
    return over_rings if over_rings is not None else steps + len(spins)


_SLOT = re.compile(r"\[([^\]+]+?)(?:\+URZ)?(?:\+(0x[0-9a-fA-F]+|\d+))?\]")
_IMM = re.compile(r"-?(0x[0-9a-fA-F]+|\d+)")
_ADDS = {"add", "IADD3", "UIADD3", "VIADD", "IADD", "UIADD"}
_LEAS = {"LEA", "ULEA"}
_SCALES = {"shl", "mul", "SHF", "USHF", "IMAD", "UIMAD", "IMAD.SHL", "LEA", "ULEA"}


def _ring_slot(addr: str, body, at: int | None) -> tuple[str, int, tuple] | None:
    """(root register, constant byte offset) of an mbarrier operand, the stage index left out: ``[UR26+0x10]``
    with ``ULEA UR26, UR4, UR25, 0x3`` is (UR25, 0x10); PTX's ``[%r60]`` with ``add.s32 %r60, %r77, 122880``,
    ``add.s32 %r77, %r13, %r76`` and ``shl.b32 %r76, %r554, 3`` is (%r13, 122880)."""
    m = _SLOT.fullmatch(addr)
    if m is None:
        return None
    base, off, index = m.group(1), int(m.group(2), 0) if m.group(2) else 0, []

    def def_of(reg: str, before: int | None):
        found = None
        for i in body:
            if before is not None and i.index >= before:
                break
            if i.operands and i.operands[0] == reg and i.opcode not in ("STS", "STG", "st"):
                found = i
        return found

    for _ in range(8):
        d = def_of(base, at)
        if d is None:
            break
        regs = [o.removesuffix(".reuse") for o in d.operands[1:] if o not in ("RZ", "URZ", "PT", "UPT")]
        imms = [int(o, 0) for o in regs if _IMM.fullmatch(o)]
        regs = [o for o in regs if not _IMM.fullmatch(o)]
        at = d.index
        if d.opcode in _LEAS and len(regs) >= 2:
            base = regs[1]  # LEA d, index, base, shift
            index.append((regs[0], at))
        elif d.opcode in _ADDS and len(regs) == 1 and len(imms) == 1:
            base, off = regs[0], off + imms[0]
        elif d.opcode in _ADDS and len(regs) == 2 and not imms:
            scaled = [r for r in regs if (x := def_of(r, d.index)) is not None and x.opcode.split(".")[0] in _SCALES]
            if len(scaled) != 1:
                break
            base = next(r for r in regs if r not in scaled)
            x = def_of(scaled[0], d.index)
            index.append((x.operands[1] if len(x.operands) > 1 else scaled[0], x.index))
        elif d.opcode in ("mov", "MOV", "UMOV", "R2UR") and len(regs) == 1:
            base = regs[0]
        else:
            break
    return base, off, tuple(index)


def _retested(body, first: int, second: int) -> bool:
    """The wait at ``second`` repeats the one at ``first``: each operand holds what it held (the register itself,
    or one written by the same instruction): CUTLASS's and flash-attn's test-then-wait, not a second step on a
    one-stage ring, which flips the phase in between."""
    a = next((i for i in body if i.index == first), None)
    b = next((i for i in body if i.index == second), None)
    if a is None or b is None or len(a.operands) != len(b.operands):
        return False

    def value(op: str, at: int, depth: int = 3):
        """An operand, or what the instruction that last wrote it computed (``IMAD R10, R6, -0x80000000, RZ`` and
        ``IMAD R14, R6, -0x80000000, RZ`` are one phase; ``MOV R3, UR18`` and ``IMAD.U32 R3, RZ, RZ, UR18``
        copy one value)."""
        d = None
        for i in body:
            if i.index >= at:
                break
            if i.operands and i.operands[0] == op:
                d = i
        if d is None or depth == 0:
            return op
        srcs = d.operands[1:]
        if d.opcode in ("MOV", "UMOV", "mov") and len(srcs) == 1 or \
                d.opcode == "IMAD" and len(srcs) == 3 and srcs[:2] == ("RZ", "RZ"):
            return value(srcs[-1], d.index, depth - 1)
        return d.opcode, d.mods, tuple(value(o, d.index, depth - 1) for o in srcs)

    return all(value(x, first) == value(y, second) for x, y in zip(a.operands[1:], b.operands[1:], strict=True))


def _steps_over_rings(waits: list[tuple[str, int | None]], body) -> int | None:
    """Pipeline steps of one trip from the mbarriers it waits on: waits on one ring (barriers 8 bytes apart,
    or one barrier at a stage index) are successive steps; waits on different rings at one trip are the
    same step (Triton's one ring per group of loads, ``[UR10+0x1e000]`` and ``[UR10+0x1e020]``;
    flash-attn's K and V pipelines, ``[UR26+0x10]`` and ``[UR10+0x30]`` from one base): the most waits on
    any one ring. None when an address cannot be resolved."""
    slots = [_ring_slot(a, body, at) for a, at in waits]
    if len(slots) < 2 or any(s is None for s in slots):
        return None
    # a barrier tested and then waited on again (the same root, offset and stage index, a few instructions
    # apart, or a spin loop on the barrier an inline wait tested) is one step
    kept, tested = [], set()
    for (_, at), slot in zip(waits, slots, strict=True):
        if at is None and slot in tested:
            continue
        if at is not None and kept and kept[-1][0] == slot and kept[-1][1] is not None and \
                _retested(body, kept[-1][1], at):
            continue
        kept.append((slot, at))
        if at is not None:
            tested.add(slot)
    slots = [slot for slot, _ in kept]
    per_root: dict[str, list[tuple[int, tuple]]] = {}
    for root, off, index in slots:
        per_root.setdefault(root, []).append((off, index))
    best = 0
    for waits_here in per_root.values():
        ordered = sorted({o for o, _ in waits_here})
        ring_of, ring = {}, 0
        for k, o in enumerate(ordered):
            if k and o - ordered[k - 1] != 8:
                ring += 1
            ring_of[o] = ring
        rings: dict[int, list[tuple]] = {}
        for o, index in waits_here:
            rings.setdefault(ring_of[o], []).append(index)
        best = max(best, *(_ring_steps(indices, body) for indices in rings.values()))
    return best


def _ring_steps(indices: list[tuple], body) -> int:
    """Steps one trip takes on one ring: its waits, unless they all index the ring by one stage counter that the
    trip advances fewer times (quack's consumer tests stage s+1 at the end of a trip, ``consumer_try_wait``, and
    waits on it at the top of the next one only if that test failed: two waits, one ``UIADD3 UR10, UR10, 0x1``)."""
    names = {ix[0][0] if ix else None for ix in indices}
    if len(indices) < 2 or len(names) != 1 or None in names:
        return len(indices)
    counter = names.pop()
    # ``UIADD3 UR10, UR10, 0x1`` (then ``USEL UR10, UR10, URZ, UP0``), or PTX's ``add.s32 %r138, %r726, 1;
    # selp.b32 %r726, 0, %r138, %p34``
    selected = {o for i in body if i.opcode in ("SEL", "USEL", "selp") and i.operands and i.operands[0] == counter
                for o in i.operands[1:3]}
    bumps = sum(1 for i in body if i.opcode in _ADDS and len(i.operands) >= 3 and i.operands[1] == counter
                and (i.operands[0] == counter or i.operands[0] in selected)
                and _IMM.fullmatch(i.operands[2]) and int(i.operands[2], 0) == 1)
    return min(len(indices), bumps) if bumps else len(indices)


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
