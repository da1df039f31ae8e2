"""Answers already recorded: a journal's measurements and proposals, replayed before the real workbench is asked.

``mosaic run --resume DIR`` replays DIR's journal (measurements and proposals); ``mosaic run --offline DIR``
replays only the proposals of DIR's journal and reads the measurements back from the bundles.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from mosaic.proposers import Proposal, Request
from mosaic.records import KernelSpec
from mosaic.run.workbench import (
    LEGACY_YARDSTICK_KEYS,
    REFERENCE,
    YARDSTICK,
    Built,
    Checked,
    Kernel,
    ReferenceCapture,
    Timed,
    Workbench,
    YardstickRun,
)


class Recorded:
    """Answers already in a journal (resume): measurements by key, proposals by step.

    ``bundles``: the campaign's bundles directory (a live campaign's ``DIR/bundles``, an offline one's
    ``source_dir/bundles``). A bundle path the journal recorded (the reference's, a build's) is read only there,
    by its name: a journal cannot send a resume to read a bundle outside the campaign (and a campaign directory
    that was moved resumes where it is)."""

    def __init__(self, events: list[dict], measurements: bool = True, bundles: str | os.PathLike | None = None):
        self.proposals = {e["step"]: e for e in events if e["event"] == "proposal"}
        if not measurements:  # offline re-decision: proposals from the journal, measurements from the bundles
            events = []
        if bundles is not None:
            events = [_rerooted(e, Path(bundles)) if e["event"] in ("reference", "build") else e for e in events]
        self.reference = next((e for e in events if e["event"] == "reference"), None)
        self.yardstick = next((e for e in events if e["event"] == "yardstick"), None)
        #: every yardstick the journal recorded at the start, measured or not, in its order
        self.yardsticks = [YardstickRun.from_event(e) for e in events
                           if e["event"] in ("yardstick", "yardstick-unmeasured")]
        self.builds = {e["key"]: e for e in events if e["event"] == "build"}
        self.checks = {e["key"]: e for e in events if e["event"] == "numerics"}
        self.times = {(e["key"], e["against"]): e for e in events if e["event"] == "timed"}


def _rerooted(event: dict, bundles: Path) -> dict:
    """``event`` with its recorded ``bundle`` path moved into ``bundles`` (by name; checked there, never a link)."""
    from mosaic import safe_paths
    from mosaic.errors import BadInput

    recorded = event.get("bundle")
    if not isinstance(recorded, str):
        return event
    name = PurePosixPath(recorded.replace("\\", "/")).name
    if not name.endswith(".bundle") or name == ".bundle":
        raise BadInput(f"the journal's {event['event']} event names the bundle {recorded[:120]!r}, which is no "
                       "bundle of this campaign", str(bundles))
    path = bundles / name
    safe_paths.inside(bundles.parent, path, safe_paths.BUNDLES_INSIDE)
    return {**event, "bundle": str(path)}


class ReplayBench:
    """A workbench that answers from the journal where it can and asks the real one for the rest."""

    def __init__(self, inner: Workbench, recorded: Recorded | None):
        self.inner, self.rec = inner, recorded
        self.kind = inner.kind

    def capture_reference(self, spec: KernelSpec) -> ReferenceCapture:
        e = self.rec.reference if self.rec else None
        if e is not None:
            return ReferenceCapture(Kernel(REFERENCE, spec, None, e["bundle"]), e["noise_blocks"], e["cost_s"])
        return self.inner.capture_reference(spec)

    def build(self, kernel: Kernel) -> Built:
        e = self.rec.builds.get(kernel.key) if self.rec else None
        if e is not None:
            return Built(e["key"], e["ok"], e["reason"], e["reason_code"], e["bundle"], e["cost_s"])
        return self.inner.build(kernel)

    def check(self, kernel: Kernel, built: Built, reference: Kernel) -> Checked:
        e = self.rec.checks.get(kernel.key) if self.rec else None
        if e is not None:
            return Checked(e["key"], e["passed"], e["reason"], e["cost_s"], judged=e.get("judged", True))
        return self.inner.check(kernel, built, reference)

    def time(self, incumbent: Kernel, kernel: Kernel, rounds: int) -> Timed:
        e = self.rec.times.get((kernel.key, incumbent.key)) if self.rec else None
        if e is not None:
            return Timed.from_json(e)
        return self.inner.time(incumbent, kernel, rounds)

    def noise_by_gpu(self) -> dict:
        """The reference's noise blocks per GPU UUID, when several GPUs measured it (else empty)."""
        e = self.rec.reference if self.rec else None
        if e is not None:
            return {u: v["noise_blocks"] for u, v in (e.get("noise_by_gpu") or {}).items()}
        fn = getattr(self.inner, "noise_by_gpu", None)
        return dict(fn()) if fn is not None else {}

    def yardstick(self, spec: KernelSpec, rounds: int):
        if self.rec and self.rec.yardstick is not None:
            return self.rec.yardstick["blocks"]
        return self.inner.yardstick(spec, rounds)

    def yardsticks(self, spec: KernelSpec, rounds: int) -> list[YardstickRun]:
        """Every yardstick of the campaign, measured or not. A journal that recorded the reference answers from
        its own yardstick events, however many it holds (one, from before every yardstick was captured, or none),
        since the workbench of a resumed run captured nothing at the start; else the real workbench (its
        ``yardsticks``, or, a workbench that knows only the first, ``yardstick``)."""
        if self.rec and self.rec.reference is not None:
            return list(self.rec.yardsticks)
        fn = getattr(self.inner, "yardsticks", None)
        if fn is not None:
            return list(fn(spec, rounds))
        blocks = self.inner.yardstick(spec, rounds)
        if not blocks:
            return []
        from mosaic.families import first_yardstick

        first = first_yardstick(spec.family)
        return [YardstickRun(YARDSTICK, first.name, first.title or first.name, blocks)]

    def pair_yardstick(self, kernel: Kernel, rounds: int, key: str = YARDSTICK) -> Timed | None:
        """The yardstick ``key`` timed against the incumbent: the journal's record, else the real workbench's."""
        e = None
        keys = (key, *LEGACY_YARDSTICK_KEYS) if key == YARDSTICK else (key,)  # a journal from before the rename
        for k in keys if self.rec else ():
            e = e or self.rec.times.get((k, kernel.key))
        if e is not None:
            return Timed.from_json(e)
        fn = getattr(self.inner, "pair_yardstick", None)
        if fn is None:
            return None
        return fn(kernel, rounds) if key == YARDSTICK else fn(kernel, rounds, key)

    def prefetch(self, kernels) -> None:
        """Hand kernels the loop will probably build soon to a workbench that can start early (optional)."""
        fn = getattr(self.inner, "prefetch", None)
        if fn is not None:
            fn([k for k in kernels if not (self.rec and k.key in self.rec.builds)])


class RecordedOnly:
    """The proposer of a run that must not run its campaign's proposer (``--offline`` of a campaign whose
    proposer runs a program, ``--resume`` without the user's consent): past the recorded proposals, every
    beam member is done, so the campaign ends ``exhausted`` and nothing is run."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason

    def propose(self, request: Request) -> list[Proposal]:
        return [Proposal(False, request.parent, reason=self.reason, done=True)]
