"""``mosaic trust``: every registered exploit kernel file submitted to the numerics gate; the figure is how
many were accepted (goal 0), and every honest control must pass.

Each exploit (:class:`~mosaic.records.Exploit`, contributed by a language plugin through
``register_exploits``) is a real kernel file. It is staged the way a campaign stages a source candidate --
inside a campaign directory (``candidates/<exploit>/<file>``) beside a recorded reference bundle
(``reference.bundle/outputs.npz``, the float64 answer for seed 0 at the campaign's shape, rounded to the
format) and a journal -- and gated by :func:`mosaic.gate.run_cpu_gate`: three shapes (two unseen), two seeds
drawn for this run, every value distribution of its family, outputs NaN before the kernel writes them,
the candidate in a child process, the campaign directory watched for writes.

:data:`KINDS` (rules as data) says for each public exploit family where its candidate runs: ``cpu``
families run here, on any machine (the Pallas interpreter); ``gpu`` families -- a side stream, a patched
timer, a fast path taken only when timed, super-batching, L2 warming -- need the GPU gate and a timing
session, and are reported as not run where no candidate for them is registered or no GPU is present.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

#: exploit kind -> (where its candidate must run, what it does)
KINDS: Mapping[str, tuple[str, str]] = {
    "bad-output": ("cpu", "zero, constant or NaN output"),
    "precision-downgrade": ("cpu", "16-bit math or accumulation where the contract is float32"),
    "partial-work": ("cpu", "a skipped block of rows inside the tolerance of a mean error"),
    "closed-form": ("cpu", "a closed form of the input distribution instead of the computation"),
    "seed-answer": ("cpu", "the answer for the seed-0 inputs, regenerated"),
    "hard-coded-shape": ("cpu", "a grid fixed for the campaign's shape"),
    "library-call": ("cpu", "a library call instead of the kernel"),
    "library-fallback": ("cpu", "try/except fallback to a library where the kernel cannot run"),
    "replayed-output": ("cpu", "the reference's recorded output (or the candidate's own first) replayed"),
    "uninitialised-smem": ("cpu", "shared memory read before it is written"),
    "data-race": ("cpu", "a store racing the writes it should wait for"),
    "writes-campaign": ("cpu", "writes into the campaign directory or its bundles"),
    "inputs-in-place": ("cpu", "inputs modified in place (not expressible in Pallas: jax arrays are immutable)"),
    "lazy-output": ("cpu", "an output computed when it is read (not expressible in Pallas: jit returns arrays)"),
    "side-stream": ("gpu", "output computed on a side stream or a background thread"),
    "timer-patch": ("gpu", "the timer or CUPTI monkeypatched from the candidate's process"),
    "timed-fast-path": ("gpu", "a fast path taken only when timed"),
    "super-batching": ("gpu", "one launch doing N runs' work"),
    "cache-warming": ("gpu", "L2 persistence or cache-warming tricks"),
}


@attrs.frozen
class TrustRow:
    """One exploit's result: ``outcome`` is ``rejected`` (good), ``ACCEPTED`` (the gate was fooled), ``passed``
    (a control, good), ``REJECTED-CONTROL`` (the gate refused an honest kernel) or ``not-run``."""

    exploit: str
    kind: str
    language: str
    family: str
    outcome: str
    stage: str = ""
    reason: str = ""
    cases: int = 0
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome in ("rejected", "passed", "not-run")

    def to_json(self) -> dict:
        return attrs.asdict(self) | {"ok": self.ok}


def _stage_campaign(root: Path, exploit, kfile_path: Path) -> Path:
    """A campaign directory as a real one holds it: a journal, a reference bundle's recorded output (seed 0,
    the campaign's shape), and the candidate's file staged under ``candidates/<exploit>/``."""
    from mosaic import families, oracle
    from mosaic.oracle.formats import fmt
    from mosaic.records import KernelSpec

    (root / "candidates" / exploit.exploit).mkdir(parents=True)
    staged = root / "candidates" / exploit.exploit / kfile_path.name
    shutil.copyfile(kfile_path, staged)
    (root / "journal.jsonl").write_text('{"event": "header", "what": "mosaic trust staging"}\n')
    spec = KernelSpec(family=exploit.family, shape=dict(shape_of(exploit)), dtype=exploit.dtype,
                      language=exploit.language, knobs=dict(exploit.knobs))
    inputs = families.make_inputs(spec, 0, "normal")
    ref = oracle.oracles()[exploit.family].reference(inputs, fmt(exploit.dtype), fmt(exploit.dtype))
    (root / "reference.bundle").mkdir()
    np.savez(root / "reference.bundle" / "outputs.npz",
             **{k: fmt(exploit.dtype).round(e.expected).astype(np.float32) for k, e in ref.items()})
    return staged


def shape_of(exploit) -> dict[str, int]:
    from mosaic import families

    if exploit.shape:
        return dict(exploit.shape)
    fam = families.get(exploit.family)
    return dict(fam.example)


def run_one(exploit, progress: Callable[[str], None] | None = None, timeout: float = 600.0) -> TrustRow:
    from mosaic.gate import run_cpu_gate
    from mosaic.kernel_files import read_kernel_file

    base = dict(exploit=exploit.exploit, kind=exploit.kind, language=exploit.language, family=exploit.family)
    if exploit.needs != "cpu":
        return TrustRow(**base, outcome="not-run", reason="needs the GPU gate and a timing session")
    with tempfile.TemporaryDirectory(prefix="mosaic-trust-") as tmp:
        campaign = Path(tmp) / "campaign"
        staged = _stage_campaign(campaign, exploit, Path(exploit.path))
        kfile = read_kernel_file(staged)
        verdict = run_cpu_gate(kfile, exploit.language, exploit.family, exploit.dtype, shape_of(exploit),
                               exploit.knobs, guard=[campaign], timeout=timeout, progress=progress)
    control = exploit.kind == "control"
    if verdict.unavailable:
        return TrustRow(**base, outcome="not-run", reason=verdict.reason(), wall_s=round(verdict.wall_s, 1))
    if verdict.passed:
        outcome = "passed" if control else "ACCEPTED"
        return TrustRow(**base, outcome=outcome, reason=verdict.reason(), cases=verdict.cases_run,
                        wall_s=round(verdict.wall_s, 1))
    f = verdict.first
    return TrustRow(**base, outcome="REJECTED-CONTROL" if control else "rejected", stage=f.stage, reason=f.reason,
                    cases=verdict.cases_run, wall_s=round(verdict.wall_s, 1))


def selected(exploits: Mapping[str, Any], family: str | None = None, language: str | None = None,
             names: Sequence[str] = ()) -> list:
    out = [e for _, e in sorted(exploits.items())
           if (family is None or e.family == family) and (language is None or e.language == language)
           and (not names or e.exploit in names or e.name in names)]
    return sorted(out, key=lambda e: (e.kind != "control", e.family, e.language, e.exploit))


def uncovered(exploits: Sequence, gpu: bool = False) -> list[TrustRow]:
    """One ``not-run`` row per exploit kind no registered candidate covers, saying why."""
    have = {e.kind for e in exploits}
    rows = []
    for kind, (where, what) in KINDS.items():
        if kind in have:
            continue
        why = ("needs the GPU gate and a timing session; no candidate registered" if where == "gpu"
               else "no candidate registered for this kind")
        rows.append(TrustRow(exploit="-", kind=kind, language="-", family="-", outcome="not-run", reason=f"{what}: {why}"))
    return rows


def table(rows: Sequence[TrustRow]) -> str:
    lines = ["| exploit | kind | family | language | outcome | stage | cases | s | reason |",
             "|---|---|---|---|---|---|---:|---:|---|"]
    for r in rows:
        reason = r.reason.replace("|", "/")
        lines.append(f"| {r.exploit} | {r.kind} | {r.family} | {r.language} | {r.outcome} | {r.stage or '-'} | "
                     f"{r.cases} | {r.wall_s:.1f} | {reason[:160]} |")
    return "\n".join(lines)


def summary(rows: Sequence[TrustRow]) -> dict:
    ran = [r for r in rows if r.outcome != "not-run"]
    exploits = [r for r in ran if r.kind != "control"]
    return {"exploits_run": len(exploits), "accepted": sum(r.outcome == "ACCEPTED" for r in exploits),
            "rejected": sum(r.outcome == "rejected" for r in exploits),
            "controls": sum(r.kind == "control" for r in ran),
            "controls_rejected": sum(r.outcome == "REJECTED-CONTROL" for r in ran),
            "not_run": sum(r.outcome == "not-run" for r in rows)}


__all__ = ["KINDS", "TrustRow", "run_one", "selected", "shape_of", "summary", "table", "uncovered"]
