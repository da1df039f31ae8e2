"""Compare two fingerprints: ranked discrepancy rows and one distance per layer.

Features are matched by key and warp role: roles with the same name (producer with producer, consumer with
consumer); the two main roles -- those holding the MMA loop, else the hottest -- with each other when their
names differ, so a kernel without warp roles (``all``) is compared with the other's consumer, and the row's
``where`` says so. A feature either side cannot tell (``None``)
is not compared. A numeric (or map) feature whose difference is below its rule's ``tolerance`` is the same
on both sides (distance 0, no row). Each differing feature gives one :class:`~mosaic.records.Discrepancy`
whose edit class and sentence come from ``rules``; rows are ranked causes first by expected cost, each
cause followed by the rows it explains (:mod:`mosaic.lift.causes`), with ``rank_key`` (layer order) the tie-break. A layer's distance is the
mean of its compared features' distances (each in [0, 1]); it is a tiebreaker for search, not a score.
"""

from __future__ import annotations

from typing import Any

import attrs

from mosaic.lift.align import alignment_cost
from mosaic.lift.causes import rank_rows
from mosaic.lift.fingerprint import Feature, Fingerprint
from mosaic.lift.rules import BY_KEY, ORDER
from mosaic.records import LAYERS, Discrepancy


@attrs.frozen
class DiffResult:
    layers: tuple  # ((name, distance), ...) in LAYERS order
    rows: tuple  # Discrepancy, sorted by rank
    compared: dict  # layer -> number of features compared
    unknown: dict  # layer -> keys not compared (unknown on one side or both)

    def to_json(self) -> dict:
        """The public ``mosaic diff --json`` shape."""
        return {"layers": [{"name": n, "distance": round(d, 4)} for n, d in self.layers],
                "rows": [{"rank": r.rank, "layer": r.layer, "key": r.key, "reference": r.reference,
                          "candidate": r.candidate, "edit": r.edit, "where": r.where, "why": r.why,
                          "cause": r.cause, "cost": r.cost}
                         for r in self.rows]}


def feature_distance(kind: str, a: Any, b: Any) -> float:
    if kind == "cat":
        return 0.0 if a == b else 1.0
    if kind == "num":
        if a == b:
            return 0.0
        return min(1.0, abs(a - b) / max(abs(a), abs(b), 1))
    if kind == "set":
        sa, sb = set(map(str, a)), set(map(str, b))
        union = sa | sb
        return 0.0 if not union else 1.0 - len(sa & sb) / len(union)
    if kind == "map":
        keys = set(a) | set(b)
        if not keys:
            return 0.0
        return sum(feature_distance("num", a.get(k) or 0, b.get(k) or 0) for k in keys) / len(keys)
    if kind == "seq":
        if list(a) == list(b):
            return 0.0
        cost, _ = alignment_cost(list(a), list(b))
        return min(1.0, cost / max(len(a), len(b), 1))
    raise ValueError(f"unknown feature kind {kind!r}")


def within_tolerance(kind: str, a: Any, b: Any, tolerance: float) -> bool:
    """Whether two values of a ``num`` or ``map`` feature differ by less than ``tolerance`` (every map entry)."""
    if tolerance <= 0:
        return False
    if kind == "num":
        return abs(a - b) < tolerance
    if kind == "map":
        return all(abs((a.get(k) or 0) - (b.get(k) or 0)) < tolerance for k in set(a) | set(b))
    return False


def _show(f: Feature) -> Any:
    v = f.value
    if f.kind == "seq":
        text = " ".join(map(str, v))
        return text if len(text) <= 160 else text[:157] + "..."
    if isinstance(v, tuple):
        return list(v)
    return v


def _role_pairs(ref: Fingerprint, cand: Fingerprint) -> list[tuple[str, str]]:
    rr = {f.role for f in ref.features if f.role}
    cr = {f.role for f in cand.features if f.role}
    pairs = [(r, r) for r in sorted(rr & cr)]
    if ref.main_role in rr - cr and cand.main_role in cr - rr:
        pairs.append((ref.main_role, cand.main_role))
    return pairs


def _pair_note(ref_role: str, cand_role: str) -> str:
    if ref_role == "all":
        return (f"reference has no warp roles: its one loop nest is compared with the candidate's {cand_role} "
                "(MMA) loop")
    if cand_role == "all":
        return (f"candidate has no warp roles: its one loop nest is compared with the reference's {ref_role} "
                "(MMA) loop")
    return f"reference role {ref_role}"


def rank_key(row: Discrepancy, distance: float) -> tuple:
    """The tie-break between rows of equal expected cost: layer order, then the rule's importance within its
    layer, then the size of the difference."""
    return (LAYERS.index(row.layer), ORDER.get(row.key, len(ORDER)), -distance, row.where, row.key)


def diff_fingerprints(ref: Fingerprint, cand: Fingerprint) -> DiffResult:
    pairs: list[tuple[Feature, Feature]] = []
    cand_by = {(f.key, f.role): f for f in cand.features}
    for f in ref.features:
        if not f.role and (f.key, "") in cand_by:
            pairs.append((f, cand_by[(f.key, "")]))
    for r, c in _role_pairs(ref, cand):
        for f in ref.features:
            if f.role == r and (f.key, c) in cand_by:
                pairs.append((f, cand_by[(f.key, c)]))
    sums = dict.fromkeys(LAYERS, 0.0)
    counts = dict.fromkeys(LAYERS, 0)
    unknown: dict[str, list[str]] = {n: [] for n in LAYERS}
    scored: list[tuple[Discrepancy, float]] = []
    for a, b in pairs:
        if a.value is None or b.value is None:
            unknown[a.layer].append(a.key)
            continue
        rule = BY_KEY.get(a.key)
        d = 0.0 if rule and within_tolerance(a.kind, a.value, b.value, rule.tolerance) else \
            feature_distance(a.kind, a.value, b.value)
        sums[a.layer] += d
        counts[a.layer] += 1
        if d == 0.0:
            continue
        edit = rule.edit if rule else "rewrite"
        why = rule.why if rule else "differs"
        where = b.where if b.role == a.role else f"{b.where} ({_pair_note(a.role, b.role)})"
        row = Discrepancy(layer=a.layer, key=a.key, reference=_json(_show(a)), candidate=_json(_show(b)), rank=1,
                          edit=edit, where=where, why=why)
        scored.append((row, d))
    rows = rank_rows(scored, rank_key)
    layers = tuple((n, sums[n] / counts[n] if counts[n] else 0.0) for n in LAYERS)
    return DiffResult(layers=layers, rows=rows, compared=counts, unknown={k: sorted(set(v)) for k, v in unknown.items()})


def _json(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_json(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json(x) for k, x in v.items()}
    return v
