"""Offline re-decision (``mosaic run --offline DIR``): a finished campaign decided again from its bundles.

:class:`OfflineWorkbench` answers every question of the loop from the bundles of ``DIR/bundles`` (written by
the live workbench, in the layout :mod:`mosaic.run.workbench` describes) — on any machine, with no GPU,
nothing built or run. When DIR holds a journal its recorded proposals are replayed
(:class:`~mosaic.run.replay.Recorded` without measurements) and :func:`compare_verdicts` lists every verdict
that did not come out the same. Only the bundles inside DIR are read (:func:`campaign_bundles`: ``bundles/`` or
a bundle that is a symlink is refused), and a resumed re-decision reads its header's ``source_dir`` only when the
bundles there are the ones it recorded (:func:`recorded_source`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mosaic.errors import BadInput, BundleError
from mosaic.records import KernelSpec
from mosaic.run.workbench import (
    REFERENCE,
    YARDSTICK,
    Built,
    Checked,
    Kernel,
    ReferenceCapture,
    Timed,
    YardstickRun,
    blocks_of,
    is_primary_yardstick,
    is_yardstick,
)


class OfflineWorkbench:
    """Answers every question from the bundles of ``source_dir/bundles`` (no GPU, nothing is built or run)."""

    kind = "offline"

    def __init__(self, source_dir: str | os.PathLike, family: str, dtype: str, out_dtype: str | None = None):
        from mosaic.bundle import load_bundle

        self.dir = Path(source_dir)
        self.family, self.dtype, self.out_dtype = family, dtype, out_dtype
        root = self.dir / "bundles"
        paths = campaign_bundles(self.dir)
        self.by_key: dict[str, Any] = {}
        #: the yardsticks' bundles by key (the first's under ``yardstick`` whatever key it recorded: ``cublas``
        #: in campaigns from before the rename), one each
        self.yardstick_bundles: dict[str, Any] = {}
        self.reference_bundle = None
        self.gpu_references: list = []  # reference-gpu<slot>.bundle: the reference on the other GPUs
        for path in paths:
            try:
                b = load_bundle(path)
            except BundleError as exc:  # a tampered bundle is named
                if exc.where and str(path) in exc.where:
                    raise
                raise BundleError(exc.what, f"{path}: {exc.where}" if exc.where else str(path)) from None
            meta = b.manifest.get("mosaic_run")
            if not isinstance(meta, Mapping) or "key" not in meta:
                continue
            _check_meta(meta, path)
            _check_capture(b.manifest, path)
            b.manifest["mosaic_run"] = {**meta, "build": _build_of(b.manifest, meta)}
            role = meta.get("role")
            if role == "reference" and self.reference_bundle is not None:  # one: a second is never silently preferred
                raise BundleError(f"two bundles claim the reference's role (mosaic_run.role = 'reference'): "
                                  f"{Path(self.reference_bundle.root).name} and {path.name}; a campaign records one",
                                  str(root))
            if role == "yardstick":  # one bundle per yardstick
                key = YARDSTICK if is_primary_yardstick(meta["key"]) else meta["key"]
                held = self.yardstick_bundles.get(key)
                if held is not None:
                    what = "the yardstick's role (mosaic_run.role = 'yardstick')" if key == YARDSTICK else \
                        f"the yardstick {key!r} (mosaic_run.key)"
                    raise BundleError(f"two bundles claim {what}: {Path(held.root).name} and {path.name}; a "
                                      "campaign records one", str(root))
                if not is_yardstick(key):
                    raise BundleError(f"mosaic_run.key {key[:80]!r} of a yardstick must be 'yardstick' or "
                                      "'yardstick-<name>'", str(path / "manifest.json"))
                self.yardstick_bundles[key] = b
                continue
            if role == "reference-gpu":
                self.gpu_references.append(b)
                continue
            if role == "reference":
                self.reference_bundle = b
            if meta["key"] in self.by_key:
                raise BundleError(f"two bundles record the kernel {meta['key'][:80]!r} (mosaic_run.key): "
                                  f"{Path(self.by_key[meta['key']].root).name} and {path.name}", str(root))
            self.by_key[meta["key"]] = b
        if self.reference_bundle is None:
            raise BadInput("no reference bundle (manifest mosaic_run.role = 'reference') among the bundles",
                           str(root))
        #: what a journal header records of these bundles (``source_bundles``), checked on resume
        self.fingerprint = bundles_fingerprint(paths)
        self._inputs = None

    def _timings(self, b) -> dict:
        data = b.read_json("timings") or {}
        if not isinstance(data, Mapping):
            raise BundleError("timings must be a JSON object", str(b.root))
        try:
            blocks = blocks_of(data.get("blocks"))
        except (KeyError, TypeError):
            blocks = None
        if blocks is None or not all(_run_times(x) for x in blocks):
            raise BundleError("timings.json 'blocks' must be lists of per-run times (ns)", str(b.root))
        sessions = data.get("sessions") or []
        for i, x in enumerate(sessions if isinstance(sessions, list) else []):
            problem = _gpu_problem(x.get("gpu")) if isinstance(x, Mapping) else None
            if problem:
                raise BundleError(f"timings.json sessions[{i}].gpu {problem}", str(b.root))
        if not isinstance(sessions, list) or not all(
                isinstance(x, Mapping) and isinstance(x.get("against"), str) and _blocks(x.get("incumbent_blocks"))
                and _blocks(x.get("candidate_blocks")) and isinstance(x.get("order", "ABAB"), str) for x in sessions):
            raise BundleError("timings.json 'sessions' must each name 'against' and hold incumbent_blocks and "
                              "candidate_blocks", str(b.root))
        return {**data, "blocks": blocks, "sessions": sessions}

    def bundle_path(self, key: str) -> str | None:
        b = self.by_key.get(key)
        return str(b.root) if b is not None else None

    def capture_reference(self, spec: KernelSpec) -> ReferenceCapture:
        b = self.reference_bundle
        blocks = self._timings(b).get("blocks") or []
        cost = float(b.manifest["mosaic_run"].get("cost_s", 0.0))
        return ReferenceCapture(Kernel(REFERENCE, b.kernel, None, str(b.root)), blocks, cost)

    def build(self, kernel: Kernel) -> Built:
        b = self.by_key.get(kernel.key)
        if b is None:
            return Built(kernel.key, False, f"not recorded in {self.dir / 'bundles'} (offline: nothing is built)",
                         "unrecorded")
        meta = b.manifest["mosaic_run"]
        build = meta.get("build") or {}
        ok = bool(build.get("ok", True))
        return Built(kernel.key, ok, str(build.get("reason", "")), "" if ok else "unbuildable", str(b.root),
                     float(meta.get("cost_s", 0.0)))

    def inputs(self) -> dict:
        if self._inputs is None:
            self._inputs = self.reference_bundle.arrays("inputs")
        return self._inputs

    def inputs_of(self, b) -> dict:
        """The inputs a bundle's outputs were computed from: its own recorded inputs; else those its
        ``inputs-meta.json`` names by seed and distribution (made again: the family's generator is deterministic);
        else (a bundle of a campaign whose gates all ran with seed 0) the reference bundle's."""
        own = b.arrays("inputs")
        if own:
            return own
        if "inputs-meta.json" in b.manifest.get("files", {}):
            try:
                meta = json.loads(b.read_bytes("inputs-meta.json", "json_bytes"))
            except (BundleError, ValueError):
                meta = {}
            seed, values = meta.get("seed"), meta.get("values", "normal")
            if isinstance(seed, int) and not isinstance(seed, bool) and seed != 0 and isinstance(values, str):
                from mosaic.families import make_inputs

                return make_inputs(b.kernel, seed, values)
        return self.inputs()

    def check(self, kernel: Kernel, built: Built, reference: Kernel) -> Checked:
        b = self.by_key[kernel.key]
        cap = b.manifest.get("capture") if isinstance(b.manifest.get("capture"), Mapping) else {}
        summary = cap.get("summary") if isinstance(cap.get("summary"), Mapping) else {}
        limit = cap.get("timeout") if isinstance(cap.get("timeout"), Mapping) else {}
        if cap.get("status") == "timeout" and limit.get("budget"):  # the live gate was cut by the budget
            # capture.timeout's fields were checked on load (_check_capture)
            return Checked(kernel.key, False, f"budget: the gate was killed after {limit.get('s', 0):.0f} s, when "
                           "the device-minute budget ran out (no verdict on the kernel's numerics)", judged=False)
        cases = summary.get("gate_cases") if isinstance(summary.get("gate_cases"), Mapping) else None
        if cases is not None and cases.get("passed") is False:  # the device gate's other cases (outputs not kept)
            first = cases.get("first") if isinstance(cases.get("first"), Mapping) else {}
            return Checked(kernel.key, False, "recorded verdict of the device gate's other cases: "
                           f"[{first.get('stage', '?')}] {first.get('reason', '')}")
        outputs = b.arrays("outputs")
        inputs = self.inputs_of(b) if outputs else None
        if not outputs or not inputs:
            if isinstance(summary.get("numerics_pass"), bool):  # outputs too large to keep: the capture's own verdict, said so
                return Checked(kernel.key, bool(summary["numerics_pass"]),
                               "recorded verdict of the capture (outputs kept by SHA-256 only)"
                               + ("" if summary["numerics_pass"] else ": failed the oracle"))
            return Checked(kernel.key, False, "no outputs recorded in the bundle")
        return gate(self.family, inputs, outputs, self.dtype, self.out_dtype, kernel.key)

    def time(self, incumbent: Kernel, kernel: Kernel, rounds: int) -> Timed:
        b = self.by_key[kernel.key]
        t = self._timings(b)
        for s in t.get("sessions") or []:
            if s.get("against") == incumbent.key:
                spot = s.get("spot_check") if isinstance(s.get("spot_check"), Mapping) else None
                return Timed(kernel.key, incumbent.key, s["incumbent_blocks"], s["candidate_blocks"],
                             s.get("order", "ABAB"), "same-session", 0.0, gpu=s.get("gpu"), spot_check=spot)
        inc = self.by_key.get(incumbent.key)
        a = self._timings(inc).get("blocks") if inc is not None else None
        c = t.get("blocks")
        if not a or not c:
            raise BundleError(f"no recorded timing of {kernel.key} against {incumbent.key}", str(b.root))
        n = min(rounds, len(a), len(c))
        return Timed(kernel.key, incumbent.key, a[:n], c[:n], "ABAB", "recorded-blocks", 0.0)

    @property
    def yardstick_bundle(self):
        """The first yardstick's bundle (None: the campaign recorded none)."""
        return self.yardstick_bundles.get(YARDSTICK)

    def pair_yardstick(self, kernel: Kernel, rounds: int, key: str = YARDSTICK) -> Timed | None:
        """The yardstick ``key``'s recorded session against the incumbent; None when the live run made none
        (journals from before the pairing): the two standalone captures are never combined into a pairing."""
        b = self.yardstick_bundles.get(key)
        if b is None or b.manifest["mosaic_run"].get("unmeasured") is not None:
            return None
        for s in self._timings(b).get("sessions") or []:
            if s.get("against") == kernel.key:
                # its device time is in no candidate's bundle cost (which the build step counts): the session's own
                return Timed(key, kernel.key, s["incumbent_blocks"], s["candidate_blocks"],
                             s.get("order", "ABAB"), "same-session", float(s.get("wall_s") or 0.0), gpu=s.get("gpu"))
        return None

    def noise_by_gpu(self) -> dict:
        """A several-GPU campaign's reference noise blocks by GPU UUID (each reference bundle names its GPU);
        empty for a one-GPU campaign."""
        if not self.gpu_references:
            return {}
        out = {}
        for b in self.gpu_references:
            uuid = ((b.manifest["mosaic_run"].get("gpu") or {}).get("uuid"))
            if not isinstance(uuid, str):
                raise BundleError("a reference-gpu bundle must name its GPU (mosaic_run.gpu.uuid)", str(b.root))
            if uuid in out:
                raise BundleError(f"two reference-gpu bundles claim the GPU {uuid[:80]!r} (mosaic_run.gpu.uuid)",
                                  str(b.root))
            out[uuid] = self._timings(b).get("blocks") or []
        primary = (self.reference_bundle.manifest["mosaic_run"].get("gpu") or {}).get("uuid")
        if not isinstance(primary, str):
            raise BundleError("the reference bundle of a several-GPU campaign must name its GPU "
                              "(mosaic_run.gpu.uuid)", str(self.reference_bundle.root))
        out[primary] = self._timings(self.reference_bundle).get("blocks") or []
        return out

    def yardstick(self, spec: KernelSpec, rounds: int):
        run = next((y for y in self.yardsticks(spec, rounds) if y.key == YARDSTICK), None)
        return run.blocks if run is not None and run.measured else None

    def yardsticks(self, spec: KernelSpec, rounds: int) -> list[YardstickRun]:
        """Every yardstick the live run recorded a bundle for, measured (its blocks) or not (the reason its
        bundle records), the first first, then in the family's order (one it no longer has, by key, last); a
        campaign from before every yardstick was captured has only the first's bundle, and so only the first."""
        from mosaic.families import get

        fam = get(self.family)
        known = {y.name: (i, y) for i, y in enumerate(fam.yardsticks)} if fam is not None else {}
        runs = []
        for key, b in self.yardstick_bundles.items():
            meta = b.manifest["mosaic_run"]
            name = meta.get("yardstick") or b.language  # the yardstick's KernelSpec has its name as its language
            order, yard = known.get(name, (len(known), None))
            title = (yard.title or yard.name) if yard is not None else name
            miss = meta.get("unmeasured")
            if miss is not None:
                run = YardstickRun(key, name, title, None, miss["reason_code"], miss["reason"])
            else:
                run = YardstickRun(key, name, title, self._timings(b).get("blocks") or None)
            runs.append(((key != YARDSTICK, order, key), run))
        return [run for _, run in sorted(runs, key=lambda x: x[0])]


def campaign_bundles(source_dir: str | os.PathLike) -> list[Path]:
    """The ``*.bundle`` directories of ``source_dir/bundles``, in name order: ``bundles/`` or a bundle that is a
    symlink, or that resolves outside ``source_dir``, is refused with one line (nothing outside is read)."""
    from mosaic import safe_paths

    source_dir = Path(source_dir)
    root = source_dir / "bundles"
    safe_paths.inside(source_dir, root, safe_paths.BUNDLES_INSIDE)
    if not root.is_dir():
        raise BadInput("no bundles/ directory: offline runs read a campaign's recorded bundles", str(source_dir))
    return [safe_paths.inside(source_dir, path, safe_paths.BUNDLES_INSIDE) for path in sorted(root.glob("*.bundle"))]


def bundles_fingerprint(paths: list[Path]) -> str:
    """SHA-256 over each bundle's name and manifest (which holds every member's SHA-256, checked on load): what
    an offline journal's header records of the bundles it re-decides (``source_bundles``)."""
    import hashlib

    from mosaic import safe_paths

    digest = hashlib.sha256()
    for path in paths:
        manifest = path / "manifest.json"
        data = safe_paths.read_bytes(manifest, "json_bytes") if os.path.lexists(manifest) else b""
        digest.update(f"{path.name}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    return digest.hexdigest()


def recorded_source(head: Mapping, where: str) -> Path:
    """The source directory an offline journal's header names (``source_dir``), believed only when it holds the
    bundles the journal re-decided (``source_bundles``, their fingerprint): a header cannot send a resume to read
    another directory's bundles or journal."""
    src = head.get("source_dir")
    if not src:
        raise BadInput("the journal's header names no source_dir for its offline workbench", where)
    shown = src if len(src) <= 200 else src[:197] + "..."
    want = head.get("source_bundles")
    if not want:
        raise BadInput(f"the journal's header records no fingerprint of the bundles in its source_dir {shown} "
                       f"(source_bundles), so a resume does not read them; re-decide it afresh: mosaic run --offline "
                       f"{shown} --out NEW_DIR", where)
    try:
        got = bundles_fingerprint(campaign_bundles(src))
    except BadInput:
        got = None
    if got != want:
        raise BadInput(f"the journal's source_dir {shown} does not hold the bundles this campaign re-decided (their "
                       "fingerprint differs); a resume reads no other directory's bundles", where)
    return Path(src)


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _run_times(v) -> bool:
    return isinstance(v, list) and bool(v) and all(_number(x) and x >= 0 for x in v)


def _blocks(v) -> bool:
    return isinstance(v, list) and bool(v) and all(_run_times(x) for x in v)


def _check_meta(meta: Mapping, path: Path) -> None:
    """The manifest's ``mosaic_run`` record: one line naming the bundle and the field when it is malformed."""
    problem = None
    if not isinstance(meta["key"], str):
        problem = "mosaic_run.key must be a string"
    elif meta.get("role") is not None and not isinstance(meta.get("role"), str):
        problem = "mosaic_run.role must be a string"
    elif "cost_s" in meta and not (_number(meta["cost_s"]) and meta["cost_s"] >= 0):
        problem = f"mosaic_run.cost_s {str(meta['cost_s'])[:40]!r} must be a non-negative number of seconds"
    elif "build" in meta and not (isinstance(meta["build"], Mapping)
                                  and isinstance(meta["build"].get("ok", True), bool)):
        problem = "mosaic_run.build must be an object with a boolean 'ok'"
    elif meta.get("gpu") is not None and (gpu := _gpu_problem(meta["gpu"])):
        problem = f"mosaic_run.gpu {gpu}"
    elif meta.get("yardstick") is not None and not isinstance(meta["yardstick"], str):
        problem = f"mosaic_run.yardstick must be a yardstick's name, not {_short(meta['yardstick'])}"
    elif meta.get("unmeasured") is not None and not (
            isinstance(meta["unmeasured"], Mapping) and isinstance(meta["unmeasured"].get("reason_code"), str)
            and isinstance(meta["unmeasured"].get("reason"), str)):
        problem = f"mosaic_run.unmeasured must be an object with reason_code and reason strings, not " \
                  f"{_short(meta['unmeasured'])}"
    if problem:
        raise BundleError(problem, str(path / "manifest.json"))


def _gpu_problem(gpu) -> str | None:
    """Why a recorded device (a timing session's or a bundle's ``gpu``: {index, uuid, name, clocks, power_rounds})
    cannot be read; None when it can (or is absent)."""
    from mosaic.timing.throttle import sample_problem

    if gpu is None:
        return None
    if not isinstance(gpu, Mapping):
        return f"must be an object naming the device that timed it (index, uuid, name), not {_short(gpu)}"
    if gpu.get("uuid") is not None and not isinstance(gpu["uuid"], str):
        return f"uuid must be a string, not {_short(gpu['uuid'])}"
    rounds = gpu.get("power_rounds")
    if rounds is not None:
        if not isinstance(rounds, list):
            return f"power_rounds must be a list of samples, not {_short(rounds)}"
        for i, x in enumerate(rounds):
            if (problem := sample_problem(x)) is not None:
                return f"power_rounds[{i}]: {problem}"
    return None


def _check_capture(manifest: Mapping, path: Path) -> None:
    """The manifest's ``capture`` fields the offline gate reads (status, summary.numerics_pass, timeout.s and
    timeout.budget): one line naming the bundle and the field when one has the wrong type."""
    cap = manifest.get("capture")
    problem = None
    if cap is None:
        return
    if not isinstance(cap, Mapping):
        problem = f"capture must be an object, not {_short(cap)}"
    elif cap.get("status") is not None and not isinstance(cap["status"], str):
        problem = f"capture.status must be a string, not {_short(cap['status'])}"
    elif cap.get("summary") is not None and not isinstance(cap["summary"], Mapping):
        problem = f"capture.summary must be an object, not {_short(cap['summary'])}"
    elif (cap.get("summary") or {}).get("numerics_pass") is not None \
            and not isinstance(cap["summary"]["numerics_pass"], bool):
        problem = f"capture.summary.numerics_pass must be true or false, not {_short(cap['summary']['numerics_pass'])}"
    elif cap.get("timeout") is not None:
        limit = cap["timeout"]
        if not isinstance(limit, Mapping):
            problem = f"capture.timeout must be an object (s, why, budget), not {_short(limit)}"
        elif "s" in limit and not (_number(limit["s"]) and limit["s"] >= 0):
            problem = f"capture.timeout.s must be a non-negative number of seconds, not {_short(limit['s'])}"
        elif "budget" in limit and not isinstance(limit["budget"], bool):
            problem = f"capture.timeout.budget must be true or false, not {_short(limit['budget'])}"
    if problem:
        raise BundleError(problem, str(path / "manifest.json"))


def _short(value) -> str:
    import json

    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _build_of(manifest: Mapping, meta: Mapping) -> dict:
    if "build" in meta:
        return dict(meta["build"])
    cap = manifest.get("capture") if isinstance(manifest.get("capture"), Mapping) else {}
    status = cap.get("status", "ok")
    ok = status not in ("unbuildable", "crashed", "timeout", "failed")
    summary = cap.get("summary") if isinstance(cap.get("summary"), Mapping) else {}
    return {"ok": ok, "reason": "" if ok else f"{status}: {summary.get('error', '')}"}


def gate(family: str, inputs: Mapping, outputs: Mapping, dtype: str, out_dtype: str | None, key: str) -> Checked:
    """The numerics gate: the float64 oracle's verdict on one kernel's outputs."""
    from mosaic.oracle import check, numerics_pass

    try:
        verdict = check(family, inputs, outputs, dtype, out_dtype)
    except BadInput as exc:
        return Checked(key, False, f"oracle refused the outputs: {exc.what}")
    return Checked(key, numerics_pass(verdict), verdict.reason)


def interruption(events: list[dict]) -> tuple[list[dict], str | None]:
    """(the events to re-decide, what to say) for a recorded journal. A finished journal (it has a ``stop``
    event) is re-decided whole (None). An interrupted one (no stop: the run was killed) is re-decided up to its
    last recorded verdict: a last step that was proposed but has no verdict, no failed build and no refusal
    (killed while it was built or gated or timed) is left out with everything after it, and said."""
    if any(e.get("event") == "stop" for e in events):
        return events, None
    proposals = [(i, e) for i, e in enumerate(events) if e.get("event") == "proposal"]
    if not proposals:
        return events, "interrupted before the first step (no stop recorded)"
    last = max(e["step"] for _, e in proposals)
    at = next(i for i, e in proposals if e["step"] == last)
    step_events = [e for e in events[at:] if e.get("step") == last]
    prop = events[at]
    finished = (not prop.get("ok") or any(e["event"] == "verdict" for e in step_events)
                or any(e["event"] == "build" and not e.get("ok") for e in step_events))
    if finished:
        return events, f"interrupted after step {last} (no stop recorded); every recorded step re-decided"
    return events[:at], (f"interrupted at step {last} ({prop.get('key')}: no verdict recorded); not re-decided")


def compare_verdicts(recorded: list[dict], redecided: list[dict], stop_too: bool = True) -> list[str]:
    """Every difference between two journals' verdicts and stop (offline re-decision must reproduce them);
    ``stop_too=False`` for an interrupted journal, which recorded no stop."""
    def verdicts(events):
        return [(e["key"], e["step"], e["decision"], e["reason_code"]) for e in events if e["event"] == "verdict"]

    def stop(events):
        return next((e["stop"] for e in events if e["event"] == "stop"), None)

    a, b = verdicts(recorded), verdicts(redecided)
    problems = []
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x != y:
            problems.append(f"verdict {i + 1}: recorded {_show(x)}, re-decided {_show(y)}")
    if stop_too and stop(recorded) != stop(redecided):
        problems.append(f"stop: recorded {stop(recorded)!r}, re-decided {stop(redecided)!r}")
    return problems


#: the shipped report files a campaign directory may hold, each checked against the figures of its bundles
SHIPPED = ("report.json", "report.md", "report.html")
JOURNAL = "the journal"


def compare_figures(recorded: list[dict], redecided: list[dict], src: Path, interrupted: bool = False) -> list[str]:
    """Every figure the report prints (:func:`mosaic.run.report.report_figures`: each time of the edits table and
    its reasons, the reference's time and noise, the yardstick's times and fractions, the final incumbent against
    the reference, the beams, the stop), recomputed from the bundles (the re-decided journal ``redecided``), against
    what the recorded journal and the shipped ``report.json``, ``report.md`` and ``report.html`` of ``src`` claim.
    One line per figure that disagrees: who claims what, and what the bundles give. ``interrupted``: the recorded
    journal has no stop, so only the figures it (and a report) states are compared."""
    from mosaic.run.report import VERSION, build_report, markdown_figures, markdown_of_html, report_figures

    expected = report_figures(build_report(redecided))
    claims: list[tuple[str, dict, bool]] = [(JOURNAL, _figures_or_none(recorded, build_report, report_figures), False)]
    versions: dict[str, int | None] = {JOURNAL: VERSION}  # report.md and report.html declare none
    problems: list[str] = []
    for name in SHIPPED:
        path = src / name
        if not os.path.lexists(path):
            continue
        try:
            text = _shipped_text(path)
            if name == "report.json":
                figures, versions[name] = _report_json_figures(text, report_figures)
                claims.append((name, figures, False))
            else:
                claims.append((name, markdown_figures(text if name == "report.md" else markdown_of_html(text)), True))
        except (BadInput, OSError, ValueError) as exc:
            what = exc.what if isinstance(exc, BadInput) else str(exc)
            problems.append(f"figures of {name}: not read ({what[:200]}); the bundles give the report "
                            "mosaic run --offline writes")
    if claims[0][1] is None:
        problems.append("figures of the journal: its events do not make a report")
        claims = claims[1:]
    last = max((e["step"] for e in recorded if e["event"] == "proposal"), default=-1)
    wrong: dict[str, list[tuple]] = {}  # figure -> [(source, what it claims, claimed as printed text)]
    for source, figures, printed in claims:
        if figures is None:
            continue
        names = [n for n in expected if _asked(n, figures, versions.get(source))] if not interrupted else []
        names += [n for n in figures if n not in names and not (interrupted and _past(n, last))]
        for name in names:
            want = expected.get(name)
            if printed and want is not None and want[1] is None:  # a figure only report.json holds
                continue
            if source == JOURNAL and name.endswith(" outcome"):  # the journal's verdicts: compare_verdicts
                continue
            got = figures.get(name)
            if not _same(want, got, printed):
                wrong.setdefault(name, []).append((source, got, printed))
    for name, found in wrong.items():
        want = expected.get(name)
        # two values that print alike are shown with every digit (a report.json edited below the printed precision)
        precise = want is not None and any(not printed and got is not None and got[1] == want[1]
                                           for _, got, printed in found)
        by_text: dict[str, list[str]] = {}
        for source, got, printed in found:
            text = "nothing" if got is None else got if printed else got[2] if precise or got[1] is None else got[1]
            by_text.setdefault(text, []).append(source)
        said = "; ".join(f"{_sources(who)} {'claims' if len(who) == 1 else 'claim'} {text}"
                         for text, who in by_text.items())
        given = "nothing" if want is None else want[2] if precise or want[1] is None else want[1]
        problems.append(f"figure {name}: {said}; the bundles give {given}")
    return problems


def _asked(name: str, figures: dict, version) -> bool:
    """Whether a claim source is held to the figure ``name``: a shipped report of a format from before the figure
    (:data:`mosaic.run.report.FIGURES_SINCE`) is not, when it declares that older version (report.json) or, as
    report.md and report.html declare none, prints no figure of its kind -- it claims nothing about it."""
    from mosaic.run.report import FIGURES_SINCE

    for prefix, since in FIGURES_SINCE:
        if name.startswith(prefix) and not any(n.startswith(prefix) for n in figures):
            return isinstance(version, int) and not isinstance(version, bool) and version >= since
    return True


def _past(name: str, last: int) -> bool:
    """A figure of a step after ``last`` (the interrupted step of a journal with no stop, never re-decided)."""
    import re

    m = re.match(r"(?:step (\d+) |beam \d+ \(after step (\d+)\))", name)
    return bool(m) and int(m.group(1) or m.group(2)) > last


def _figures_or_none(events, build_report, report_figures):
    try:
        return report_figures(build_report(events))
    except (KeyError, TypeError, AttributeError, ValueError):
        return None


def _shipped_text(path: Path) -> str:
    from mosaic import safe_paths

    return safe_paths.read_bytes(path, "text_bytes").decode("utf-8", errors="replace")


def _report_json_figures(text: str, report_figures) -> tuple[dict, object]:
    from mosaic import limits

    rep = limits.loads_json(text, "report.json")
    if not isinstance(rep, Mapping) or rep.get("format") != "mosaic-run-report":
        raise ValueError("not a mosaic run report (format 'mosaic-run-report')")
    try:
        return report_figures(dict(rep)), rep.get("version")
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"a field of the wrong shape ({type(exc).__name__}: {str(exc)[:80]})") from None


def _same(want, got, printed: bool) -> bool:
    if want is None or got is None:
        return want is None and got is None
    if printed:
        return want[1] == got
    a, b = want[0], got[0]
    if _number(a) and _number(b):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b and type(a) is type(b)


def _sources(who: list[str]) -> str:
    return who[0] if len(who) == 1 else ", ".join(who[:-1]) + " and " + who[-1]


def _show(v) -> str:
    if v is None:
        return "nothing"
    key, step, decision, code = v
    return f"step {step} {key} {decision} ({code})"


@attrs.frozen
class Redecision:
    """What :func:`redecide` found: the re-decided campaign's directory and outcome, and, when the source held
    a journal, how many verdicts it recorded and every difference (empty: all reproduced); ``note`` says when
    the campaign's proposer was not run."""

    out: Path
    outcome: Any
    recorded_verdicts: int | None
    problems: tuple = ()
    note: str | None = None
    report: Any = None  # report.json's content (mosaic.run.report.write_report), written under the lock
    interrupted: str | None = None  # the recorded journal has no stop: what was and was not re-decided
    figure_problems: int = 0  # how many of ``problems`` are figures (compare_figures), not verdicts


def require_target(campaign, where: str) -> None:
    """Re-deciding needs the target language's plugin (its knob class completes every candidate's knobs, so
    its keys): without it every verdict would differ, and the bundles would be blamed for it."""
    import os

    from mosaic.plugins import ALLOW_ENV, host

    langs = host().items("languages")
    lang = langs.get(campaign.target)
    if lang is not None and lang.backend is not None:
        return
    allow = os.environ.get(ALLOW_ENV)
    why = f"; {ALLOW_ENV}={allow!r} does not load it" if allow is not None else ""
    what = "is not installed" if lang is None else "has no backend"
    raise BadInput(f"the campaign's target language '{campaign.target}' {what} (languages here: "
                   f"{', '.join(sorted(langs)) or 'none'}{why}); re-deciding needs its plugin, e.g. "
                   f"pip install mosaic-target-{campaign.target}", where)


def offline_proposer(campaign, command: tuple | None):
    """(campaign, proposer stand-in or None, note): an offline run never runs what the campaign directory names.

    The built-in ``knobs`` proposer (in-process, deterministic) proposes past the recorded proposals; any
    other proposer (``command``: a program; a plugin's) is replaced by :class:`~mosaic.run.replay.RecordedOnly`,
    unless the user names their own program on the command line (``--command``), which then runs."""
    from mosaic.run.replay import RecordedOnly

    if command:
        if campaign.proposer != "command":
            raise BadInput(f"--command runs an agent for a campaign whose proposer is 'command'; this one's is "
                           f"'{campaign.proposer}'", "--command")
        return attrs.evolve(campaign, command=tuple(command)), None, None
    if campaign.proposer == "knobs":
        return campaign, None, None
    what = "runs a program" if campaign.proposer == "command" else "is a plugin's"
    reason = (f"offline: the campaign's proposer '{campaign.proposer}' is never run offline (recorded "
              "proposals only)")
    note = (f"offline: the campaign's proposer '{campaign.proposer}' {what}; an offline run never runs it, so only "
            "its recorded proposals are replayed (to run your own agent, pass --command)")
    return campaign, RecordedOnly(campaign.proposer, reason), note


def redecide(src: Path, out: Path | None = None, quiet: bool = False, command: tuple | None = None,
             force: bool = False) -> Redecision:
    """Re-decide the campaign in ``src`` from its bundles; the journal goes to ``out`` (default ``src/offline``).

    Nothing that ``src`` names is run (:func:`offline_proposer`); ``out`` is locked for the run
    (:mod:`mosaic.run.lock`) and must not hold another campaign's report unless ``force``."""
    from mosaic import safe_paths
    from mosaic.run.campaign import Campaign, load_campaign
    from mosaic.run.journal import NAME, Journal, read_campaign_journal
    from mosaic.run.lock import campaign_lock
    from mosaic.run.loop import run_campaign
    from mosaic.run.replay import Recorded
    from mosaic.run.report import foreign_reports, write_report

    recorded_events, gpu_record = None, None
    if (src / NAME).is_file():
        recorded_events, _ = read_campaign_journal(src / NAME)
        head = recorded_events[0]
        campaign = Campaign.from_json(head["campaign"], str(src / NAME))
        gpu_record = head.get("gpu")
    elif safe_paths.no_link(src / "campaign.toml").is_file():
        campaign = load_campaign(src / "campaign.toml")
    else:
        raise BadInput("an offline run needs the campaign: journal.jsonl or campaign.toml", str(src))
    require_target(campaign, str(src))
    campaign, proposer, note = offline_proposer(campaign, command)
    stopped = None
    if recorded_events is not None:
        recorded_events, stopped = interruption(recorded_events)
    if stopped is not None:  # nothing past the recorded steps is proposed: they are what is re-decided
        from mosaic.run.replay import RecordedOnly

        proposer = RecordedOnly(campaign.proposer, f"offline: {stopped}")
        note = f"{note}; {stopped}" if note else f"offline: {stopped}"
    out = out or (src / "offline")  # campaign_lock refuses it when it is a link (safe_paths.real_dir)
    with campaign_lock(out):
        journal = Journal.create(out)
        reports = foreign_reports(out)
        if reports and not force:
            raise BadInput(f"{', '.join(reports)} here belong to another campaign; choose a fresh --out directory "
                           "or pass --force to replace them", str(out))
        try:
            bench = OfflineWorkbench(src, campaign.family, campaign.dtype)
            recorded = Recorded(recorded_events, measurements=False) if recorded_events else None
            outcome = run_campaign(campaign, bench, journal, gpu_record, recorded,
                                   header={"source_dir": str(src.resolve()), "source_bundles": bench.fingerprint,
                                           "replays_journal": recorded_events is not None},
                                   quiet=quiet, proposer=proposer)
            rep = write_report(out)
            if recorded_events is None:
                return Redecision(out, outcome, None, note=note, report=rep)
            redecided, _ = read_campaign_journal(out / NAME)
        except Exception:
            # a re-decision that failed (a bundle refused mid-run, a report that could not be written) leaves no
            # journal or report of its own behind: the rerun after the fix starts afresh instead of being refused
            _remove_failed_run(out, journal, keep=reports)
            raise
    n = sum(1 for e in recorded_events if e["event"] == "verdict")
    if stopped is not None:  # an interrupted journal: only the recorded steps are compared (the naive kernel of a
        # journal killed in step 0 is decided again by the loop, but there is nothing recorded to compare it with)
        last = max((e["step"] for e in recorded_events if e["event"] == "proposal"), default=-1)
        redecided = [e for e in redecided if not (e["event"] == "verdict" and e["step"] > last)]
    problems = compare_verdicts(recorded_events, redecided, stop_too=stopped is None)
    figures = compare_figures(recorded_events, redecided, src, interrupted=stopped is not None)
    return Redecision(out, outcome, n, tuple(problems + figures), note, rep, stopped, len(figures))


def _remove_failed_run(out: Path, journal, keep: list[str]) -> None:
    """Remove what a failed offline run wrote to ``out``: its journal and the report files that were not there
    before it (``keep``: another campaign's, replaced only under --force). A killed run (kill -9) removes
    nothing: its journal is resumed with --resume."""
    from mosaic.run.report import FILES

    journal.close()
    for name in (journal.path.name, *(f for f in FILES if f not in keep)):
        path = out / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
