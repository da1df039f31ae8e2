"""The ``knobs`` proposer: deterministic, one knob value changed per edit, knobs before rewrites.

Rows come ranked causes first (:mod:`mosaic.lift.causes`: by expected cost, each cause followed by the rows it
explains, re-ranked by what the campaign measured). The proposer works **one cause at a time, round robin**
(:func:`round_robin`): each cause's best edit before any cause's second edit; a cause's edits are its own
row's knob edits, then those of the rows it explains, then the catalog's source rewrites aimed at them (for a
parent that is a source: a kernel file or an accepted source edit; :mod:`mosaic.rewrites`). Causes whose rule's
edit class is ``knob`` come before ``rewrite``-class causes, each class in rank order. A cause whose edits were
judged null or slower has measured cost 0 and so comes last.

For each row the row is mapped to catalog concepts: the row's key names a fingerprint feature
(:data:`ROW_FEATURES`), and for ``*.form`` rows each form token in the reference's and the candidate's value
names one (:data:`FORM_FEATURES`); :func:`mosaic.catalog.concepts_for_feature` turns the feature into
concepts. Within a row, concepts that more of the request's rows point to come first (a concept several
differences agree on explains more of the diff: ``smem.dynamic``, ``hot_loop.mix`` and ``loop.unroll`` all
point to ``cta-tile``); ties keep catalog order. A feature that holds alike on both sides of a row (:data:`FEATURE_TESTS`: a
``grid`` row where both grids fit the GPU's SMs is no lead to persistence) gives that row no concept. The target language's construct for each concept names its
knobs (``knob: stages``, ``knobs: raster, swizzle``, ``knob: kernel='naive'``). Each knob then gets
candidate values, in order:

* a value the construct pins (``kernel='naive'``) when the reference shows the concept and the candidate
  does not; the knob's default when the candidate shows a pinned concept the reference does not;
* the row's reference value when it fits the knob (``pipeline.stages`` 4 -> ``stages=4``; ``cluster``
  [2, 1, 1] -> ``cluster_mn=(2, 1)``, or ``cluster_m=2`` / ``cluster_n=1`` for knobs named per axis);
* neighbours of the current value: booleans flipped, integers x2, +1, -1, /2, pairs with one side doubled
  or halved, or swapped; strings go to the default;
* then the values the knob class lists for the field (``attrs.field(metadata={"values": (...)})``, nearest
  first): how a knob that is a name (a kernel schedule) or ``'auto'`` (a stage count) moves. A listed
  ``implies`` (``{value: {other_knob: value}}``) sets the companion knobs that value needs to be buildable
  (a pingpong kernel schedule needs its epilogue schedule); the edit records them.

Every value goes through the target's knob class (its validators decide what is legal); an invalid one is
skipped, never proposed; a knob set already proposed (reached from an earlier row) is not listed again.

The campaign's history (``Request.history``: every built edit with its outcome) removes two kinds of edit
(:func:`blocked`):

* a revert: setting a knob back to the value an *accepted* edit moved it away from (step 1 accepted
  ``persistent: false -> true``; ``persistent=false`` is never proposed again in that campaign);
* a retry: ``knob=value`` that was already rejected (slower, null, below the floor, failed the numerics
  gate) while the knobs it interacts with had the same values. Knobs interact when one construct of the
  target language names them together (``knobs: raster, swizzle``; ``knobs: tile_mn, tile_k``):
  ``swizzle=2`` rejected with ``raster='m'`` may come back once ``raster='n'``, but not because the stage
  count moved. A knob class field may also name the knobs its outcome depends on
  (``attrs.field(metadata={"interacts": (...)})``, both ways): CuTe's ``persistent`` names ``tile_mn`` and
  ``cluster_mn`` (a persistent tile loop pays by the tiles each SM walks: rejected on 4096 128x128 tiles at
  8192^3, it is a new edit on 2048 128x256 tiles in 2x1 clusters). An *unbuildable* edit interacts with every other knob (shared memory, registers and threads
  are budgets that tile, stages and epilogue share: ``tile_mn=(128, 256)`` fails with 5 stages and builds
  with 4), so only the same edit on the same other knobs is a retry.

Compound edits (:mod:`mosaic.proposers.dependencies`): when the target's knob class carries a
``DEPENDENCIES`` table, each single edit is checked on the CPU by the plugin's can-implement predicate (with
the campaign's shape and the request's GPU record) and the table's known-partner rules. One that is
unbuildable or known to need a partner becomes the smallest compound edit that passes (breadth first over
the partners the violated rules name; the edit's own knob stays as set): still ONE edit aimed at ONE row,
``{"kind": "knob", "knob", "value", ..., "compound": true, "parts": [{knob, value, was[, rule, why]}]}``,
its first part the edit itself. When none exists the single edit is kept: one the predicate refuses comes
last (below), one that only misses a partner that does not fit this shape keeps its place; one that would
build and only wants a partner (every rule it violates is a known-partner rule) comes after every other edit,
its ``violates`` listing the rules' codes (from the 4096^3 CUTLASS winner, 128x256 with a 2x1 cluster,
``cluster_m=1`` wants its multicast partner back: it comes after the tile and stage edits). A part is no revert
(only the edit's own knob is); a rejected compound is a retry only on the same whole knob set.

Predicted rows (:mod:`mosaic.proposers.predicted`): when the target's knob class carries ``PREDICTS`` (a row
key -> what the lift will read for a knob set: the row-wise Pallas kernels' ``smem.dynamic`` and ``grid``), every
knob whose listed values move a predicted row is a candidate for that row (also one no catalog concept of the row
names), and each edit gets a predicted change over all predicted rows of the request (sum of ``|log(value /
reference)|`` after minus before). Within a row, edits that bring the rows nearer the reference come first (the
largest change first); edits that move them farther on balance are held back.

The order of what is held back, after every other edit: the single edits that build but want a partner they
cannot get (``violates``, above); the edits a prediction says move away from the reference (the least change
first); last, the edits the CPU predicate refuses with no compound that mends them (``violates`` names the
rules). None is dropped: the build, the gate and the timing still decide each.

The output is a list, best first; the loop takes the first whose candidate it has not built.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from mosaic.catalog import concepts_for_feature
from mosaic.errors import MosaicError, RecordError
from mosaic.fields import keyed_knobs
from mosaic.proposers import Proposal, Request
from mosaic.proposers.dependencies import complete, dependencies_of, violations
from mosaic.proposers.predicted import Gauge, predict, predictions_of
from mosaic.records import GpuTarget, KernelSpec

#: diff row key -> catalog fingerprint features that reveal the concept behind it
ROW_FEATURES = {
    "cluster": ("launch:cluster>1",),
    "roles": ("control:warp-role-branch",),
    "warp_role_branches": ("control:warp-role-branch",),
    "block": ("launch:block%128==0", "control:warp-role-branch"),
    "block.max_threads": ("launch:block%128==0",),
    "warpgroups": ("launch:block%128==0",),
    "grid": ("launch:grid<=sm_count", "launch:grid-shape"),
    "smem.static": ("control:pipeline-depth", "control:epilogue-subtile-loop", "launch:smem-per-stage"),
    "smem.dynamic": ("control:pipeline-depth", "control:epilogue-subtile-loop", "launch:smem-per-stage"),
    "registers": ("ptx:setmaxnreg",),
    "roles.registers": ("ptx:setmaxnreg",),
    "occupancy.warps_per_sm": ("launch:block%128==0",),
    "persistent": ("control:outer-tile-loop",),
    "pipeline.stages": ("control:pipeline-depth",),
    "pipeline.wait_depth": ("ptx:wgmma.wait_group", "control:pipeline-depth"),
    "epilogue.form": ("control:epilogue-subtile-loop", "ptx:st.global"),
    "mma.shape": ("ptx:wgmma.mma_async.shape",),
    "mma.operands": ("control:p-operand-source",),
    "hot_loop.mix": ("control:mma-per-k-step",),  # e.g. MMAs per wgmma commit: the tile's N and K per k-step
    "loop.unroll": ("control:k-loop-unroll",),
    "exp.form": ("ptx:ex2.approx",),
    "fma.contraction": ("numerics:mul+add-separate",),
    "div.form": ("ptx:rcp.approx",),
}


def _ctas(value: Any) -> int | None:
    """The CTA count of a launch dimension ([x, y, z] or an int); None when it is not one."""
    dims = _ints(value)
    if not dims:
        return None
    n = 1
    for d in dims:
        n *= d
    return n


def _grid_persistent(value: Any, gpu: GpuTarget | None) -> bool | None:
    n = _ctas(value)
    return None if n is None or gpu is None else n <= gpu.sm_count


#: a row feature whose truth can be read off a row's values (``(value, gpu) -> bool``, None when it cannot be
#: told): when it is equally true, or equally false, of the reference's and the candidate's value, it is not
#: what the row's difference is about, and its concepts are not taken from that row. ``grid`` [132, 1, 1] vs
#: [1, 132, 1] on a 132-SM GPU: both kernels are persistent; what differs is the grid's shape (tile order).
FEATURE_TESTS = {
    "launch:grid<=sm_count": _grid_persistent,
}
#: a form token in a ``*.form`` row's value -> the feature that reveals it
FORM_FEATURES = {
    "tma": "sass:UTMALDG", "tma.store": "sass:UTMASTG", "cp.async": "ptx:cp.async.cg.shared.global",
    "ld.global": "ptx:ld.global", "st.global": "ptx:st.global", "wgmma": "ptx:wgmma.mma_async.sync.aligned",
    "mma.sync": "ptx:mma.sync.aligned", "fma": "ptx:fma.rn.f32", "hmma": "ptx:mma.sync.aligned",
}
KNOB_RE = re.compile(r"knobs?:\s*(.*)$")
NAME_RE = re.compile(r"\s*([a-z_][a-z0-9_]*)(?:\s*=\s*'([^']*)')?")


def construct_knobs(expression: str) -> list[tuple[str, str | None]]:
    """``"...; knobs: raster, swizzle"`` -> [("raster", None), ("swizzle", None)]; pinned values kept."""
    m = KNOB_RE.search(expression)
    if not m:
        return []
    out = []
    for part in m.group(1).split(","):
        n = NAME_RE.match(part)
        if not n:
            break
        out.append((n.group(1), n.group(2)))
        if part[n.end():].strip():  # prose after the name ends the list
            break
    return out


def _tokens(value: Any) -> set[str]:
    if isinstance(value, list | tuple | set):
        return {str(v) for v in value}
    return {str(value)} if value is not None else set()


def row_concepts(row, gpu: GpuTarget | None = None) -> list[tuple[str, str]]:
    """(concept, side) for a row; side is 'gain' (the reference shows it), 'lose' (only the candidate) or 'both'.

    A feature of :data:`FEATURE_TESTS` that holds alike on both sides of the row (with ``gpu`` where the test
    needs it) contributes no concept."""
    found: list[tuple[str, str]] = []
    if row.key.endswith((".form", "_form")) and row.key not in ROW_FEATURES:
        ref, cand = _tokens(row.reference), _tokens(row.candidate)
        for token in sorted(ref - cand):
            if token in FORM_FEATURES:
                found += [(c.name, "gain") for c in concepts_for_feature(FORM_FEATURES[token])]
        for token in sorted(cand - ref):
            if token in FORM_FEATURES:
                found += [(c.name, "lose") for c in concepts_for_feature(FORM_FEATURES[token])]
    for feature in ROW_FEATURES.get(row.key, ()):
        test = FEATURE_TESTS.get(feature)
        if test is not None:
            ref, cand = test(row.reference, gpu), test(row.candidate, gpu)
            if ref is not None and ref == cand:
                continue
        found += [(c.name, "both") for c in concepts_for_feature(feature)]
    seen, out = set(), []
    for item in found:
        if item[0] not in seen:
            seen.add(item[0])
            out.append(item)
    return out


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, list | tuple) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                         for v in value):
        return list(value)
    return None


#: a knob named per axis takes that axis of a row's [x, y, z] reference value (``cluster_n`` <- cluster[1])
AXIS_SUFFIX = {"_m": 0, "_n": 1}


def candidate_values(current: Any, default: Any, row, pinned: str | None, side: str,
                     axis: int | None = None) -> list:
    vals: list = []
    if pinned is not None:
        if side == "gain" and current != pinned:
            vals.append(pinned)
        elif side == "lose" and current == pinned and default != pinned:
            vals.append(default)
        return vals
    ref = _ints(row.reference)
    if isinstance(current, bool):
        # a boolean moves in the direction the row points: to the reference's value when the row states one
        # (never away from it), otherwise flipped
        if isinstance(row.reference, bool):
            if row.reference != current:
                vals.append(row.reference)
        else:
            vals.append(not current)
    elif isinstance(current, int):
        if ref and len(ref) == 1:
            vals.append(ref[0])
        elif ref and axis is not None and len(ref) > axis:
            vals.append(ref[axis])
        vals += [current * 2, current + 1, current - 1, current // 2]
    elif isinstance(current, list | tuple) and len(current) == 2 and all(isinstance(v, int) for v in current):
        a, b = current
        if ref and len(ref) >= 2:
            vals.append((ref[0], ref[1]))
        vals += [(a * 2, b), (a, b * 2), (a // 2, b), (a, b // 2), (b, a)]
    elif isinstance(current, str) and default != current:
        vals.append(default)
    out = []
    for v in vals:
        v = tuple(v) if isinstance(v, list) else v
        cur = tuple(current) if isinstance(current, list) else current
        if v != cur and v not in out and not (isinstance(v, int) and not isinstance(v, bool) and v < 1):
            out.append(v)
    return out


#: history outcomes that reject an edit (a verdict's or a build's reason code)
UNBUILDABLE = "unbuildable"
REJECTED = frozenset({"slower", "null", "below-floor", "numerics", UNBUILDABLE})


def _plain(value: Any) -> Any:
    """A knob value as JSON writes it (tuples as lists)."""
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _context(knobs: dict, names: Iterable[str]) -> tuple:
    return tuple(sorted((k, _hashable(knobs.get(k))) for k in names))


def blocked(history: Iterable, interacts: dict[str, set[str]]) -> tuple[set, set]:
    """From the campaign's history: (reverts, retries).

    ``reverts``: (knob, value) pairs an accepted knob edit moved a knob away from. ``retries``: (knob, value,
    context) of rejected knob edits, where context is the tried candidate's values of the knobs that
    interact with ``knob`` (``interacts``; every other knob for an unbuildable edit), as sorted (name, value)
    pairs."""
    reverts, retries = set(), set()
    for h in history:
        edit = h.get("edit") or {}
        if edit.get("kind") != "knob" or "knob" not in edit:
            continue
        knob = edit["knob"]
        if h.get("accepted"):
            reverts.add((knob, _hashable(edit.get("was"))))
        elif h.get("outcome") in REJECTED:
            knobs = h.get("knobs") or {}
            exact = h["outcome"] == UNBUILDABLE or edit.get("compound")  # a compound: its whole knob set
            others = [k for k in knobs if k != knob] if exact else interacts.get(knob, ())
            retries.add((knob, _hashable(edit.get("value")), _context(knobs, others)))
    return reverts, retries


def _unmovable(rule, state: dict, fixed: set) -> bool:
    """A known-partner ``rule`` none of whose partner knobs can move: each is set by the edit (``fixed``) or
    already at every value the rule offers."""
    if rule is None or rule.needs is None:
        return False
    return not any(knob not in fixed and knob in state and any(_hashable(v) != _hashable(state[knob]) for v in values)
                   for knob, values in rule.partners.items())


def _source_name(campaign) -> str:
    start = getattr(campaign, "start", None)
    return os.path.basename(str(start)) if start else "kernel"


def round_robin(per_row: list, rewrites: Mapping[int, list] | None = None) -> list[tuple[tuple, Proposal]]:
    """The edits of ranked rows, one cause at a time: every cause's best edit before any cause's second.

    ``per_row`` is ``[(row, [(identity, proposal), ...])]`` in rank order; a row whose ``cause`` is set joins
    the group of the cause row before it. A group's edits are its knob edits (the cause's own first, then its
    symptoms'), then the catalog's source rewrites aimed at its rows (``rewrites``: row index -> edits)."""
    rewrites = rewrites or {}
    groups: list[tuple[object, list, list]] = []  # (cause row, its knob edits, its source rewrites)
    for n, (row, edits) in enumerate(per_row):
        if not getattr(row, "cause", "") or not groups:
            groups.append((row, [], []))
        groups[-1][1].extend(edits)
        groups[-1][2].extend(rewrites.get(n, ()))
    # knobs before rewrites: causes whose rule's edit class is a knob first (stable: by rank within each class)
    groups.sort(key=lambda g: getattr(g[0], "edit", "knob") != "knob")
    flat = [knobs + sources for _, knobs, sources in groups]
    out: list[tuple[tuple, Proposal]] = []
    depth = max((len(g) for g in flat), default=0)
    for i in range(depth):
        out += [g[i] for g in flat if i < len(g)]
    return out


class KnobsProposer:
    name = "knobs"
    pure = True  # a function of the request: the loop may ask it early (its first edits lowered ahead)

    def __init__(self, campaign, knob_cls: type | None, catalog) -> None:
        self.target = campaign.target
        self.campaign = campaign
        self.knob_cls = knob_cls
        self.catalog = catalog
        self.deps = dependencies_of(knob_cls)

    def _spec_gpu(self, request: Request) -> tuple[KernelSpec | None, GpuTarget | None]:
        """The kernel spec and GPU record the plugin's can-implement predicate checks against."""
        c = self.campaign
        try:
            spec = KernelSpec(family=c.family, shape=dict(c.shape), dtype=c.dtype, language=self.target, knobs={})
        except (AttributeError, MosaicError, TypeError, ValueError):
            spec = None
        gpu = None
        try:
            if request.gpu:
                gpu = GpuTarget.from_json(request.gpu)
            elif getattr(c, "gpu", None):
                from mosaic.plugins import host

                gpu = host().get("gpus", c.gpu)
        except (MosaicError, KeyError, TypeError, ValueError):
            gpu = None
        return spec, gpu

    def _defaults(self, knobs: dict) -> dict:
        if self.knob_cls is not None and attrs.has(self.knob_cls):
            return {f.name: f.default for f in attrs.fields(self.knob_cls) if f.default is not attrs.NOTHING}
        return dict(knobs)

    def _valid(self, knobs: dict) -> bool:
        if self.knob_cls is None:
            return True
        try:
            self.knob_cls(**knobs)
        except (RecordError, TypeError, ValueError):
            return False
        return True

    def _meta(self, knob: str) -> dict:
        if self.knob_cls is None or not attrs.has(self.knob_cls):
            return {}
        field = attrs.fields_dict(self.knob_cls).get(knob)
        return dict(field.metadata) if field is not None else {}

    def _knobs_of(self, concept: str) -> list[tuple[str, str | None]]:
        if self.catalog is None or (concept, self.target) not in self.catalog.entries:
            return []
        construct = self.catalog.entry(concept, self.target).construct
        if construct is None or construct.analogue == "none":
            return []
        return construct_knobs(construct.expression)

    def interactions(self) -> dict[str, set[str]]:
        """knob -> the other knobs one construct of the target language names together with it, and those a knob
        class field's ``interacts`` metadata names (both ways)."""
        out: dict[str, set[str]] = {}
        for (_, language), entry in (self.catalog.entries.items() if self.catalog is not None else ()):
            if language != self.target or entry.construct is None or entry.construct.analogue == "none":
                continue
            names = [k for k, _ in construct_knobs(entry.construct.expression)]
            for k in names:
                out.setdefault(k, set()).update(n for n in names if n != k)
        if self.knob_cls is not None and attrs.has(self.knob_cls):
            for field in attrs.fields(self.knob_cls):
                for other in field.metadata.get("interacts", ()):
                    out.setdefault(field.name, set()).add(other)
                    out.setdefault(other, set()).add(field.name)
        return out

    def _concept_naming(self, knob: str) -> str | None:
        """The first catalog concept whose target construct names ``knob`` (None when none does)."""
        for (concept, language), entry in (self.catalog.entries.items() if self.catalog is not None else ()):
            if language == self.target and entry.construct is not None and entry.construct.analogue != "none" \
                    and knob in (k for k, _ in construct_knobs(entry.construct.expression)):
                return concept
        return None

    def _reach(self, row, predicts: dict, current: dict, spec, named: set) -> list[tuple[str, str, None, str]]:
        """(concept, side, pinned, knob) for the knobs the row's prediction says move it and no concept of the row
        names (``mosaic.proposers.predicted``: reach)."""
        fn = predicts.get(row.key)
        if fn is None or spec is None or self.knob_cls is None or not attrs.has(self.knob_cls):
            return []
        now = predict(fn, self.knob_cls, current, spec)
        out = []
        for field in attrs.fields(self.knob_cls):
            knob = field.name
            if knob in named or knob not in current:
                continue
            if any(predict(fn, self.knob_cls, {**current, knob: v}, spec) not in (None, now)
                   for v in field.metadata.get("values", ()) if v != current[knob]):
                out.append((self._concept_naming(knob) or f"predicted:{row.key}", "both", None, knob))
        return out

    def edits(self, request: Request) -> Iterable[Proposal]:
        defaults = self._defaults(dict(request.knobs))
        current = {**defaults, **dict(request.knobs)}
        interacts = self.interactions()
        reverts, retries = blocked(request.history, interacts)
        rows = list(request.rows)  # ranked: causes by expected cost, each followed by the rows it explains
        spec, gpu = self._spec_gpu(request)
        mapped = [(row, row_concepts(row, gpu)) for row in rows]
        support: dict[str, int] = {}
        for _, found in mapped:
            for concept, _ in found:
                support[concept] = support.get(concept, 0) + 1
        seen: set = set()
        # held back, in this order, after every other edit: single edits that build but still want a partner
        # (known-partner rules); edits that move a predicted row away from the reference; edits the CPU predicate
        # finds unbuildable with no compound that mends them (the build would refuse them: proposed last, not never)
        deferred: list[tuple[tuple, Proposal]] = []
        away: list[tuple[float, int, tuple, Proposal]] = []  # (predicted change, order, identity, proposal)
        refused: list[tuple[tuple, Proposal]] = []
        deps = self.deps if self.knob_cls is not None else None
        dep_interacts = {k: interacts.get(k, set()) | v for k, v in deps.interacting().items()} if deps else {}
        predicts = predictions_of(self.knob_cls)
        gauge = Gauge(predicts, self.knob_cls, spec, rows, current)
        per_row: list[tuple[object, list[tuple[tuple, Proposal]]]] = []
        for row, found in mapped:
            plan = [(concept, side, pinned, knob)
                    for concept, side in sorted(found, key=lambda item: -support[item[0]])
                    for knob, pinned in self._knobs_of(concept)]
            plan += self._reach(row, predicts, current, spec, {knob for _, _, _, knob in plan})
            ranked: list[tuple[float, int, tuple, Proposal]] = []  # (predicted change or 0, order, identity, proposal)
            for concept, side, pinned, knob in plan:
                if knob not in current:
                    continue
                meta = self._meta(knob)
                values = candidate_values(current[knob], defaults.get(knob), row, pinned, side,
                                          AXIS_SUFFIX.get(knob[-2:]))
                if pinned is None:
                    values += [v for v in meta.get("values", ()) if v != current[knob] and v not in values]
                for value in values:
                    implied = {k: v for k, v in (meta.get("implies") or {}).get(value, {}).items()
                               if k in current and current[k] != v}
                    new = {**current, knob: value, **implied}
                    if not self._valid(new):
                        continue
                    val = _hashable(value)
                    if (knob, val) in reverts:
                        continue
                    parts, wants, unbuildable = None, None, False
                    codes = violations(deps, self.knob_cls, new, spec, gpu) if deps is not None else None
                    if codes:
                        # unbuildable, or known to need a partner: the smallest buildable compound edit,
                        # keeping the knob (and what its value implies) as this edit sets it
                        fixed = {knob, *implied}
                        parts = complete(deps, self.knob_cls, new, fixed, spec, gpu)
                        if parts:
                            new = {**new, **{p["knob"]: p["value"] for p in parts}}
                        elif all(_unmovable(deps.rule(c), new, fixed) for c in codes):
                            # it builds but is known to want a partner that no change can give it (the edit
                            # undoes the partner itself): kept single, after every other edit
                            wants = codes
                        else:
                            # the predicate says it cannot build (a rule it reports, not a known partner it wants)
                            # and no compound of the rules' partners mends it: kept single, proposed last (the
                            # build decides); one that only misses a partner that does not fit here stays in place
                            unbuildable = any(deps.rule(c) is None or deps.rule(c).needs is None for c in codes)
                    context = dep_interacts.get(knob, ()) if parts else interacts.get(knob, ())
                    keyed = keyed_knobs(self.knob_cls, new)  # as the journal's history records knob sets
                    if (knob, val, _context(keyed, context)) in retries \
                            or (knob, val, _context(keyed, [k for k in keyed if k != knob])) in retries:
                        continue
                    identity = _hashable(new)
                    if any(identity == i for _, _, i, _ in ranked):
                        continue
                    edit = {"kind": "knob", "knob": knob, "value": list(value) if isinstance(value, tuple)
                            else value, "was": list(current[knob]) if isinstance(current[knob], tuple)
                            else current[knob], "concept": concept,
                            "row": {"layer": row.layer, "key": row.key, "rank": row.rank, "edit": row.edit,
                                    "reference": row.reference, "candidate": row.candidate}}
                    if implied:
                        edit["implies"] = implied
                    if parts:
                        edit["compound"] = True
                        edit["parts"] = [{"knob": knob, "value": edit["value"], "was": edit["was"]}] + [
                            {"knob": k, "value": _plain(v), "was": _plain(current[k])} for k, v in implied.items()] + [
                            {"knob": p["knob"], "value": _plain(p["value"]), "was": _plain(p["was"]), "rule": p["code"],
                             "why": (deps.rule(p["code"]).why if deps.rule(p["code"]) else "")}
                            for p in parts]
                    proposal = Proposal(True, request.parent, edit,
                                        {k: list(v) if isinstance(v, tuple) else v for k, v in new.items()})
                    if wants:
                        edit["violates"] = list(wants)
                        deferred.append((identity, proposal))
                        continue
                    if unbuildable:
                        edit["violates"] = list(codes)
                        refused.append((identity, proposal))
                        continue
                    change = gauge.change(new)
                    if change is not None:
                        edit["predicted"] = gauge.record(new, change)
                        if change > 0:
                            away.append((change, len(away), identity, proposal))
                            continue
                    ranked.append((min(change or 0.0, 0.0), len(ranked), identity, proposal))
            per_row.append((row, [(identity, proposal) for _, _, identity, proposal
                                  in sorted(ranked, key=lambda item: item[:2])]))
        per_row += [(row, []) for row in rows[len(per_row):]]
        rewrites = self._rewrites(request, rows, current)
        for identity, proposal in round_robin(per_row, rewrites):
            if identity not in seen:
                seen.add(identity)
                yield proposal
        held = deferred + [(identity, proposal) for _, _, identity, proposal in sorted(away, key=lambda a: a[:2])]
        for identity, proposal in held + refused:
            if identity not in seen:
                seen.add(identity)
                yield proposal

    def _rewrites(self, request: Request, rows: list, current: dict) -> dict[int, list[tuple[tuple, Proposal]]]:
        """Row index -> the catalog's source rewrites aimed at that row, applied to the parent's source (only a
        parent that is a source: a kernel file or an accepted source edit). A rewrite with nothing to edit in
        the source is stepped over; the build decides whether one that applies compiles."""
        if request.source is None:
            return {}
        from mosaic.rewrites import NotApplicable, apply_rewrite, registered, rewrites_for

        try:
            available = registered()
        except MosaicError:
            return {}
        name = _source_name(self.campaign)
        out: dict[int, list[tuple[tuple, Proposal]]] = {}
        for n, row in enumerate(rows):
            for rw in rewrites_for(row, self.target, available):
                try:
                    applied = apply_rewrite(rw, request.source, row)
                except NotApplicable:
                    continue
                edit = {"kind": "source", "origin": "rewrite", "rewrite": rw.name, "concept": rw.concept,
                        "name": name, "sha256": applied.sha256, "knobs": {}, "why": rw.summary,
                        "row": {"layer": row.layer, "key": row.key, "rank": row.rank, "edit": row.edit,
                                "reference": row.reference, "candidate": row.candidate}}
                knobs = {k: list(v) if isinstance(v, tuple) else v for k, v in current.items()}
                out.setdefault(n, []).append(
                    (("source", applied.sha256), Proposal(True, request.parent, edit, knobs, applied.text)))
        return out

    def propose(self, request: Request) -> list[Proposal]:
        return list(self.edits(request))
