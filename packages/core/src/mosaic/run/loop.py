"""The convergence loop (seeds/mosaicist.txt): capture, propose, verify, converge.

1. Capture the reference once (the workbench does it in its own process) and measure its noise from its own
   repeated runs (``mosaic.timing.measure_noise``: >= 5 interleaved self-pairs of blocks).
2. The naive translation in the target language (``start_knobs``) must build and pass the numerics gate;
   it is the first incumbent. Once it is built, a pure proposer's first edits for it go to the workbench's
   prefetch (lowered in the background while its gate and timing run).
3. Loop: diff the beam member against the reference -> ranked rows -> the proposer gives ONE edit (knobs
   before rewrites) -> build (an unbuildable setting is recorded and stepped over) -> numerics gate (a failing
   candidate goes back for repair, never compared or timed) -> time interleaved A B A B against the incumbent
   -> the roofline guard (no time below the physical floor of the problem on the GpuTarget) -> the one rule,
   :func:`mosaic.timing.accept`, with the measured noise -> a small beam keeps the best few. A rejected
   candidate that is closer in fingerprint but slower is kept in the beam (never the incumbent: the rule is
   unchanged) and expanded for the next ``BEAM_HOLD_STEPS`` steps, its children timed against the incumbent,
   so a structural step that is briefly slower is not lost.
4. Stop when the incumbent is within the reference's noise or faster (measured interleaved against the
   reference), when the budget (device minutes, timed candidates) is spent, or when no edit is left; list
   every remaining difference by name.

Every decision is a pure function of recorded measurements (:mod:`mosaic.run.decide`): the workbench
answers, the journal records the answer, and the same answers give the same verdicts — which is what
``mosaic run --resume`` (:mod:`mosaic.run.replay`) and ``mosaic run --offline`` (:mod:`mosaic.run.offline`)
rely on.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from mosaic.errors import BadInput
from mosaic.families import physical_floor_ns
from mosaic.fields import keyed_knobs
from mosaic.lift.causes import measured_costs, rerank
from mosaic.proposers import EditProposer, Proposal, Request
from mosaic.records import GpuTarget, KernelSpec
from mosaic.run.campaign import Campaign
from mosaic.run.decide import converged, decide, total_distance
from mosaic.run.journal import FORMAT, VERSION, Journal
from mosaic.run.replay import Recorded, ReplayBench
from mosaic.run.workbench import (
    REFERENCE,
    Built,
    Checked,
    Kernel,
    Timed,
    Workbench,
    YardstickRun,
    candidate_key,
    is_primary_yardstick,
    time_of,
)
from mosaic.timing import Noise, measure_noise

MAX_PROPOSER_FAILURES = 3  # consecutive rejected proposals before a beam member counts as exhausted
PREFETCH_AHEAD = 6  # untried proposals handed to a workbench's prefetch (live: lowered in the background)
BEAM_HOLD_STEPS = 2  # follow-up steps a closer-but-slower candidate is kept and expanded for (a structural step)


# -- state ---------------------------------------------------------------------------------------------------
@attrs.define
class Member:
    kernel: Kernel
    time: float
    distance: float
    layers: tuple
    rows: tuple
    failures: int = 0
    exhausted: bool = False
    hold: int = 0  # follow-up steps left: a closer-but-slower candidate kept (not the incumbent) and expanded

    def summary(self) -> dict:
        return {"key": self.kernel.key, "knobs": dict(self.kernel.spec.knobs), "time_ns": self.time,
                "distance": self.distance, "hold": self.hold}

@attrs.frozen
class Outcome:
    stop: str
    incumbent: str | None
    reference_ns: float | None
    incumbent_ns: float | None
    noise_ns: float | None
    timed: int
    steps: int
    remaining: tuple


def proposer_history(events: Iterable[Mapping]) -> list[dict]:
    """The campaign's history as the proposer sees it (``Request.history``), folded from its journal events.

    One entry per edit that was built (step 1 on; the naive translation is not an edit), in step order:
    ``{step, key, parent, edit, knobs, outcome, accepted, reason, gain_ns}``. ``outcome`` is the verdict's reason
    code (``faster``, ``closer-within-noise``, ``slower``, ``null``, ``below-floor``, ``numerics``) or the build's
    (``unbuildable``); ``accepted`` says whether the candidate became the incumbent; ``reason`` is what the
    verdict or the failed build said (None before either); ``gain_ns`` the incumbent's time minus the
    candidate's in the verdict's paired timing (None when it was not timed)."""
    entries: dict[int, dict] = {}
    for e in events:
        step = e.get("step")
        if not isinstance(step, int) or step < 1:
            continue
        if e["event"] == "proposal" and e.get("ok") and e.get("key"):
            entries[step] = {"step": step, "key": e["key"], "parent": e.get("parent"), "edit": e.get("edit"),
                             "knobs": e.get("knobs"), "outcome": None, "accepted": False, "reason": None,
                             "gain_ns": None}
        elif step in entries and e["event"] == "build" and not e.get("ok"):
            entries[step].update(outcome=e.get("reason_code") or "unbuildable", accepted=False,
                                 reason=e.get("reason"))
        elif step in entries and e["event"] == "verdict":
            t_c, t_i = e.get("t_candidate"), e.get("t_incumbent")
            gain = t_i - t_c if isinstance(t_c, int | float) and isinstance(t_i, int | float) else None
            entries[step].update(outcome=e.get("reason_code"), accepted=e.get("decision") == "accepted",
                                 reason=e.get("reason"), gain_ns=gain)
    return [entries[s] for s in sorted(entries)]


def full_knobs(knob_cls: type | None, knobs: Mapping) -> dict:
    """The complete knob set (defaults filled in by the target's knob class), as plain JSON values; fields keyed
    only when set (:data:`mosaic.fields.WHEN_SET`) are left out at their defaults."""
    def plain(v):
        return [plain(x) for x in v] if isinstance(v, list | tuple) else v

    if knob_cls is not None and attrs.has(knob_cls):
        try:
            obj = knob_cls(**dict(knobs))
        except (TypeError, ValueError) as exc:
            raise BadInput(f"knobs {dict(knobs)} are not valid for the target: {exc}", "start_knobs") from None
        return keyed_knobs(knob_cls, {k: plain(v) for k, v in attrs.asdict(obj, recurse=False).items()})
    return {k: plain(v) for k, v in dict(knobs).items()}


def _refusal(member, p: Proposal) -> str:
    """What identifies a refused proposal: its parent and its knobs."""
    return f"{p.parent or member.kernel.key} {sorted((str(k), repr(v)) for k, v in dict(p.knobs or {}).items())}"


class Loop:
    """One campaign's loop. ``lift`` turns a bundle path into a fingerprint; ``diff`` two into a DiffResult."""

    def __init__(self, campaign: Campaign, bench: Workbench, proposer: EditProposer, journal: Journal,
                 gpu: GpuTarget, knob_cls: type | None = None, *, lift: Callable | None = None,
                 diff: Callable | None = None, recorded: Recorded | None = None,
                 header: Mapping | None = None, progress: Callable[[str], None] | None = None):
        from mosaic.lift.diff import diff_fingerprints
        from mosaic.lift.inputs import lift_bundle

        self.c, self.journal, self.gpu, self.knob_cls = campaign, journal, gpu, knob_cls
        self.bench = ReplayBench(bench, recorded)
        self.recorded = recorded
        self.proposer = proposer
        self.lift = lift or (lambda path: lift_bundle(Path(path), gpu=gpu))
        self.diff = diff or diff_fingerprints
        self.header = dict(header or {})
        self.progress = progress or (lambda line: None)
        self.show_waits = progress is not None  # the wait for the proposer shown while it lasts (mosaic.progress)
        if self.show_waits:
            from mosaic.progress import choose_backend

            choose_backend(sys.stderr)  # a bad MOSAIC_PROGRESS is one line before the journal's first event
        self.fps: dict[str, Any] = {}
        self.tried: set[str] = set()
        self.refused: set[str] = set()  # (parent, knobs) of proposals the target's knob class refused
        self.events: list[dict] = []  # this run's journal events, for the proposer's history
        self.cost_s = 0.0
        self.timed = 0
        self.step = 0
        self.beam: list[Member] = []
        self.incumbent: Member | None = None
        self.repair: dict | None = None
        self.t_inc_vs_ref: tuple[float, float] | None = None
        self.yardsticks: list[YardstickRun] = []  # the yardsticks measured at the start, the first first

    # -- helpers -------------------------------------------------------------------------------------------
    def spec(self, language: str, knobs: Mapping) -> KernelSpec:
        return KernelSpec(family=self.c.family, shape=dict(self.c.shape), dtype=self.c.dtype, language=language,
                          knobs=dict(knobs))

    def fingerprint(self, key: str, bundle: str):
        if key not in self.fps:
            self.fps[key] = self.lift(bundle)
        return self.fps[key]

    def emit(self, event: str, **data) -> dict:
        record = self.journal.emit(event, **data)
        self.events.append(record)
        return record

    def budget_spent(self) -> str | None:
        if self.cost_s >= self.c.budget_min * 60:
            return f"budget: {self.cost_s / 60:.2f} of {self.c.budget_min:g} device minutes spent"
        if self.timed >= self.c.max_candidates:
            return f"budget: {self.timed} of {self.c.max_candidates} timed candidates spent"
        return None

    # -- the steps ------------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        c = self.c
        self.emit("campaign", format=FORMAT, version=VERSION, campaign=c.to_json(), gpu=self.gpu.to_json(),
                  workbench=self.bench.kind, proposer=c.proposer, **self.header)
        self.floor = physical_floor_ns(c.family, c.shape, c.dtype, self.gpu)
        self.bench.prefetch([self.naive_kernel()])  # a live workbench lowers it while the reference is captured
        ref = self.bench.capture_reference(self.spec(c.source, c.reference_knobs))
        self.noise: Noise = measure_noise(ref.noise_blocks)
        self.cost_s += ref.cost_s
        self.reference = ref.kernel
        # several GPUs (the Ray executor): each measured the reference's noise itself; a verdict uses the noise
        # of the GPU that timed it (both kernels of a comparison run on that one GPU)
        by_gpu = self.bench.noise_by_gpu()
        self.noise_by_gpu = {uuid: measure_noise(blocks) for uuid, blocks in by_gpu.items()}
        more = {"noise_by_gpu": {u: {"noise": n.to_json(), "noise_blocks": [list(b) for b in by_gpu[u]]}
                                 for u, n in self.noise_by_gpu.items()}} if by_gpu else {}
        self.emit("reference", key=REFERENCE, bundle=ref.kernel.bundle, noise=self.noise.to_json(),
                  noise_blocks=ref.noise_blocks, time_ns=self.noise.reference_time, floor_ns=self.floor,
                  cost_s=ref.cost_s, spec=ref.kernel.spec.to_json(), **more)
        self.inc_noise = self.noise
        self.progress(f"reference {c.source}: {self.noise.reference_time / 1e3:.2f} us, noise "
                      f"{self.noise.value / 1e3:.2f} us ({self.noise.relative:.2%}); floor {self.floor / 1e3:.1f} us")
        self.ref_fp = self.fingerprint(REFERENCE, ref.kernel.bundle)
        if c.yardstick:
            self.capture_yardsticks()
        stop = self.start()
        while stop is None:
            stop = self.iterate()
        return self.finish(stop)

    def capture_yardsticks(self) -> None:
        """Every yardstick of the family, each captured alone (the workbench runs each in its own process): one
        journal event each, ``yardstick`` with its blocks or ``yardstick-unmeasured`` with why it has none (a
        format it does not take, its library missing, the oracle failed it), and a progress line either way."""
        for y in self.bench.yardsticks(self.spec(self.c.source, {}), self.c.rounds):
            kind, data = y.event()
            self.emit(kind, **data)
            if y.measured:
                self.yardsticks.append(y)
                self.progress(f"yardstick {y.title} ({y.name}): {time_of(y.blocks) / 1e3:.2f} us, timed alone")
            else:
                self.progress(f"yardstick {y.title} ({y.name}) not measured ({y.reason_code}): {y.reason}")

    def naive_kernel(self) -> Kernel:
        spec = self.spec(self.c.target, full_knobs(self.knob_cls, self.c.start_knobs))
        if self.c.start:  # a start kernel file: the first candidate is its text, built like a source candidate
            kfile = start_file(self.c)
            spec = attrs.evolve(spec, name=kfile.name)
            return Kernel(candidate_key(spec, kfile.source), spec, kfile.source)
        return Kernel(candidate_key(spec), spec)

    @staticmethod
    def inherit(p: Proposal, member: Member) -> Proposal:
        """A knob-only edit of a kernel built from a source (a start file, an accepted source edit) keeps that
        source: the edit sets the file's knobs, it does not go back to the template."""
        if p.ok and p.source is None and member.kernel.source is not None:
            return attrs.evolve(p, source=member.kernel.source)
        return p

    def start(self) -> str | None:
        knobs = full_knobs(self.knob_cls, self.c.start_knobs)
        kernel = self.naive_kernel()
        self.emit("proposal", step=0, key=kernel.key, ok=True, parent=None,
                  edit={"kind": "naive", "why": "the naive first translation"}, knobs=knobs, reason="")
        self.tried.add(kernel.key)
        built, checked = self.build_and_check(kernel, 0, built_hook=self.prefetch_first)
        if not built.ok or not checked.passed:
            why = built.reason if not built.ok else checked.reason
            self.emit("verdict", key=kernel.key, step=0, decision="rejected",
                      reason_code="naive-unbuildable" if not built.ok else "numerics", reason=why)
            return f"naive-failed: the naive translation {'did not build' if not built.ok else 'failed numerics'}: {why}"
        kernel = attrs.evolve(kernel, bundle=built.bundle)
        timed = self.measure(self.reference, kernel)
        if timed.spot_failed:
            why = f"failed the spot-check of a timed run: {timed.spot_check.get('reason')}"
            self.emit("verdict", key=kernel.key, step=0, decision="rejected", reason_code="numerics", reason=why)
            return f"naive-failed: the naive translation failed numerics: {why}"
        member = self.member(kernel, timed.t_candidate)
        self.emit("verdict", key=kernel.key, step=0, decision="accepted", reason_code="naive",
                  reason="the first translation that passes the numerics gate becomes the incumbent",
                  t_candidate=timed.t_candidate, t_incumbent=None, d_candidate=member.distance, d_incumbent=None,
                  noise_ns=self.noise.value)
        self.set_incumbent(member, timed)
        self.beam = [member]
        self.emit("beam", members=[m.summary() for m in self.beam])
        return self.stop_reason()

    def build_and_check(self, kernel: Kernel, step: int,
                        built_hook: Callable[[Kernel, Any], None] | None = None) -> tuple[Built, Checked | None]:
        """Build, then gate. ``built_hook(kernel, diff)`` runs after a good build, before the gate."""
        built = self.bench.build(kernel)
        self.cost_s += built.cost_s
        layers, distance, d = (), None, None
        if built.ok:
            d = self.diff(self.ref_fp, self.fingerprint(kernel.key, built.bundle))
            layers, distance = d.layers, total_distance(d.layers)
        self.emit("build", **built.to_json(), step=step, layers=[list(x) for x in layers], distance=distance)
        if not built.ok:
            self.progress(f"step {step}: {kernel.key} {built.reason_code}: {built.reason}")
            return built, None
        kernel = attrs.evolve(kernel, bundle=built.bundle)
        if built_hook is not None:
            built_hook(kernel, d)
        checked = self.bench.check(kernel, built, self.reference)
        self.cost_s += checked.cost_s
        self.emit("numerics", **checked.to_json(), step=step)
        return built, checked

    def noise_for(self, timed: Timed) -> Noise:
        """The reference noise of the GPU that made this comparison (the campaign's when there is one GPU)."""
        uuid = (timed.gpu or {}).get("uuid") if isinstance(timed.gpu, Mapping) else None
        return self.noise_by_gpu.get(uuid, self.noise) if self.noise_by_gpu else self.noise

    def measure(self, against: Kernel, kernel: Kernel) -> Timed:
        timed = self.bench.time(against, kernel, self.c.rounds)
        self.cost_s += timed.cost_s
        self.emit("timed", **timed.to_json())
        return timed

    def member(self, kernel: Kernel, t: float) -> Member:
        d = self.diff(self.ref_fp, self.fingerprint(kernel.key, kernel.bundle))
        return Member(kernel, t, total_distance(d.layers), d.layers, d.rows)

    def set_incumbent(self, member: Member, timed_vs_ref: Timed | None = None) -> None:
        self.incumbent = member
        if timed_vs_ref is None or timed_vs_ref.against != REFERENCE:
            timed_vs_ref = self.measure(self.reference, member.kernel)
        self.t_inc_vs_ref = (timed_vs_ref.t_candidate, timed_vs_ref.t_incumbent)
        self.inc_noise = self.noise_for(timed_vs_ref)
        self.emit("incumbent", key=member.kernel.key, knobs=dict(member.kernel.spec.knobs), time_ns=member.time,
                  distance=member.distance, t_vs_reference=list(self.t_inc_vs_ref))
        self.progress(f"incumbent {member.kernel.key}: {self.t_inc_vs_ref[0] / 1e3:.2f} us vs reference "
                      f"{self.t_inc_vs_ref[1] / 1e3:.2f} us")

    def stop_reason(self) -> str | None:
        t_inc, t_ref = self.t_inc_vs_ref
        if converged(t_inc, t_ref, self.inc_noise.value):
            return "converged: the incumbent is within the reference's noise or faster"
        spent = self.budget_spent()
        if spent:
            return spent
        if all(m.exhausted for m in self.beam):
            return "exhausted: no edit is left for any beam member"
        return None

    def request(self, member: Member) -> Request:
        fields = None
        if self.knob_cls is not None and attrs.has(self.knob_cls):
            fields = {f.name: (list(f.default) if isinstance(f.default, tuple) else f.default)
                      for f in attrs.fields(self.knob_cls) if f.default is not attrs.NOTHING}
        history = tuple(proposer_history(self.events))
        gap = (self.t_inc_vs_ref[0] - self.t_inc_vs_ref[1]) if self.incumbent is not None else None
        rows = rerank(member.rows, measured_costs(history, gap))  # causes the campaign measured: their cost
        return Request(campaign=self.c.to_json(), parent=member.kernel.key, knobs=dict(member.kernel.spec.knobs),
                       rows=rows, layers=member.layers, incumbent=(self.incumbent or member).summary(),
                       reference={"key": REFERENCE, "language": self.c.source, "knobs": dict(self.c.reference_knobs),
                                  "time_ns": self.noise.reference_time, "noise_ns": self.noise.value},
                       tried=frozenset(self.tried), repair=self.repair, history=history,
                       knob_fields=fields, gpu=self.gpu.to_json(), source=member.kernel.source)

    def prefetch_first(self, kernel: Kernel, d) -> None:
        """The naive translation is built: hand the first step's candidates to the workbench's prefetch now,
        while the naive's gate and timing run (their lowerings would otherwise start only after them). Only
        for a proposer that says it is ``pure`` (a function of the request: ``knobs``), since the loop asks it
        again at step 1 with the same request (same rows, no history); never for a recorded run."""
        if not getattr(self.proposer, "pure", False) or self.recorded is not None or d is None:
            return
        member = Member(kernel, float("nan"), total_distance(d.layers), d.layers, d.rows)
        self.prefetch_proposals([self.inherit(p, member) for p in self.proposer.propose(self.request(member))])

    def prefetch_proposals(self, proposals) -> None:
        """Hand the first :data:`PREFETCH_AHEAD` untried candidates of ``proposals`` to the workbench's prefetch."""
        ahead: dict[str, Kernel] = {}
        for p in proposals:
            if len(ahead) >= PREFETCH_AHEAD:
                break
            if p.ok:
                try:
                    spec = self.spec(self.c.target, full_knobs(self.knob_cls, p.knobs or {}))
                except BadInput:
                    continue
                key = candidate_key(spec, p.source)
                if key not in self.tried:
                    ahead.setdefault(key, Kernel(key, spec, p.source))
        self.bench.prefetch(list(ahead.values()))

    def next_proposal(self, member: Member) -> Proposal:
        rec = self.recorded.proposals.get(self.step) if self.recorded else None
        if rec is not None:
            return Proposal(rec["ok"], rec["parent"], rec.get("edit"), rec.get("knobs"), rec.get("source"),
                            rec.get("reason") or "", bool(rec.get("done")))
        request = self.request(member)
        from mosaic.progress import Wait

        with Wait(f"the proposer '{self.c.proposer}' for step {self.step} (parent {member.kernel.key})",
                  quiet=not self.show_waits):
            proposals = [self.inherit(p, member) for p in self.proposer.propose(request)]
        self.prefetch_proposals(proposals)
        for p in proposals:
            if not p.ok:
                return p
            try:
                key = candidate_key(self.spec(self.c.target, full_knobs(self.knob_cls, p.knobs)), p.source)
            except BadInput:
                if _refusal(member, p) in self.refused:
                    continue  # recorded once already; the proposer's next edit
                return p  # iterate() records it as refused ("invalid knobs: ..."); the campaign goes on
            if key not in self.tried:
                return p
        return Proposal(False, member.kernel.key, reason="no untried edit for this kernel", done=True)

    def iterate(self) -> str | None:
        member = next((m for m in self.beam if m.hold > 0 and not m.exhausted), None) \
            or next(m for m in self.beam if not m.exhausted)
        if member.hold > 0:
            member.hold -= 1
        self.step += 1
        step = self.step
        p = self.inherit(self.next_proposal(member), member)
        key = None
        reason = p.reason
        if p.ok:
            try:
                knobs = full_knobs(self.knob_cls, p.knobs or {})
            except BadInput as exc:
                self.refused.add(_refusal(member, p))
                p, reason = attrs.evolve(p, ok=False), f"invalid knobs: {exc.what}"
            else:
                spec = self.spec(self.c.target, knobs)
                key = candidate_key(spec, p.source)
                if key in self.tried:
                    p, reason = attrs.evolve(p, ok=False), f"already tried ({key})"
        self.emit("proposal", step=step, key=key, ok=p.ok, parent=p.parent or member.kernel.key, edit=p.edit,
                  knobs=(knobs if p.ok else p.knobs), source=p.source, reason=reason, done=p.done)
        if not p.ok:
            member.failures += 1
            if p.done or member.failures >= MAX_PROPOSER_FAILURES:
                member.exhausted = True
            self.progress(f"step {step}: proposal rejected: {reason}")
            return self.stop_reason()
        member.failures = 0
        kernel = Kernel(key, spec, p.source)
        self.tried.add(key)
        self.repair = None
        built, checked = self.build_and_check(kernel, step)
        if not built.ok:
            return self.stop_reason()
        kernel = attrs.evolve(kernel, bundle=built.bundle)
        if not checked.passed and not checked.judged:
            # the budget ran out with the gate in flight: no verdict on the kernel (not a numerics failure: the
            # proposer may offer it again if the campaign is resumed with more budget)
            self.emit("verdict", key=key, step=step, decision="unjudged", reason_code="budget", reason=checked.reason)
            self.progress(f"step {step}: {key} not judged: {checked.reason}")
            return self.stop_reason()
        if not checked.passed:
            self.repair = {"key": key, "knobs": knobs, "edit": p.edit, "reason": checked.reason}
            self.emit("verdict", key=key, step=step, decision="rejected", reason_code="numerics",
                      reason=f"failed the numerics gate (never timed): {checked.reason}")
            self.progress(f"step {step}: {key} failed numerics: {checked.reason}")
            return self.stop_reason()
        inc = self.incumbent
        timed = self.measure(inc.kernel, kernel)
        self.timed += 1
        if timed.spot_failed:  # the outputs of a timed run are not the oracle's: a kernel that differs when timed
            why = (f"failed the spot-check of a timed run (round {timed.spot_check.get('round')}): "
                   f"{timed.spot_check.get('reason')}")
            self.repair = {"key": key, "knobs": knobs, "edit": p.edit, "reason": why}
            self.emit("verdict", key=key, step=step, decision="rejected", reason_code="numerics", reason=why)
            self.progress(f"step {step}: {key} {why}")
            return self.stop_reason()
        cand = self.member(kernel, timed.t_candidate)
        # the incumbent's distance is its own; its time is the one measured in this session
        noise = self.noise_for(timed)
        dec = decide(timed.t_candidate, timed.t_incumbent, cand.distance, inc.distance, noise.value, self.floor)
        where = {"gpu": timed.gpu.get("uuid")} if self.noise_by_gpu and isinstance(timed.gpu, Mapping) else {}
        self.emit("verdict", key=key, step=step, decision="accepted" if dec.accepted else "rejected",
                  reason_code=dec.reason_code, reason=dec.reason, t_candidate=timed.t_candidate,
                  t_incumbent=timed.t_incumbent, d_candidate=cand.distance, d_incumbent=inc.distance,
                  noise_ns=noise.value, **where, closer_but_slower=dec.closer_but_slower, edit=p.edit,
                  parent=p.parent, against=inc.kernel.key)
        self.progress(f"step {step}: {key} {'ACCEPTED' if dec.accepted else 'rejected'} ({dec.reason_code}): "
                      f"{timed.t_candidate / 1e3:.2f} us vs {timed.t_incumbent / 1e3:.2f} us")
        if dec.reason_code == "below-floor":
            return self.stop_reason()
        if dec.accepted:
            self.set_incumbent(cand)
        if dec.closer_but_slower and not dec.accepted:
            cand.hold = BEAM_HOLD_STEPS
        pool = [m for m in self.beam if m.kernel.key != (cand.kernel.key)] + [cand]
        inc_key = self.incumbent.kernel.key
        pool.sort(key=lambda m: (m.kernel.key != inc_key, m.hold <= 0, m.time, m.distance, m.kernel.key))
        self.beam = pool[: self.c.beam]
        self.emit("beam", members=[m.summary() for m in self.beam])
        return self.stop_reason()

    def pair_yardsticks(self) -> dict:
        """The final incumbent timed against each measured yardstick in interleaved rounds (A B A B, one process
        each), so the fractions and TFLOP/s the report prints compare two kernels in one thermal and power state:
        the yardsticks' own captures ran once, alone, at the start, and a power-capped GPU (8192^3 GEMMs on an
        H200 run at its 700 W cap) moves a kernel's time by several percent between moments. The stop event's
        fields: ``yardsticks_paired`` (every pairing: key, yardstick, name, t_yardstick_ns, t_incumbent_ns) and, for
        the first yardstick, ``yardstick_paired`` (as campaigns have always recorded it). ``{}`` when the campaign
        has no yardstick, none was measured, or the workbench cannot pair (a recording without it); a yardstick
        whose pairing was not measured is left out of the list, and said."""
        if not self.c.yardstick or self.incumbent is None:
            return {}
        pairs: list[dict] = []
        first = None
        for y in self.yardsticks:
            timed = self.bench.pair_yardstick(self.incumbent.kernel, self.c.rounds, y.key)
            if timed is None:
                self.progress(f"yardstick {y.title} ({y.name}): no pairing with the incumbent")
                continue
            self.cost_s += timed.cost_s
            self.emit("timed", **timed.to_json())
            # the yardstick is the timing's candidate, the final incumbent its incumbent (timed first)
            self.progress(f"yardstick {y.title} paired with the incumbent {self.incumbent.kernel.key}: "
                          f"{timed.t_candidate / 1e3:.2f} us vs {timed.t_incumbent / 1e3:.2f} us "
                          f"({timed.t_candidate / timed.t_incumbent:.1%}), interleaved")
            pair = {"t_yardstick_ns": timed.t_candidate, "t_incumbent_ns": timed.t_incumbent}
            pairs.append({"key": y.key, "yardstick": y.name, "name": y.title, **pair})
            if is_primary_yardstick(y.key):
                first = pair
        out: dict = {"yardstick_paired": first} if first is not None else {}
        return {**out, "yardsticks_paired": pairs} if pairs else out

    def finish(self, stop: str) -> Outcome:
        remaining: list = []
        if self.incumbent is not None:
            fp = self.fingerprint(self.incumbent.kernel.key, self.incumbent.kernel.bundle)
            remaining = [r.to_json() for r in self.diff(self.ref_fp, fp).rows]
        t_inc, t_ref = self.t_inc_vs_ref if self.t_inc_vs_ref else (None, None)
        paired = self.pair_yardsticks()
        unused = getattr(self.bench.inner, "ahead_unused_s", None)  # several GPUs: work evaluated ahead, unused
        unused = unused() if unused is not None else None
        more = {"ahead_unused_cost_s": round(unused, 3)} if unused is not None else {}
        self.emit("stop", **more, stop=stop.split(":")[0], reason=stop,
                  incumbent=self.incumbent.kernel.key if self.incumbent else None,
                  incumbent_knobs=dict(self.incumbent.kernel.spec.knobs) if self.incumbent else None,
                  t_incumbent_ns=t_inc, t_reference_ns=t_ref, noise_ns=self.noise.value, timed=self.timed,
                  steps=self.step, cost_s=self.cost_s, remaining=remaining, **paired)
        self.progress(f"stop: {stop}")
        return Outcome(stop.split(":")[0], self.incumbent.kernel.key if self.incumbent else None, t_ref, t_inc,
                       self.noise.value, self.timed, self.step, tuple(remaining))


def campaign_tools(campaign: Campaign, gpu_record: Mapping | None = None):
    """GPU record, the target's knob class (None when the language is not installed) and the catalog."""
    from mosaic.catalog import catalog_from_host
    from mosaic.plugins import host

    h = host()
    gpu = GpuTarget.from_json(gpu_record) if gpu_record else h.get("gpus", campaign.gpu)
    knob_cls = None
    langs = h.items("languages")
    if getattr(campaign, "start", None):  # the start kernel file's own knob class (read from its contract)
        from mosaic.kernel_files import knob_class

        knob_cls = knob_class(start_file(campaign))
    elif campaign.target in langs and langs[campaign.target].backend is not None:
        knob_cls = langs[campaign.target].backend.knobs(campaign.family)
    return gpu, knob_cls, catalog_from_host(h)


def start_file(campaign: Campaign):
    """The campaign's start kernel file (``--start``): its contract, built by the target language."""
    from mosaic.kernel_files import check_campaign_file

    return check_campaign_file(campaign.start, campaign.target, campaign.family, "start")


def run_campaign(campaign: Campaign, bench: Workbench, journal: Journal, gpu_record: Mapping | None = None,
                 recorded: Recorded | None = None, header: Mapping | None = None, quiet: bool = False,
                 proposer: EditProposer | None = None) -> Outcome:
    """Run the loop with the installed plugins' GPU record, knob class and proposer (or ``proposer``, which
    stands in for the campaign's); then close the journal and the workbench (the live one ends its
    background lowerings)."""
    from mosaic.proposers import make_proposer

    gpu, knob_cls, catalog = campaign_tools(campaign, gpu_record)
    if proposer is None:
        proposer = make_proposer(campaign.proposer, campaign, knob_cls, catalog)
    loop = Loop(campaign, bench, proposer, journal, gpu, knob_cls, recorded=recorded, header=header,
                progress=None if quiet else stderr_progress)
    try:
        return loop.run()
    finally:
        journal.close()
        close = getattr(bench, "close", None)
        if close is not None:
            close()


def stderr_progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


__all__ = ["Loop", "Member", "Outcome", "campaign_tools", "full_knobs", "proposer_history", "run_campaign",
           "stderr_progress"]
