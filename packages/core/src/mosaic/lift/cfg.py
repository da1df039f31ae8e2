"""Basic blocks, the control-flow graph, dominators and natural loops with their nesting.

Blocks are cut here, not taken from ``nvdisasm -cfg`` (whose blocks are not basic blocks): a block starts at
the entry, at every branch or call target and after every branch, call, return or exit, and ends at the next
such point. Edges follow branch targets and fall-through (a predicated branch or exit falls through too). A
call (``CALL.REL.NOINC `($__internal_0_$__cuda_sm3x_div_rn_noftz_f32_slowpath)``) has an edge to the
subroutine's entry and one to the instruction after it, where its ``RET`` comes back; the subroutine is its
own region (``CFG.subroutines``) and its ``RET`` ends a block with no successor (it is not a jump to the
label it names, the caller's function). Dominators come
from networkx; a natural loop is the set of blocks that reach a back edge's source without passing its
header (a back edge goes to a block that dominates its source). Loops with one header are merged.
"""

from __future__ import annotations

import attrs
import networkx as nx

from mosaic.lift.instruction import Program

_ENDS = {"branch", "exit", "call", "return"}


@attrs.define
class Block:
    id: int
    start: int  # first instruction index
    end: int  # one past the last
    succs: list = attrs.field(factory=list)
    preds: list = attrs.field(factory=list)


@attrs.define
class Loop:
    id: int
    header: int
    blocks: frozenset
    latches: tuple
    parent: int | None = None
    depth: int = 1
    children: list = attrs.field(factory=list)

    def size(self, cfg: CFG) -> int:
        return sum(cfg.blocks[b].end - cfg.blocks[b].start for b in self.blocks)


@attrs.define
class CFG:
    program: Program
    blocks: list
    block_of: list  # instruction index -> block id
    reachable: frozenset
    idom: dict
    loops: list
    subroutines: dict = attrs.field(factory=dict)  # label -> entry block of each called subroutine

    def instructions(self, block_ids) -> list:
        insns = self.program.instructions
        out = []
        for b in sorted(block_ids, key=lambda i: self.blocks[i].start):
            blk = self.blocks[b]
            out.extend(insns[blk.start:blk.end])
        return out

    def dominates(self, a: int, b: int) -> bool:
        while True:
            if a == b:
                return True
            parent = self.idom.get(b)
            if parent is None or parent == b:
                return False
            b = parent

    def innermost_loop(self, block: int) -> Loop | None:
        best = None
        for lp in self.loops:
            if block in lp.blocks and (best is None or lp.depth > best.depth):
                best = lp
        return best


def build_cfg(program: Program) -> CFG:
    insns = program.instructions
    n = len(insns)
    leaders = {0}
    for insn in insns:
        if insn.opclass in _ENDS:
            if insn.index + 1 < n:
                leaders.add(insn.index + 1)
            for t in insn.targets:
                leaders.add(program.labels[t])
    starts = sorted(leaders)
    blocks = []
    block_of = [0] * n
    for bid, s in enumerate(starts):
        e = starts[bid + 1] if bid + 1 < len(starts) else n
        blocks.append(Block(bid, s, e))
        for i in range(s, e):
            block_of[i] = bid
    for blk in blocks:
        last = insns[blk.end - 1]
        succs: list[int] = []
        falls = True
        if last.opclass in ("branch", "call"):
            succs.extend(block_of[program.labels[t]] for t in last.targets)
            falls = last.predicated or last.opclass == "call"
        elif last.opclass in ("exit", "return"):
            falls = last.predicated
        if falls and blk.end < n:
            succs.append(blk.id + 1)
        blk.succs = list(dict.fromkeys(succs))
    for blk in blocks:
        for s in blk.succs:
            blocks[s].preds.append(blk.id)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(blocks)))
    graph.add_edges_from((b.id, s) for b in blocks for s in b.succs)
    reachable = frozenset(nx.descendants(graph, 0) | {0})
    idom = nx.immediate_dominators(graph, 0)
    subs = {t: block_of[program.labels[t]] for i in insns if i.opclass == "call" for t in i.targets}
    cfg = CFG(program, blocks, block_of, reachable, idom, [], subs)
    cfg.loops = _natural_loops(cfg)
    return cfg


def _natural_loops(cfg: CFG) -> list[Loop]:
    by_header: dict[int, tuple[set, list]] = {}
    for blk in cfg.blocks:
        if blk.id not in cfg.reachable:
            continue
        for h in blk.succs:
            if cfg.dominates(h, blk.id):  # back edge blk -> h
                body, latches = by_header.setdefault(h, ({h}, []))
                latches.append(blk.id)
                stack = [blk.id]
                while stack:
                    x = stack.pop()
                    if x in body:
                        continue
                    body.add(x)
                    stack.extend(p for p in cfg.blocks[x].preds if p in cfg.reachable)
    loops = [Loop(i, h, frozenset(body), tuple(latches))
             for i, (h, (body, latches)) in enumerate(sorted(by_header.items()))]
    # nesting: parent = the smallest loop that strictly contains this one
    for lp in loops:
        parents = [q for q in loops if q is not lp and lp.blocks < q.blocks]
        if parents:
            lp.parent = min(parents, key=lambda q: len(q.blocks)).id
    by_id = {lp.id: lp for lp in loops}
    for lp in loops:
        d, p = 1, lp.parent
        while p is not None:
            d += 1
            p = by_id[p].parent
        lp.depth = d
        if lp.parent is not None:
            by_id[lp.parent].children.append(lp.id)
    return loops
