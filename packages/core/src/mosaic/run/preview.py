"""The campaign preview: what ``mosaic run`` does on a machine without a GPU.

Every step of a campaign that needs no device runs; every step that needs one is listed as skipped, with why.

1. The campaign and its GPU record (the budgets a lowering is checked against).
2. The reference: a capture of the source kernel that the source language's plugin ships
   (``Language.references``), matched by family, shape, dtype, knobs and GPU record. Its manifest is verified
   and it is copied to ``DIR/bundles/reference.bundle``. Its time and noise are shown as *recorded* (where and
   when), never as measured here. With a reference kernel file (``--reference FILE``) the file is lowered
   here instead, into the same bundle: it has no time until the device measures it.
3. The naive translation in the target language (the campaign's ``start_knobs``; with ``--start FILE`` that
   file, its knobs the file's class), lowered here in its own process with a timeout, for the GPU record:
   PTX, SASS, ptxas log and the shared-memory/register budget check. An unbuildable setting is reported with
   its reason.
   A start file in a language that runs kernel files on the CPU (Pallas) then meets the gate's CPU stage
   (:func:`mosaic.gate.cpu_stage`: jax's interpreter with its race detector, three shapes, two drawn seeds, every
   distribution), as in a live campaign: ``preview.json``'s ``gate`` holds the verdict.
4. The diff reference -> naive translation: the ranked rows the loop would start from.
5. The proposer's first edits for the naive translation, best first: what the loop would build first.

Skipped, always said: capturing the reference and measuring its noise on the device, the numerics gate, the
timing, the acceptance decisions, the family's yardsticks. ``DIR/preview.json`` and ``DIR/preview.md`` hold the
result; nothing here writes a journal, so the directory is never mistaken for a campaign to resume. Nothing is
written through a link (:mod:`mosaic.safe_paths`): ``bundles/`` or a bundle that is a symlink is refused with one
line, and a link planted at ``preview.json``/``preview.md`` is replaced.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from mosaic import safe_paths
from mosaic.records import KernelSpec

FORMAT = "mosaic-run-preview"
SHOWN_EDITS = 8
LOWER_TIMEOUT_S = 900.0
DEVICE_STEPS = (
    ("reference capture", "capturing the source kernel and measuring its noise from interleaved self-pairs"),
    ("numerics gate", "running each candidate on the device against the float64 oracle"),
    ("timing", "CUPTI device times of candidate against incumbent, interleaved"),
    ("acceptance", "the keep/reject decisions, which need the two measurements above"),
    ("yardstick", "{yardstick} timed in the same run, each alone and paired with the final incumbent"),
)


def _same(a: Any, b: Any) -> bool:
    return json.loads(json.dumps(a)) == json.loads(json.dumps(b))


def find_reference(language, spec: KernelSpec, gpu_name: str) -> tuple[Path | None, list[str]]:
    """The shipped bundle of ``language`` for ``spec`` on ``gpu_name``; (path, what the plugin ships)."""
    from mosaic.bundle import load_bundle
    from mosaic.errors import MosaicError

    shipped: list[str] = []
    for path in getattr(language, "references", ()) if language is not None else ():
        try:
            b = load_bundle(path, verify=False)
        except (MosaicError, OSError, ValueError):
            continue
        k = b.kernel
        shipped.append(f"{k.family} {'x'.join(str(k.shape[d]) for d in sorted(k.shape))} {k.dtype} "
                       f"on {b.manifest.get('gpu')}")
        if (k.family, k.dtype, b.manifest.get("gpu")) == (spec.family, spec.dtype, gpu_name) and \
                _same(k.shape, spec.shape) and _same(k.knobs, spec.knobs):
            return Path(path), shipped
    return None, shipped


@attrs.define
class Preview:
    campaign: Any
    gpu: Any
    why_no_gpu: str
    gpu_provenance: str = ""              # why this record (mosaic.gpus.resolve_gpu): "default; no GPU visible: ..."
    done: list = attrs.Factory(list)      # (step, what)
    skipped: list = attrs.Factory(list)   # (step, why)
    reference: dict | None = None
    naive: dict | None = None
    rows: list = attrs.Factory(list)
    layers: list = attrs.Factory(list)
    edits: list = attrs.Factory(list)
    gate: dict | None = None              # the start file's CPU gate stage (mosaic.gate.cpu_stage), where it ran

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": 1, "campaign": self.campaign.to_json(), "gpu": self.gpu.name,
                "gpu_provenance": self.gpu_provenance, "no_gpu": self.why_no_gpu,
                "done": [{"step": s, "what": w} for s, w in self.done],
                "skipped": [{"step": s, "why": w} for s, w in self.skipped], "reference": self.reference,
                "naive": self.naive, "layers": self.layers, "rows": self.rows, "edits": self.edits,
                "gate": self.gate}


def _edit_label(edit: dict | None) -> str:
    if not edit:
        return "-"
    if edit.get("kind") == "knob":
        more = "".join(f", {k}={v}" for k, v in (edit.get("implies") or {}).items())
        return f"{edit['knob']}={json.dumps(edit['value'])}{more} (was {json.dumps(edit.get('was'))})"
    if edit.get("kind") == "source" and edit.get("rewrite"):
        return f"catalog rewrite {edit['rewrite']} of {edit.get('name')} ({edit.get('why', '')})"
    return str(edit.get("kind"))


def run_preview(campaign, out: Path, why_no_gpu: str, progress: Callable[[str], None],
                languages: Mapping | None = None, gpu_provenance: str = "") -> Preview:
    """``languages``: name -> Language (default: the installed plugins'). ``gpu_provenance``: why the campaign's
    GPU record is the one it is (:meth:`mosaic.gpus.GpuChoice.provenance`), shown with the record."""
    from mosaic.bundle import load_bundle
    from mosaic.capture import CaptureOptions, capture
    from mosaic.errors import BadInput
    from mosaic.lift.diff import diff_fingerprints
    from mosaic.lift.inputs import lift_bundle
    from mosaic.plugins import host
    from mosaic.proposers import Request, make_proposer
    from mosaic.run.decide import total_distance
    from mosaic.run.loop import campaign_tools, full_knobs
    from mosaic.run.workbench import REFERENCE, candidate_key

    c = campaign
    gpu, knob_cls, catalog = campaign_tools(c)
    p = Preview(c, gpu, why_no_gpu, gpu_provenance)
    how = f"; {gpu_provenance}" if gpu_provenance else ""
    p.done.append(("campaign", f"{c.source} -> {c.target}, {c.family} {c.problem} {c.dtype}, GPU record {gpu.name} "
                               f"({gpu.arch}, {gpu.sm_count} SMs{how})"))
    langs = dict(languages) if languages is not None else host().items("languages")
    bundles = safe_paths.real_dir(safe_paths.real_dir(out, create=True) / "bundles", create=True,
                                  what="a campaign's bundles/")

    # 2. the shipped reference (or the reference kernel file, lowered here)
    ref_spec = KernelSpec(c.family, dict(c.shape), c.dtype, c.source, dict(c.reference_knobs))
    ref_dest = safe_paths.no_link(bundles / "reference.bundle")  # replaced below: never a link's target
    ref_path, shipped = (None, []) if c.reference else find_reference(langs.get(c.source), ref_spec, gpu.name)
    if c.reference:
        p.reference = _lower_reference_file(c, ref_spec, gpu, ref_dest, p, progress)
    elif ref_path is None:
        what = "; it ships: " + ", ".join(shipped) if shipped else "; it ships none"
        why = (f"no capture of {c.source} {c.family} {c.problem} {c.dtype} on {gpu.name} is shipped by the "
               f"'{c.source}' plugin{what}")
        p.reference = _reference_lowered_here(c, ref_spec, gpu, ref_dest, p, progress, why)
        if p.reference is None:
            p.reference = _stand_in_reference(c, langs.get(c.source), ref_spec, gpu, ref_dest, p, progress)
    else:
        b = load_bundle(ref_path)  # verifies every file's SHA-256
        if ref_dest.exists():
            shutil.rmtree(ref_dest)
        shutil.copytree(ref_path, ref_dest)
        s = (b.manifest.get("capture") or {}).get("summary") or {}
        p.reference = {"bundle": str(ref_dest), "shipped": str(ref_path), "gpu": b.manifest.get("gpu"),
                       "created": b.manifest.get("created"), "recorded_time_ns": s.get("time_ns"),
                       "recorded_noise_ns": s.get("noise_ns"), "timer": s.get("timer")}
        rec = (f"recorded {s['time_ns'] / 1e3:.2f} us, noise {s.get('noise_ns', 0) / 1e3:.2f} us on "
               f"{b.manifest.get('gpu')} at {b.manifest.get('created')}" if s.get("time_ns") else "no recorded time")
        p.done.append(("reference", f"shipped capture of {c.source} ({rec}); manifest verified"))
        progress(f"reference: the '{c.source}' plugin's shipped capture ({rec})")

    # 3. the naive translation, lowered here
    naive_spec, naive_source = None, None
    lang = langs.get(c.target)
    if lang is None or lang.backend is None:
        installed = ", ".join(n for n, v in sorted(langs.items()) if v.backend is not None) or "none"
        p.skipped.append(("naive translation", f"language '{c.target}' is not installed with a backend here "
                                               f"(installed: {installed})"))
    else:
        try:
            naive_spec = KernelSpec(c.family, dict(c.shape), c.dtype, c.target, full_knobs(knob_cls, c.start_knobs))
            if c.start:
                from mosaic.run.loop import start_file

                kfile = start_file(c)
                naive_spec, naive_source = attrs.evolve(naive_spec, name=kfile.name), kfile.source
        except BadInput as exc:
            p.skipped.append(("naive translation", str(exc)))
    naive_dest = None
    if naive_spec is not None:
        key = candidate_key(naive_spec, naive_source)
        naive_dest = safe_paths.no_link(bundles / f"cand-{key}.bundle")
        what = f"the start file {naive_spec.name}" if naive_source is not None else c.target
        progress(f"naive translation {what} {key}: lowering for {gpu.name} in its own process")
        opts = CaptureOptions(lower_only=True, timeout=LOWER_TIMEOUT_S)
        if naive_source is not None:  # as the live loop builds it: a source candidate (mosaic.kernel_files)
            from mosaic.kernel_files import lower_source

            r = lower_source(naive_spec, naive_source, gpu.name, naive_dest, opts)
        else:
            r = capture(naive_spec, gpu.name, naive_dest, opts)
        p.naive = {"key": key, "knobs": naive_spec.knobs, "status": r.status, "message": r.message,
                   "bundle": str(r.bundle) if r.bundle else None,
                   "file": naive_spec.name if naive_source is not None else None}
        if r.status in ("ok", "lowered") and r.bundle:
            res = (load_bundle(r.bundle).manifest.get("capture") or {}).get("summary", {}).get("resources") or {}
            p.done.append(("naive translation", f"{what} ({c.target}) {key} lowered for {gpu.name}: "
                                                f"{res.get('registers', '?')} registers, "
                                                f"{res.get('spill_stores', '?')} spill stores; budgets checked"))
        else:
            p.skipped.append(("naive translation", with_doctor_hint(f"lowering {r.status}: {r.message}")))
            naive_dest = None
    if naive_dest is not None and naive_source is not None:
        _cpu_gate(c, naive_spec, out, p, progress)

    # 4. the diff and 5. the proposer's first edits
    if p.reference is not None and naive_dest is not None:
        ref_fp = lift_bundle(ref_dest, gpu=_record(p.reference["gpu"]) if p.reference.get("stand_in") else gpu)
        cand_fp = lift_bundle(naive_dest, gpu=gpu)
        d = diff_fingerprints(ref_fp, cand_fp)
        p.rows = [r.to_json() for r in d.rows]
        p.layers = [[n, dist] for n, dist in d.layers]
        p.done.append(("diff", f"{len(d.rows)} ranked rows, distance {total_distance(d.layers):.3f}"))
        fields = None
        if knob_cls is not None and attrs.has(knob_cls):
            fields = {f.name: (list(f.default) if isinstance(f.default, tuple) else f.default)
                      for f in attrs.fields(knob_cls) if f.default is not attrs.NOTHING}
        key = p.naive["key"]
        request = Request(campaign=c.to_json(), parent=key, knobs=dict(naive_spec.knobs), rows=d.rows,
                          layers=d.layers, incumbent={"key": key, "knobs": dict(naive_spec.knobs), "time_ns": None,
                                                      "distance": total_distance(d.layers)},
                          reference={"key": REFERENCE, "language": c.source, "knobs": dict(c.reference_knobs),
                                     "time_ns": p.reference["recorded_time_ns"],
                                     "noise_ns": p.reference["recorded_noise_ns"]},
                          tried=frozenset({key}), knob_fields=fields, source=naive_source)
        # A preview has no side effects: an agent's command (a campaign file may name any program) is never run
        # here; the built-in knobs proposer shows what the first edits of the knob walk would be instead.
        shown = shown_proposer(c)
        if shown != c.proposer:
            p.skipped.append(("the agent's proposals", "the 'command' proposer's program is not run in a preview; "
                              "the first edits below are the built-in 'knobs' proposer's"))
        proposer = make_proposer(shown, c, knob_cls, catalog)
        seen = {key}
        for prop in proposer.propose(request):
            if len(p.edits) >= SHOWN_EDITS:
                break
            if not prop.ok:
                p.edits.append({"ok": False, "reason": prop.reason})
                continue
            try:
                spec = KernelSpec(c.family, dict(c.shape), c.dtype, c.target, full_knobs(knob_cls, prop.knobs or {}))
            except BadInput:
                continue
            k = candidate_key(spec, prop.source if prop.source is not None else naive_source)
            if k in seen:
                continue
            seen.add(k)
            p.edits.append({"ok": True, "key": k, "edit": prop.edit, "label": _edit_label(prop.edit)})
        p.done.append(("proposals", f"the '{shown}' proposer's first {len(p.edits)} edit(s) for the naive "
                                    "translation"))
    else:
        p.skipped.append(("diff and proposals", "they need both the reference and the naive translation (above)"))
    from mosaic.families import get

    fam = get(c.family)
    titles = [y.title or y.name for y in fam.yardsticks] if fam is not None else []
    yard = (titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1] if titles
            else "the family's yardstick (it has none)")
    for step, what in DEVICE_STEPS:
        p.skipped.append((step, f"{what.format(yardstick=yard)}: needs a CUDA device"))
    # each renamed into place: a link planted at either name is replaced, never written through
    safe_paths.write_atomic(out, "preview.json", json.dumps(p.to_json(), indent=1) + "\n")
    safe_paths.write_atomic(out, "preview.md", render(p))
    return p


CPU_GATE = "numerics gate on the CPU"


def _cpu_gate(c, spec: KernelSpec, out: Path, p: Preview, progress) -> None:
    """The start file through the gate's CPU stage (:func:`mosaic.gate.cpu_stage`) where its language runs kernel
    files on the CPU: as in a live campaign, before any hardware; the verdict goes into ``p.gate``."""
    from mosaic import gate
    from mosaic.run.loop import start_file

    kfile = start_file(c)
    if not gate.interprets(kfile, c.target):
        p.skipped.append((CPU_GATE, f"language '{c.target}' runs no kernel file on the CPU; its gate is the device's"))
        return
    progress(f"{CPU_GATE}: {kfile.name} in the {c.target} interpreter, a child process")
    v = gate.cpu_stage(kfile, c.target, c.family, c.dtype, spec.knobs, guard=[out], progress=progress)
    p.gate = v.to_json()
    if v.unavailable:
        p.skipped.append((CPU_GATE, v.reason()))
        return
    shapes = ", ".join("x".join(str(x) for x in s.values()) for s in v.plan.shapes)
    what = (f"{v.reason()}: shapes {shapes}, seeds drawn for this run, "
            f"distributions {', '.join(v.plan.distributions)}")
    p.done.append((CPU_GATE, what if v.passed else f"REJECTED {what}; the device would never run it"))


DOCTOR_HINT = "`mosaic doctor` says what this environment can build and what to install"


def with_doctor_hint(message: str) -> str:
    """A lowering that failed on a Python module this environment lacks (jax on Python 3.11, quack-kernels where
    only the Pallas stack is installed) names it; the hint says where the whole picture is."""
    return f"{message} ({DOCTOR_HINT})" if "No module named" in message else message


def _lower_reference_file(c, spec: KernelSpec, gpu, dest: Path, p: Preview, progress) -> dict | None:
    """The campaign's reference kernel file, lowered here into ``dest`` (what the device run captures)."""
    from mosaic.capture import CaptureOptions
    from mosaic.kernel_files import capture_file, read_kernel_file

    kfile = read_kernel_file(c.reference)
    spec = attrs.evolve(spec, knobs=kfile.knob_values(spec.knobs), name=kfile.name)
    progress(f"reference: the kernel file {kfile.name} ({c.source}), lowering for {gpu.name} in its own process")
    r = capture_file(kfile, spec, gpu.name, dest, CaptureOptions(lower_only=True, timeout=LOWER_TIMEOUT_S))
    if r.status != "lowered" or r.bundle is None:
        p.skipped.append(("reference", with_doctor_hint(f"the kernel file {kfile.name} did not lower ({r.status}): "
                                                         f"{r.message}")))
        return None
    p.done.append(("reference", f"kernel file {kfile.name} ({c.source}, sha256 {kfile.sha256[:12]}) lowered for "
                                f"{gpu.name}; its time and noise are measured on the device"))
    return {"bundle": str(dest), "file": kfile.name, "sha256": kfile.sha256, "knobs": dict(spec.knobs),
            "gpu": gpu.name, "recorded_time_ns": None, "recorded_noise_ns": None, "timer": None}


def _lowerable(bundle: Path | None) -> str | None:
    """Why a lowered bundle cannot be diffed (None: it has SASS or a cubin to lift)."""
    from mosaic.bundle import load_bundle

    if bundle is None:
        return "no bundle was written"
    b = load_bundle(bundle)
    return None if (b.one("sass") or b.one("cubin")) else "it lowered without SASS or a cubin here: nothing to lift"


def _reference_lowered_here(c, spec: KernelSpec, gpu, dest: Path, p: Preview, progress, why: str) -> dict | None:
    """No shipped capture for this GPU: the source kernel (the campaign's reference knobs) lowered here for it, as
    the device run would capture it; its time and noise are measured on the device. None (and the reason, in one
    line, after ``why``) where it does not lower to SASS here."""
    from mosaic.capture import CaptureOptions, capture

    progress(f"reference: {c.source} {c.family} {c.problem} {c.dtype}, lowering for {gpu.name} in its own process")
    r = capture(spec, gpu.name, dest, CaptureOptions(lower_only=True, timeout=LOWER_TIMEOUT_S))
    problem = (_lowerable(r.bundle) if r.status in ("ok", "lowered") else
               with_doctor_hint(f"{r.status}: {r.message}"))
    if problem is not None:
        p.skipped.append(("reference", f"{why}; lowering {c.source}'s kernel here for {gpu.name}: {problem}"))
        return None
    p.done.append(("reference", f"{c.source}'s kernel lowered here for {gpu.name} ({why}); its time and noise are "
                                "measured on the device"))
    return {"bundle": str(dest), "lowered_here": True, "knobs": dict(spec.knobs), "gpu": gpu.name,
            "recorded_time_ns": None, "recorded_noise_ns": None, "timer": None}


def _record(name: str | None):
    """The installed GPU record of that name (None: no plugin has it; the lift then reads no budgets)."""
    from mosaic.plugins import host

    try:
        return host().get("gpus", name)
    except Exception:  # noqa: BLE001 -- a record the installed plugins do not have
        return None


def _stand_in_reference(c, language, spec: KernelSpec, gpu, dest: Path, p: Preview, progress) -> dict | None:
    """The source's kernel neither shipped for this GPU nor lowered here: the plugin's shipped capture of the same
    family, shape and dtype on another GPU stands in for the diff, said so; its recorded time is that GPU's and is
    not shown as this one's (None: it ships none)."""
    from mosaic.bundle import load_bundle

    for path in getattr(language, "references", ()) if language is not None else ():
        b = load_bundle(path)  # verifies every file's SHA-256
        k, other = b.kernel, b.manifest.get("gpu")
        if (k.family, k.dtype) != (spec.family, spec.dtype) or not _same(k.shape, spec.shape) or other == gpu.name:
            continue
        record = _record(other)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(path, dest)
        p.done.append(("reference stand-in", f"the '{c.source}' plugin's shipped capture on {other} "
                                             f"({getattr(record, 'arch', '?')}, knobs {json.dumps(k.knobs)}) stands "
                                             f"in for the diff: a {other} kernel, not one built for {gpu.name}; its "
                                             f"recorded {other} time is not this GPU's"))
        progress(f"reference stand-in: the '{c.source}' plugin's shipped capture on {other}")
        return {"bundle": str(dest), "shipped": str(path), "stand_in": True, "gpu": other,
                "created": b.manifest.get("created"), "recorded_time_ns": None, "recorded_noise_ns": None,
                "timer": None}
    return None


def shown_proposer(c) -> str:
    """The proposer whose first edits a preview shows: the campaign's own, except an agent's command, never run here."""
    return "knobs" if c.proposer == "command" else c.proposer


def render(p: Preview) -> str:
    c = p.campaign
    lines = [f"# mosaic run (no GPU): {c.source} -> {c.target}, {c.family} {c.problem} {c.dtype} for {p.gpu.name}", "",
             f"No GPU here: {p.why_no_gpu}. Below: what ran without one, then what was skipped.", "",
             "## Done here", ""]
    lines += [f"- **{s}**: {w}" for s, w in p.done]
    if p.rows:
        lines += ["", "## Ranked differences, reference -> naive translation", "",
                  "| rank | layer | key | edit | reference | candidate |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['rank']} | {r['layer']} | {r['key']} | {r['edit']} | {json.dumps(r['reference'])} | "
                  f"{json.dumps(r['candidate'])} |" for r in p.rows]
    if p.edits:
        lines += ["", f"## First edits the '{shown_proposer(c)}' proposer would build", ""]
        for n, e in enumerate(p.edits, 1):
            if e["ok"]:
                row = (e["edit"] or {}).get("row") or {}
                why = f" — row {row.get('layer')}:{row.get('key')} (#{row.get('rank')})" if row else ""
                lines.append(f"{n}. {e['label']}{why}")
            else:
                lines.append(f"{n}. (refused) {e['reason']}")
    lines += ["", "## Skipped", ""]
    lines += [f"- **{s}**: {w}" for s, w in p.skipped]
    return "\n".join(lines) + "\n"
