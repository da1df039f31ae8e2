"""Knob dependencies as data: which knobs of a target language constrain which, and the smallest compound
edit that satisfies them.

A language plugin declares, beside its knob class, a :class:`Dependencies` record and attaches it to the
class as ``DEPENDENCIES`` (``GemmKnobs.DEPENDENCIES = Dependencies(...)``). It holds

* ``rules``: one :class:`Dependency` per constraint, each with a ``code``, the ``knobs`` it ties together and
  its ``partners`` (knob -> values that satisfy it, nearest first). A rule whose code the plugin's own
  predicate reports (CUTLASS's ``CUTLASS-EPILOGUE``: the epilogue must match the kernel schedule) is a
  *buildability* rule; a rule with a ``needs`` predicate is a *known partner*: the knobs build, but are
  known to want a partner (a ping-pong tile whose accumulators do not fit the registers spills);
* ``check``: the plugin's can-implement predicate, ``check(knobs_obj, spec, gpu) -> [Diagnostic]``, run on
  the CPU (no GPU, no compiler).

:func:`complete` searches, breadth first, the fewest partner changes that leave no rule violated. The
knobs the edit itself sets stay as it set them (a compound edit aimed at the tile row keeps the tile).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from mosaic.errors import RecordError
from mosaic.records import GpuTarget, KernelSpec


@attrs.frozen
class Dependency:
    """One constraint between knobs: ``code`` (the plugin's diagnostic code, or its own for a known
    partner), the ``knobs`` it ties together, ``partners`` (knob -> values that satisfy it, nearest first),
    ``why`` (one line), and for a known partner ``needs(knobs: dict) -> bool`` (True: a partner is needed)."""

    code: str
    knobs: tuple = attrs.field(converter=tuple)
    partners: Mapping = attrs.field(converter=lambda m: {k: tuple(v) for k, v in dict(m).items()})
    why: str = ""
    needs: Callable[[Mapping], bool] | None = attrs.field(default=None, eq=False)


@attrs.frozen
class Dependencies:
    """A knob class's dependency table and the plugin's can-implement predicate."""

    rules: tuple = attrs.field(converter=tuple)
    check: Callable[[Any, KernelSpec, GpuTarget], list] | None = attrs.field(default=None, eq=False)

    def rule(self, code: str) -> Dependency | None:
        return next((r for r in self.rules if r.code == code), None)

    def interacting(self) -> dict[str, set[str]]:
        """knob -> the knobs one rule names together with it."""
        out: dict[str, set[str]] = {}
        for r in self.rules:
            for k in r.knobs:
                out.setdefault(k, set()).update(n for n in r.knobs if n != k)
        return out


def dependencies_of(knob_cls: type | None) -> Dependencies | None:
    deps = getattr(knob_cls, "DEPENDENCIES", None)
    return deps if isinstance(deps, Dependencies) else None


def violations(deps: Dependencies, knob_cls: type, knobs: Mapping, spec: KernelSpec | None,
               gpu: GpuTarget | None) -> list[str] | None:
    """Codes of the rules ``knobs`` violate: the plugin's predicate (when a spec and GPU are known) and the
    known-partner rules; None when the knob class itself refuses them."""
    try:
        obj = knob_cls(**dict(knobs))
    except (RecordError, TypeError, ValueError):
        return None
    codes: list[str] = []
    if deps.check is not None and spec is not None and gpu is not None:
        found = deps.check(obj, attrs.evolve(spec, knobs=dict(knobs)), gpu)
        if any(d.code not in {r.code for r in deps.rules} for d in found):
            # a problem no rule can mend (dtype, arch, shape): the compound search cannot help
            return ["unmendable:" + ",".join(sorted(d.code for d in found))]
        codes += [d.code for d in found]
    codes += [r.code for r in deps.rules if r.needs is not None and r.needs(dict(knobs)) and r.code not in codes]
    return codes


def complete(deps: Dependencies, knob_cls: type, knobs: Mapping, fixed: set[str], spec: KernelSpec | None,
             gpu: GpuTarget | None, max_parts: int = 3) -> list[dict] | None:
    """The smallest list of partner changes ``[{knob, value, was, code}]`` after which ``knobs`` violate no
    rule (never changing a knob in ``fixed``); ``[]`` when none is needed; None when no such list of at most
    ``max_parts`` changes exists. Breadth first: fewer parts first, then rule order, then value order."""
    frontier: list[list[dict]] = [[]]
    seen: set = set()
    for _ in range(max_parts + 1):
        nxt: list[list[dict]] = []
        for parts in frontier:
            state = {**dict(knobs), **{p["knob"]: p["value"] for p in parts}}
            codes = violations(deps, knob_cls, state, spec, gpu)
            if codes is None or any(c.startswith("unmendable:") for c in codes):
                continue
            if not codes:
                return parts
            rule = deps.rule(codes[0])
            if rule is None:
                continue
            moved = fixed | {p["knob"] for p in parts}
            for knob, values in rule.partners.items():
                if knob in moved or knob not in state:
                    continue
                for value in values:
                    if value == state[knob]:
                        continue
                    new = parts + [{"knob": knob, "value": value, "was": state[knob], "code": rule.code}]
                    identity = tuple(sorted((p["knob"], repr(p["value"])) for p in new))
                    if identity not in seen:
                        seen.add(identity)
                        nxt.append(new)
        frontier = nxt
        if not frontier:
            return None
    return None


__all__ = ["Dependencies", "Dependency", "complete", "dependencies_of", "violations"]
