"""Causes before symptoms: which diff rows are consequences of which, and what each row is expected to cost.

A kernel engineer reads a diff by cause: an exact ``expf`` (``exp.form``) *explains* a longer hot loop, a
different instruction mix and order and more registers; those rows are its symptoms. Two tables of data
decide the grouping and the order:

* :data:`IMPLIES` -- cause key -> the keys it can explain. A row whose key a *present* cause row implies is
  grouped under that cause (its ``cause`` names the cause's key) and is ranked right after it. When several
  present causes imply it, the one with the highest expected cost takes it. A cause may itself be implied by
  a stronger cause (``div.form`` implies ``fma.contraction``: the IEEE divide's Newton steps are separate
  multiplies and adds); :data:`STRENGTH` orders them, and a cause is never grouped under a weaker one.
* :data:`PRIOR` -- key -> the share of the candidate's time gap a full difference of that kind is expected to
  explain (a chosen value per construct, documented here, not a measurement). A row's own cost is
  ``PRIOR[key] * distance`` (distance in [0, 1], from the diff); a cause's expected cost adds
  :data:`SYMPTOM_SHARE` of its symptoms' own costs, so a cause with a large hot-loop consequence (quack's
  663-line softmax loop against a 14,954-line unrolled exact one) weighs more than the same cause whose
  symptoms are small.

Rank (:func:`rank_rows`): causes by expected cost, highest first (the layer order, then the rule order, are
the tie-break), each followed by its symptoms by their own cost. The campaign refines the estimate with what
it measured (:func:`measured_costs`): a key whose edits were judged null or slower drops to zero (its rows go
last), a key whose accepted edit gained time keeps that gain as its cost; the gap to the physical floor caps
any estimate in time units (:func:`to_time`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from mosaic.records import LAYERS, Discrepancy

#: the hot-loop and resource rows that any change of the code inside the loop moves
_LOOP = ("hot_loop.mix", "hot_loop.order", "hot_loop.length", "registers", "spills", "stack_frame",
         "occupancy.warps_per_sm", "occupancy.achieved", "stalls.top")
#: the whole kernel's code length: what unrolling and inline math expansions change, where a loop may be gone
_CODE = ("code.length",)
_NUMERIC_SYMPTOMS = _LOOP + _CODE + ("loop.unroll", "access.generic.load_width", "access.generic.store_width")

#: cause key -> the keys whose difference it can explain (rules as data; docs/lifting.md, "Causes")
IMPLIES: Mapping[str, tuple[str, ...]] = {
    # numerics: the form of a math function changes the instructions of every loop that calls it
    "exp.form": _NUMERIC_SYMPTOMS + ("fma.contraction", "denormal.flush", "conversion.modes"),
    "div.form": _NUMERIC_SYMPTOMS + ("fma.contraction", "denormal.flush"),
    "fma.contraction": _NUMERIC_SYMPTOMS,
    "conversion.modes": _NUMERIC_SYMPTOMS,
    "denormal.flush": _NUMERIC_SYMPTOMS,
    # transfer: how tiles move decides the barriers, widths and the loop around them
    "transfer.form": _LOOP + ("barrier.ops", "access.async_copy_width", "access.global.load_width",
                              "access.shared.load_width", "access.shared.store_width", "pipeline.wait_depth",
                              "smem.static", "smem.dynamic", "loop.unroll", "memory_throughput"),
    "transfer.store_form": _LOOP + ("access.global.store_width", "access.shared.store_width", "epilogue.form",
                                    "barrier.ops"),
    "access.global.load_width": _LOOP + ("loop.unroll", "memory_throughput"),
    "access.global.store_width": _LOOP + ("loop.unroll", "memory_throughput"),
    "access.generic.load_width": _LOOP + ("loop.unroll",),
    "access.generic.store_width": _LOOP + ("loop.unroll",),
    "access.shared.load_width": _LOOP,
    "access.shared.store_width": _LOOP,
    "access.async_copy_width": _LOOP,
    "mma.form": _LOOP + ("mma.shape", "mma.types", "barrier.ops", "pipeline.wait_depth", "tensor_pipe",
                         "access.shared.load_width", "mma.accumulator", "mma.cta_group", "tmem.ops"),
    # sm_100: a CTA pair per MMA halves each CTA's B slots and commits to the pair's barriers
    "mma.cta_group": _LOOP + ("smem.static", "smem.dynamic", "barrier.ops", "tmem.ops", "tensor_pipe"),
    "mma.shape": _LOOP + ("tensor_pipe",),
    "mma.operands": _LOOP + ("access.shared.store_width", "access.shared.load_width", "barrier.ops", "smem.static",
                             "smem.dynamic"),
    "mma.types": _LOOP + ("tensor_pipe", "conversion.modes"),
    # loops: an unroll factor or a pipeline depth changes the body and the buffers
    "loop.unroll": _LOOP + _CODE,
    "pipeline.stages": _LOOP + ("smem.static", "smem.dynamic", "pipeline.wait_depth"),
    "pipeline.wait_depth": _LOOP,
    "persistent": _LOOP + ("grid", "loops.depth", "epilogue.form"),
    "loops.depth": _LOOP,
    "epilogue.form": _LOOP + ("transfer.store_form", "access.global.store_width"),
    # launch: roles, threads and clusters reshape everything below them
    "roles": _LOOP + ("warp_role_branches", "roles.registers", "roles.warpgroups", "block", "warpgroups",
                      "block.max_threads"),
    "roles.warpgroups": _LOOP + ("block", "warpgroups", "roles.registers"),
    "block": _LOOP,
    "block.max_threads": _LOOP,
    "warpgroups": _LOOP,
    "cluster": ("barrier.ops", "grid", "l2.hit_rate"),
    "grid": ("occupancy.achieved", "l2.hit_rate"),
    "roles.registers": ("registers", "spills", "stack_frame"),
    "registers": ("spills", "stack_frame", "occupancy.warps_per_sm", "occupancy.achieved"),
}

#: which cause explains which when both are present: a row is grouped only under a stronger cause.
#: Source constructs first (math forms, copy forms, widths, MMA forms), then loop structure, then launch shape,
#: then resources; a key not listed is weakest (a pure symptom: hot_loop.*, spills, metrics).
STRENGTH: tuple[str, ...] = (
    "exp.form", "div.form", "mma.form", "transfer.form", "transfer.store_form", "conversion.modes",
    "mma.types", "mma.shape", "mma.cta_group", "mma.operands", "access.global.load_width",
    "access.global.store_width",
    "access.generic.load_width", "access.generic.store_width", "access.async_copy_width",
    "access.shared.load_width", "access.shared.store_width", "fma.contraction", "denormal.flush",
    "roles", "roles.warpgroups", "persistent", "pipeline.stages", "epilogue.form", "loops.depth",
    "loop.unroll", "pipeline.wait_depth", "cluster", "block", "block.max_threads", "warpgroups", "grid",
    "roles.registers", "registers",
)
_STRENGTH = {k: n for n, k in enumerate(STRENGTH)}

#: key -> expected share of the time gap a full difference explains (chosen, not measured; see module doc).
#: Structural forms that change the hot loop's work are high; resource and metric symptoms are low, since
#: they are usually explained by a cause above them.
PRIOR: Mapping[str, float] = {
    "mma.form": 1.0, "roles": 0.6, "transfer.form": 0.6, "exp.form": 0.6, "div.form": 0.5,
    "persistent": 0.45, "grid": 0.45, "pipeline.stages": 0.4, "mma.shape": 0.4, "block": 0.35,
    "roles.warpgroups": 0.35, "cluster": 0.3, "mma.types": 0.3, "transfer.store_form": 0.3,
    "access.global.load_width": 0.35, "access.global.store_width": 0.3, "access.generic.load_width": 0.3,
    "access.generic.store_width": 0.25, "access.async_copy_width": 0.2, "access.shared.load_width": 0.2,
    "access.shared.store_width": 0.15, "loop.unroll": 0.3, "epilogue.form": 0.25, "loops.depth": 0.25,
    "fma.contraction": 0.25, "conversion.modes": 0.15, "denormal.flush": 0.05, "block.max_threads": 0.25,
    "warpgroups": 0.25, "pipeline.wait_depth": 0.2, "warp_role_branches": 0.3, "roles.registers": 0.2,
    "registers": 0.2, "occupancy.warps_per_sm": 0.15, "smem.static": 0.15, "smem.dynamic": 0.15,
    "barrier.ops": 0.15, "hot_loop.mix": 0.3, "hot_loop.order": 0.2, "hot_loop.length": 0.3,
    "spills": 0.4, "stack_frame": 0.2, "code.length": 0.3, "mma.operands": 0.3,
    "stalls.top": 0.2, "tensor_pipe": 0.2, "memory_throughput": 0.2,
    "occupancy.achieved": 0.15, "l2.hit_rate": 0.15,
    "mma.cta_group": 0.3, "mma.accumulator": 0.2, "tmem.ops": 0.15,
}
DEFAULT_PRIOR = 0.1
#: how much of a symptom's own cost counts toward its cause's expected cost
SYMPTOM_SHARE = 0.5
#: the verdicts that say an edit of a key bought nothing (its key's rows drop to the end)
NO_GAIN = frozenset({"null", "slower"})


def own_cost(key: str, distance: float) -> float:
    return PRIOR.get(key, DEFAULT_PRIOR) * max(0.0, min(1.0, distance))


def _stronger(a: str, b: str) -> bool:
    """``a`` may explain ``b``: a stronger cause (a key outside STRENGTH is a pure symptom, weakest)."""
    return _STRENGTH.get(a, len(STRENGTH)) < _STRENGTH.get(b, len(STRENGTH))


def group(rows: Iterable[tuple[Discrepancy, float]]) -> dict[int, int | None]:
    """Index of each row's cause row (None: the row is a cause). Rows are ``(row, own cost)``; a row is grouped
    under the costliest present row that implies its key and is a stronger cause, never a symptom itself."""
    items = list(rows)
    causes: dict[int, int | None] = {}
    order = sorted(range(len(items)), key=lambda i: _STRENGTH.get(items[i][0].key, len(STRENGTH)))
    for i in order:
        row = items[i][0]
        best = None
        for j, (other, cost) in enumerate(items):
            if j == i or (j in causes and causes[j] is not None):
                continue  # a row already grouped under another is no cause
            if row.key in IMPLIES.get(other.key, ()) and _stronger(other.key, row.key) \
                    and (best is None or cost > items[best][1]):
                best = j
        causes[i] = best
    return causes


def rank_rows(scored: Iterable[tuple[Discrepancy, float]], tiebreak, measured: Mapping[str, float] | None = None
              ) -> tuple[Discrepancy, ...]:
    """Rows ``(row, distance)`` ranked causes first by expected cost, each cause followed by its symptoms.

    ``tiebreak(row, distance)`` is the layer-and-rule order. ``measured`` (key -> cost share the campaign
    measured, 0.0 for a key whose edits bought nothing) replaces a cause's estimate."""
    items = [(row, own_cost(row.key, d), d) for row, d in scored]
    causes = group((row, c) for row, c, _ in items)
    symptoms: dict[int, list[int]] = {}
    for i, c in causes.items():
        if c is not None:
            symptoms.setdefault(c, []).append(i)
    measured = dict(measured or {})

    def expected(i: int) -> float:
        row, c, _ = items[i]
        if row.key in measured:
            return measured[row.key]
        return c + SYMPTOM_SHARE * sum(items[s][1] for s in symptoms.get(i, ()))

    heads = sorted((i for i, c in causes.items() if c is None),
                   key=lambda i: (-round(expected(i), 6), tiebreak(items[i][0], items[i][2])))
    out: list[Discrepancy] = []
    for h in heads:
        row = items[h][0]
        out.append(attrs.evolve(row, rank=len(out) + 1, cause="", cost=round(expected(h), 4)))
        for s in sorted(symptoms.get(h, ()), key=lambda i: (-items[i][1], tiebreak(items[i][0], items[i][2]))):
            out.append(attrs.evolve(items[s][0], rank=len(out) + 1, cause=row.key, cost=round(items[s][1], 4)))
    return tuple(out)


def measured_costs(history: Iterable[Mapping], gap_ns: float | None) -> dict[str, float]:
    """What the campaign's own verdicts say each row key costs: ``{key: share}``.

    An edit's key is the row it was aimed at (``edit["row"]["key"]``). A key every judged edit of which was
    null or slower costs 0.0 (its rows go last); a key with an edit that gained time costs the largest gain
    over ``gap_ns`` (the incumbent's gap when the edit was judged). Keys never edited are absent (estimated)."""
    gains: dict[str, list[float]] = {}
    for h in history:
        edit = h.get("edit") or {}
        key = (edit.get("row") or {}).get("key")
        outcome = h.get("outcome")
        if not key or outcome is None:
            continue
        gain = h.get("gain_ns")
        if outcome in NO_GAIN:
            gains.setdefault(key, []).append(0.0)
        elif h.get("accepted") and isinstance(gain, int | float) and gap_ns and gap_ns > 0:
            gains.setdefault(key, []).append(max(0.0, gain) / gap_ns)
    return {k: max(v) for k, v in gains.items()}


def rerank(rows: Iterable[Discrepancy], measured: Mapping[str, float]) -> tuple[Discrepancy, ...]:
    """Ranked rows (:func:`rank_rows`' output) re-ranked with the campaign's measured costs: a cause whose key
    was measured takes that cost; groups stay together, the old order is the tie-break."""
    groups: list[list[Discrepancy]] = []
    for row in rows:
        if not row.cause or not groups:
            groups.append([row])
        else:
            groups[-1].append(row)
    if not measured:
        return tuple(r for g in groups for r in g)

    def cost(g: list[Discrepancy]) -> float:
        return measured.get(g[0].key, g[0].cost)

    ordered = sorted(enumerate(groups), key=lambda item: (-round(cost(item[1]), 6), item[0]))
    out: list[Discrepancy] = []
    for _, g in ordered:
        head = attrs.evolve(g[0], cost=round(cost(g), 4))
        for row in (head, *g[1:]):
            out.append(attrs.evolve(row, rank=len(out) + 1))
    return tuple(out)


def to_time(share: float, candidate_ns: float, reference_ns: float, floor_ns: float = 0.0) -> float:
    """A cost share as nanoseconds of the candidate's gap to the reference (or to the physical floor when the
    reference is below it), never more than the candidate's time above the floor."""
    target = max(reference_ns, floor_ns)
    gap = max(0.0, candidate_ns - target)
    return min(share * gap, max(0.0, candidate_ns - floor_ns))


def layer_tiebreak(row: Discrepancy, distance: float, order: Mapping[str, int]) -> tuple:
    return (LAYERS.index(row.layer), order.get(row.key, len(order)), -distance, row.where, row.key)


__all__ = ["IMPLIES", "PRIOR", "STRENGTH", "group", "measured_costs", "own_cost", "rank_rows", "rerank", "to_time"]
