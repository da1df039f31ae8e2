"""Edit proposers of the convergence loop.

A proposer turns the ranked discrepancy rows of one beam member (``mosaic.lift.diff``) into edits, best
first; the loop takes the first one it has not tried. Two are built in — ``knobs`` (deterministic: row ->
catalog concept -> the target language's knob) and ``command`` (an external program, an agent, reading the
discrepancy report as JSON on stdin) — and plugins add more through ``register_proposers``.

Built-ins are registered *directly* (``builtin.register_proposers(register)`` called by :func:`proposers`,
the way ``mosaic.oracle.oracles`` adds the built-in oracles) rather than through an entry point of
mosaic-core: they then exist whenever core is importable — installed alone, from a source tree, or with
``MOSAIC_LOAD_PLUGINS=`` — and a plugin that registers the same name is a conflict reported by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from mosaic.errors import PluginError
from mosaic.records import Discrepancy, Proposer


@attrs.frozen
class Proposal:
    """One edit (``ok``) or one recorded rejection of what a proposer returned (``not ok``, with ``reason``).

    ``edit`` describes the change for the report (``{"kind": "knob", "knob", "value", "row", "concept"}`` or
    ``{"kind": "source", "name", "sha256", ...}``); ``knobs`` is the candidate's complete knob set; ``source``
    the full edited source text for source edits; ``parent`` the key of the kernel it edits.
    """

    ok: bool
    parent: str | None = None
    edit: Mapping | None = None
    knobs: Mapping | None = None
    source: str | None = None
    reason: str = ""
    done: bool = False  # the proposer has no further edit for this parent

    def to_json(self) -> dict:
        return {"ok": self.ok, "parent": self.parent, "edit": self.edit, "knobs": self.knobs,
                "source": self.source, "reason": self.reason, "done": self.done}

    @classmethod
    def from_json(cls, d: Mapping) -> Proposal:
        return cls(**{k: d.get(k) for k in ("ok", "parent", "edit", "knobs", "source")},
                   reason=d.get("reason") or "", done=bool(d.get("done")))


@attrs.frozen
class Request:
    """What a proposer sees: the campaign, the kernel to edit, its ranked rows and what was already tried.

    ``tried`` holds the keys of every candidate built so far; ``history`` every built edit of the campaign in
    step order, ``{step, key, parent, edit, knobs, outcome, accepted}`` (``mosaic.run.loop.proposer_history``:
    ``outcome`` is the verdict's or the build's reason code, ``accepted`` whether it became the incumbent).
    """

    campaign: Mapping
    parent: str
    knobs: Mapping
    rows: Sequence[Discrepancy]
    layers: Sequence
    incumbent: Mapping
    reference: Mapping
    tried: frozenset
    repair: Mapping | None = None
    history: Sequence[Mapping] = ()
    knob_fields: Mapping | None = None  # knob name -> default, from the target backend's knob class
    gpu: Mapping | None = None  # the campaign's GPU record (JSON), for the target's can-implement checks
    source: str | None = None  # the parent kernel's source text when it has one (a kernel file, a source candidate)

    def to_json(self) -> dict:
        return {"format": "mosaic-proposal-request", "version": 1, "campaign": dict(self.campaign),
                "parent": self.parent, "knobs": dict(self.knobs),
                "rows": [r.to_json() for r in self.rows],
                "layers": [{"name": n, "distance": d} for n, d in self.layers],
                "incumbent": dict(self.incumbent), "reference": dict(self.reference),
                "tried": sorted(self.tried), "repair": self.repair, "history": list(self.history),
                "knob_fields": dict(self.knob_fields) if self.knob_fields is not None else None,
                "source": self.source}


class EditProposer(Protocol):
    name: str

    def propose(self, request: Request) -> list[Proposal]: ...


def proposers() -> dict[str, Proposer]:
    """Built-in proposers plus those plugins register through ``register_proposers``."""
    from mosaic.plugins import host
    from mosaic.proposers import builtin

    found: dict[str, Proposer] = {}
    builtin.register_proposers(lambda item: found.__setitem__(item.name, item))
    for name, reg in host().registries["proposers"].items():
        if name in found:
            raise PluginError(f"proposer '{name}' is built into mosaic-core and registered again by "
                              f"{reg.distribution}")
        found[name] = reg.item
    return dict(sorted(found.items()))


def make_proposer(name: str, campaign: Any, knob_cls: type | None, catalog: Any) -> EditProposer:
    known = proposers()
    if name not in known:
        raise PluginError(f"unknown proposer '{name}'; known: {', '.join(known)}")
    return known[name].factory(campaign=campaign, knob_cls=knob_cls, catalog=catalog)
