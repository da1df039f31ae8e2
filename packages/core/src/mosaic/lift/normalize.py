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
        out.append(WorkLoop(lp, depth, body, cfg.instructions(pro), cfg.instructions(epi)))
        del first
    out.sort(key=lambda w: cfg.blocks[w.header].start)
    for n, w in enumerate(out):
        w.name = f"L{n}"
    return out
