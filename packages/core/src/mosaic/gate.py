"""The numerics gate as an adversary would meet it: shapes the candidate never saw, seeds drawn per run,
every adversarial value distribution of its family, and the checks that name what a candidate tried.

A gate that runs the campaign's one shape with one seed passes a kernel that hard-codes that shape or
regenerates the seed-0 answer. :func:`draw_plan` makes the cases instead: the campaign's shape and two
**unseen shapes** (odd sizes, or odd multiples of what the kernel declares it needs: a kernel file's
``MULTIPLE_OF``), crossed with **two seeds** drawn from the operating system's random source for this run
(never 0 by construction, never written anywhere the candidate reads before it ran) and **every value
distribution** of the family (``normal``, ``int``, ``large``, ``equal-rows``, ``denormal`` ...).

The candidate runs in a child process (``python -m mosaic.gate REQUEST.json``: :func:`run_cpu_gate`), which
only *runs* it: the parent makes the inputs (the request holds no seed), and the parent judges
(:func:`judge`), stage by stage, with the first failure named:

========== ===========================================================================================
stage      what it catches
========== ===========================================================================================
kernel     no kernel of the language in the program, or arithmetic outside it (a library call instead
           of the kernel, a try/except fallback to one)
run        the candidate crashed, or refused a shape inside what it declares it handles
output     not one array of the output's shape and a floating dtype (a lazy or proxy object)
inputs     the inputs' bytes changed (modified in place)
race       the language's race detector reported a data race (jax's GPU interpreter for Pallas)
oracle     the float64 oracle refused the output (zero, constant or NaN output, partial work, a
           precision downgrade, a closed form, the seed-0 answer, a replayed or cached output -- right for
           one case's inputs, wrong for the others' --, uninitialised shared memory)
writes     a file changed in a directory the candidate must not write (the campaign, its bundles)
========== ===========================================================================================

The rules are data (:data:`STAGES`); ``mosaic trust`` (:mod:`mosaic.trust`) submits one kernel file per
public exploit family through this gate and prints the table.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from mosaic.errors import BadInput

#: stage -> what failing it means (the order is the order of the checks within one case)
STAGES: Mapping[str, str] = {
    "kernel": "the program holds no kernel of the language, or computes outside it",
    "run": "the candidate crashed or refused a shape it declares it handles",
    "output": "the output is not one array of the output's shape",
    "inputs": "the candidate modified its inputs",
    "race": "the race detector reported a data race",
    "oracle": "the float64 oracle refused the output",
    "writes": "a file changed in a directory the candidate must not write",
}
#: the unseen shapes' size when the gate runs on the CPU (jax's GPU interpreter runs one CTA at a time)
CPU_MAX_ELEMENTS = 1 << 15
UNSEEN_SHAPES = 2
SEEDS = 2


@attrs.frozen
class GateCase:
    """One run of the candidate: a shape, a seed and a value distribution."""

    shape: Mapping[str, int] = attrs.field(converter=dict)
    seed: int
    values: str
    seen: bool = True  # the campaign's own shape (False: one the candidate never saw before the gate)

    def label(self) -> str:
        return f"{'x'.join(str(v) for v in self.shape.values())} {self.values}{'' if self.seen else ' (unseen shape)'}"

    def to_json(self) -> dict:
        return {"shape": dict(self.shape), "seed": self.seed, "values": self.values, "seen": self.seen}


@attrs.frozen
class GatePlan:
    """Every case the gate runs for one candidate, with the seeds and shapes it drew."""

    family: str
    dtype: str
    shapes: tuple
    seeds: tuple
    distributions: tuple
    cases: tuple

    def to_json(self) -> dict:
        return {"family": self.family, "dtype": self.dtype, "shapes": [dict(s) for s in self.shapes],
                "seeds": list(self.seeds), "distributions": list(self.distributions),
                "cases": [c.to_json() for c in self.cases]}


def _odd_multiple(rng: secrets.SystemRandom, granule: int, lo: int, hi: int, avoid: set[int]) -> int:
    """A multiple of ``granule`` in [lo, hi] whose multiplier is odd (an odd size when the granule is 1; an odd
    number of the kernel's tiles otherwise), avoiding ``avoid`` where that leaves a choice."""
    ks = [k for k in range(max(1, -(-lo // granule)), max(1, hi // granule) + 1) if k % 2 == 1 or k == 1]
    choice = [k for k in ks if k * granule not in avoid] or ks or [1]
    return rng.choice(choice) * granule


def unseen_shapes(dims: Sequence[str], campaign: Mapping[str, int], granules: Mapping[str, int],
                  rng: secrets.SystemRandom | None = None, count: int = UNSEEN_SHAPES,
                  max_elements: int | None = None) -> list[dict[str, int]]:
    """``count`` shapes unlike the campaign's and each other: every dimension an odd size (or an odd multiple of
    its granule), drawn between one granule and twice the campaign's size; with ``max_elements`` the product of
    the sizes stays under it (the largest dimension shrinks first)."""
    rng = rng or secrets.SystemRandom()
    out: list[dict[str, int]] = []
    for _ in range(count):
        for _attempt in range(64):
            shape = {}
            for d in dims:
                g = max(1, int(granules.get(d, 1)))
                hi = max(2 * int(campaign[d]), 3 * g)
                shape[d] = _odd_multiple(rng, g, g, hi, {int(campaign[d])} | {s[d] for s in out})
            while max_elements and int(np.prod(list(shape.values()))) > max_elements:
                big = max(shape, key=lambda d: shape[d] / max(1, granules.get(d, 1)))
                g = max(1, int(granules.get(big, 1)))
                if shape[big] <= g:
                    break
                shape[big] = _odd_multiple(rng, g, g, max(g, shape[big] // 2), set())
            if shape != dict(campaign) and shape not in out:
                break
        out.append(shape)
    return out


def draw_seeds(count: int = SEEDS, rng: secrets.SystemRandom | None = None) -> tuple[int, ...]:
    """``count`` distinct seeds in [1, 2^31), from the OS's random source: never the 0 every test uses."""
    rng = rng or secrets.SystemRandom()
    seeds: list[int] = []
    while len(seeds) < count:
        s = rng.randrange(1, 2**31)
        if s not in seeds:
            seeds.append(s)
    return tuple(seeds)


def draw_plan(family: str, shape: Mapping[str, int], dtype: str, granules: Mapping[str, int] | None = None,
              max_elements: int | None = None, distributions: Sequence[str] | None = None,
              rng: secrets.SystemRandom | None = None) -> GatePlan:
    """The gate's cases for one candidate: (campaign shape + :data:`UNSEEN_SHAPES` unseen) x :data:`SEEDS` seeds
    x the family's distributions."""
    from mosaic import families

    fam = families.get(family)
    if fam is None:
        raise BadInput(f"no family '{family}'", "--family")
    dims = tuple(fam.dims)
    missing = [d for d in dims if d not in shape]
    if missing:
        raise BadInput(f"{family} shape lacks {', '.join(missing)}", "--shape")
    granules = dict(granules or {})
    bad = [d for d, g in granules.items() if d in shape and int(shape[d]) % int(g)]
    if bad:
        raise BadInput(f"the campaign's shape {dict(shape)} is not a multiple of what the kernel declares for "
                       f"{', '.join(f'{d} ({granules[d]})' for d in bad)}", "--shape")
    shapes = [dict(shape)] + unseen_shapes(dims, shape, granules, rng, max_elements=max_elements)
    seeds = draw_seeds(rng=rng)
    dists = tuple(distributions or fam.distributions or ("normal",))
    cases = tuple(GateCase({d: int(s[d]) for d in dims}, seed, values, seen=i == 0)
                  for i, s in enumerate(shapes) for seed in seeds for values in dists)
    return GatePlan(family, dtype, tuple(shapes), seeds, dists, cases)


#: the device gate's extra shapes: at most this many elements (the product of the dimensions) and at most a quarter
#: of the campaign's (or :data:`DEVICE_MIN_ELEMENTS`, whichever is more), so two unseen shapes cost less than the
#: campaign's own run
DEVICE_MAX_ELEMENTS = 1 << 22
DEVICE_MIN_ELEMENTS = 1 << 12  # a campaign smaller than 4x this: unseen shapes of up to this many elements
#: the device gate's cases, as data: the campaign's shape with every gate seed and these distributions (its float64
#: reference is computed once per seed and campaign, then read from the oracle cache), the unseen shapes with every
#: gate seed and every distribution of the family
DEVICE_PLAN: Mapping[str, Any] = {"campaign_distributions": ("normal",), "unseen_distributions": "all"}
#: granules tried, smallest first, for a dimension of a template whose domain is a predicate (``can_implement``)
GRANULES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def campaign_seeds(recorded: Sequence[int] | None = None) -> tuple[int, ...]:
    """The campaign's gate seeds: those its journal header recorded (``gate_seeds``: a resumed campaign keeps
    them), else :data:`SEEDS` drawn now from the OS's random source (never 0)."""
    if recorded is not None:
        seeds = tuple(recorded)
        if not seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in seeds):
            raise BadInput(f"gate_seeds {list(recorded)!r} must be non-negative integers", "journal header")
        return seeds
    return draw_seeds()


def predicate_granules(dims: Sequence[str], campaign: Mapping[str, int],
                       allowed: Callable[[Mapping[str, int]], str | None]) -> dict[str, int]:
    """Per dimension, the smallest granule g of :data:`GRANULES` (dividing the campaign's size) such that the
    template accepts the campaign's shape with that dimension at g and at 3 g (``allowed(shape)`` is None): the
    domain of a template that says what it takes by a predicate (its ``can_implement``), not by multiples."""
    out = {}
    for d in dims:
        size = int(campaign[d])
        out[d] = size
        for g in GRANULES:
            if g > size or size % g:
                continue
            if all(allowed({**dict(campaign), d: v}) is None for v in (g, 3 * g)):
                out[d] = g
                break
    return out


def _past_campaign(drawn: Mapping[str, int], dims: Sequence[str], d: str, campaign: Mapping[str, int],
                   granules: Mapping[str, int], limit: int) -> dict[str, int]:
    """``drawn`` with dimension ``d`` one granule past the campaign's size and the others at their drawn sizes,
    shrunk to their granule while the product is over ``limit``; ``drawn`` itself when that does not fit. A kernel
    whose grid is fixed at the campaign's never writes the part past it."""
    g = max(1, int(granules.get(d, 1)))
    out = {**dict(drawn), d: int(campaign[d]) + g}
    for other in sorted((x for x in dims if x != d), key=lambda x: -out[x]):
        if int(np.prod([out[x] for x in dims])) <= limit:
            break
        out[other] = max(1, int(granules.get(other, 1)))
    return out if int(np.prod([out[x] for x in dims])) <= limit else dict(drawn)


def device_plan(family: str, shape: Mapping[str, int], dtype: str, seeds: Sequence[int],
                granules: Mapping[str, int] | None = None,
                allowed: Callable[[Mapping[str, int]], str | None] | None = None,
                rng: secrets.SystemRandom | None = None, tries: int = 16, max_elements: int | None = None,
                campaign_distributions: Sequence[str] | None = DEVICE_PLAN["campaign_distributions"]
                ) -> tuple[GatePlan, list[str]]:
    """The device gate's cases (:data:`DEVICE_PLAN`) and why a shape is missing (empty when none is): case 0 is
    the campaign's shape with the first seed (the gate's own capture, the inputs the timing sessions use). The
    unseen shapes stay inside the candidate's domain: a kernel file's ``granules`` (``MULTIPLE_OF``), or a
    template's predicate ``allowed`` (each drawn shape is asked; one refused is drawn again)."""
    from mosaic import families

    fam = families.get(family)
    if fam is None:
        raise BadInput(f"no family '{family}'", "--family")
    dims = tuple(fam.dims)
    granules = dict(granules or {})
    if allowed is not None:
        granules = {**predicate_granules(dims, shape, allowed), **granules}
    total = int(np.prod([int(shape[d]) for d in dims]))
    limit = max_elements or min(DEVICE_MAX_ELEMENTS, max(total // 4, DEVICE_MIN_ELEMENTS))
    rng = rng or secrets.SystemRandom()
    unseen: list[dict] = []
    missing: list[str] = []
    order = list(dims)
    rng.shuffle(order)
    for _ in range(UNSEEN_SHAPES):
        got, why = None, None
        for _attempt in range(tries):
            s = unseen_shapes(dims, shape, granules, rng, count=1, max_elements=limit)[0]
            # each larger than the campaign's along another dimension: a grid fixed at the campaign's shows
            s = _past_campaign(s, dims, order[len(unseen) % len(order)], shape, granules, limit)
            if s == dict(shape) or s in unseen:
                continue
            if int(np.prod([s[d] for d in dims])) > limit:  # granules too coarse to fit under the limit
                why = f"{s} has more than {limit} elements"
                continue
            why = allowed({**dict(shape), **s}) if allowed is not None else None
            if why is None:
                got = s
                break
        if got is None:
            missing.append(f"no unseen shape inside the candidate's domain in {tries} draws"
                           + (f" (last refused: {why})" if why else ""))
        else:
            unseen.append(got)
    dists = tuple(fam.distributions or ("normal",))
    first = dists if campaign_distributions is None else (
        tuple(d for d in campaign_distributions if d in dists) or dists[:1])
    rest = dists if DEVICE_PLAN["unseen_distributions"] == "all" else tuple(DEVICE_PLAN["unseen_distributions"])
    fixed = {k: int(v) for k, v in shape.items() if k not in dims}  # optional entries (kv_heads, causal) stay
    cases = [GateCase({**{d: int(shape[d]) for d in dims}, **fixed}, seed, values, seen=True)
             for seed in seeds for values in first]
    cases += [GateCase({**{d: int(s[d]) for d in dims}, **fixed}, seed, values, seen=False)
              for s in unseen for seed in seeds for values in rest]
    return GatePlan(family, dtype, (dict(shape), *unseen), tuple(seeds), dists, tuple(cases)), missing


# -- what the child reports, and the parent's judgement ---------------------------------------------------

@attrs.frozen
class Finding:
    """The first failed stage of the gate: which, in which case, and why."""

    stage: str = attrs.field(validator=attrs.validators.in_(tuple(STAGES)))
    reason: str
    case: int | None = None

    def to_json(self) -> dict:
        return {"stage": self.stage, "reason": self.reason, "case": self.case}


@attrs.frozen
class GateVerdict:
    """The gate's decision: ``passed`` when no stage failed in any case; ``findings`` every failure, first first."""

    passed: bool
    findings: tuple = ()
    cases_run: int = 0
    plan: GatePlan | None = None
    wall_s: float = 0.0
    unavailable: str = ""  # this machine cannot run the candidate's language (no verdict; ``passed`` is False)

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def reason(self) -> str:
        if self.unavailable:
            return f"not run here: {self.unavailable}"
        if self.passed:
            return f"passed {self.cases_run} cases (3 shapes x 2 seeds x distributions)"
        f = self.first
        return f"[{f.stage}] {f.reason}"

    def to_json(self) -> dict:
        return {"passed": self.passed, "reason": self.reason(), "cases_run": self.cases_run,
                "findings": [f.to_json() for f in self.findings], "wall_s": round(self.wall_s, 2),
                "unavailable": self.unavailable,
                "plan": self.plan.to_json() if self.plan else None}


def digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the names, shapes, dtypes and bytes of ``arrays`` (sorted by name)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.shape}|{a.dtype}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def snapshot(roots: Sequence[str | os.PathLike]) -> dict[str, tuple]:
    """Every file under ``roots`` (links not followed) -> (size, SHA-256): what :func:`changed_files` compares."""
    seen: dict[str, tuple] = {}
    for root in roots:
        root = Path(root)
        if not root.exists() and not root.is_symlink():
            continue
        for p in ([root] if not root.is_dir() or root.is_symlink() else sorted(root.rglob("*"))):
            if p.is_symlink():
                seen[str(p)] = ("link", os.readlink(p))
            elif p.is_file():
                seen[str(p)] = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return seen


def changed_files(before: Mapping[str, tuple], after: Mapping[str, tuple]) -> list[str]:
    """Paths created, removed or changed between two snapshots."""
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def judge(plan: GatePlan, inputs: Sequence[Mapping[str, np.ndarray]], report: Mapping[str, Any],
          outputs: Sequence[Mapping[str, np.ndarray] | None], output_shapes: Sequence[Mapping[str, tuple]],
          written: Sequence[str] = (), check: Callable | None = None) -> GateVerdict:
    """Judge what the child ran: ``report["cases"][i]`` is its record of case i (``error``, ``kernel``,
    ``races``, ``inputs_after``, ``output_types``), ``outputs[i]`` the arrays it returned (None when it
    returned none), ``inputs[i]`` what the parent gave it. ``check(family, inputs, outputs, dtype)`` is the
    oracle (:func:`mosaic.oracle.check` by default)."""
    if check is None:
        from mosaic.oracle import check
    findings: list[Finding] = []
    records = list(report.get("cases") or [])
    if report.get("error") and not records:
        findings.append(Finding("run", str(report["error"])[:400], None))
    ran = 0
    for i, case in enumerate(plan.cases):
        rec = records[i] if i < len(records) else {"error": report.get("error") or "the child stopped before this case"}
        where = f"case {i} ({case.label()})"
        ran += 1
        kernel = rec.get("kernel") or {}
        if kernel and not kernel.get("kernels"):
            findings.append(Finding("kernel", f"{where}: the program holds no {kernel.get('language', '')} kernel "
                                              f"({kernel.get('what', 'no kernel call')})", i))
            continue
        if kernel.get("outside"):
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(kernel["outside"].items()))
            findings.append(Finding("kernel", f"{where}: the program computes outside the kernel: {ops}", i))
            continue
        if rec.get("error"):
            findings.append(Finding("run", f"{where}: {str(rec['error'])[:400]}", i))
            continue
        out = outputs[i] if i < len(outputs) else None
        want = output_shapes[i]
        if out is None or sorted(out) != sorted(want) or any(
                tuple(out[k].shape) != tuple(want[k]) or out[k].dtype.kind != "f" for k in want):
            got = {k: (tuple(v.shape), str(v.dtype)) for k, v in (out or {}).items()}
            findings.append(Finding("output", f"{where}: returned {got or rec.get('output_types') or 'nothing'}; "
                                              f"the output is {dict(want)} floating point", i))
            continue
        if rec.get("inputs_after") != digest(inputs[i]):
            findings.append(Finding("inputs", f"{where}: the inputs' bytes changed during the run", i))
            continue
        if rec.get("races"):
            findings.append(Finding("race", f"{where}: {rec.get('race_report') or 'the race detector found a race'}", i))
            continue
        verdict = check(plan.family, inputs[i], out, plan.dtype)
        if not verdict.passed:
            findings.append(Finding("oracle", f"{where}: {verdict.reason}", i))
    if written:  # a whole-run finding, and the gravest: first
        shown = ", ".join(written[:3]) + (f" and {len(written) - 3} more" if len(written) > 3 else "")
        findings.insert(0, Finding("writes", f"changed {shown}", None))
    return GateVerdict(not findings, tuple(findings), ran, plan)


def judge_cases(plan: GatePlan, inputs: Sequence[Mapping[str, np.ndarray]], records: Sequence[Mapping[str, Any]],
                outputs: Sequence[Mapping[str, np.ndarray] | None], check: Callable, skip: int = 0) -> GateVerdict:
    """Judge the device gate's cases from ``skip`` on (case 0, the gate's own capture, is judged by the capture):
    ``records[i]`` what the worker recorded of case ``skip + i`` (``error``, ``inputs_after``), ``outputs[i]``
    what the kernel returned, ``inputs[i]`` what the parent made. ``check(family, inputs, outputs, dtype)`` is the
    oracle; every failure is a finding naming the stage and the case's shape."""
    findings: list[Finding] = []
    ran = 0
    for i, case in enumerate(plan.cases[skip:]):
        n = skip + i
        rec = records[i] if i < len(records) else {"error": "the worker stopped before this case"}
        where = f"case {n} ({case.label()})"
        ran += 1
        if rec.get("error"):
            findings.append(Finding("run", f"{where}: {str(rec['error'])[:400]}", n))
            continue
        out = outputs[i] if i < len(outputs) else None
        if not out:
            findings.append(Finding("output", f"{where}: returned no output", n))
            continue
        if rec.get("inputs_after") != digest(inputs[i]):
            findings.append(Finding("inputs", f"{where}: the inputs' bytes changed during the run", n))
            continue
        try:
            verdict = check(plan.family, inputs[i], out, plan.dtype)
        except BadInput as exc:
            findings.append(Finding("output", f"{where}: {exc.what}", n))
            continue
        if not verdict.passed:
            findings.append(Finding("oracle", f"{where}: {verdict.reason}", n))
    return GateVerdict(not findings, tuple(findings), ran, plan)


# -- the child: runs the candidate, judges nothing ---------------------------------------------------------

def _child(request: Mapping[str, Any]) -> dict:
    """Run every case of ``request`` through the language backend's ``interpret`` (CPU) and record what the
    candidate did; outputs go to ``outputs-<i>.npz`` in the work directory."""
    from mosaic.kernel_files import KernelFile, file_backend
    from mosaic.records import KernelSpec

    if request.get("template"):  # a template candidate: the language backend itself runs it (no kernel file)
        from mosaic.plugins import host

        backend = host().get("languages", request["language"]).backend
    else:
        kfile = KernelFile.from_json(request["kernel_file"])
        backend = file_backend(kfile, request["language"])
    run = getattr(backend, "interpret", None)
    if run is None:
        return {"unavailable": f"language '{request['language']}' has no CPU run of a kernel file (interpret); its "
                               "gate runs on the GPU", "cases": []}
    why = getattr(backend, "interpret_unavailable", lambda: None)()
    if why:  # this machine cannot run the language: no verdict on the candidate
        return {"unavailable": why, "cases": []}
    program = getattr(backend, "program_check", None)
    work = Path(request["work"])
    cases = []
    for i, case in enumerate(request["cases"]):
        spec = KernelSpec(family=request["family"], shape=case["shape"], dtype=request["dtype"],
                          language=request["language"], knobs=request.get("knobs") or {})
        with np.load(work / f"inputs-{i}.npz", allow_pickle=False) as z:
            inputs = {k: z[k] for k in z.files}
        rec: dict[str, Any] = {}
        try:
            if program is not None:
                rec["kernel"] = program(spec)
            result = run(spec, {k: v.copy() for k, v in inputs.items()} if request.get("copy_inputs") else inputs)
            outs = result["outputs"]
            rec["output_types"] = {k: type(v).__name__ for k, v in outs.items()}
            arrays = {k: v for k, v in outs.items() if isinstance(v, np.ndarray)}
            np.savez(work / f"outputs-{i}.npz", **arrays)
            rec["races"] = bool(result.get("races"))
            if result.get("race_report"):
                rec["race_report"] = str(result["race_report"])[:600]
        except Exception as exc:  # noqa: BLE001 - the candidate's failure is a finding, recorded
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
            rec["error"] = f"{type(exc).__name__}: {first[:400]}"
        rec["inputs_after"] = digest(inputs)
        cases.append(rec)
    return {"cases": cases}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m mosaic.gate REQUEST.json", file=sys.stderr)
        return 2
    request = json.loads(Path(args[0]).read_text())
    try:
        report = _child(request)
    except Exception as exc:  # noqa: BLE001 - a broken candidate or plugin: one line for the parent
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        report = {"error": f"{type(exc).__name__}: {first[:400]}", "cases": []}
    Path(request["work"], "report.json").write_text(json.dumps(report))
    return 0


# -- the parent ----------------------------------------------------------------------------------------------

def output_shapes(kfile, case: GateCase, family: str) -> dict[str, tuple]:
    """The output arrays' shapes for ``case``: the operands' dimensions read from the full shape (optional entries
    such as ``kv_heads`` filled in with their defaults)."""
    from mosaic.families import full_shape

    full = full_shape(family, case.shape)
    if isinstance(kfile, Template):
        return kfile.backend.output_shapes(family, full)
    return {o.name: o.shape(full) for o in kfile.outputs}


@attrs.frozen
class Template:
    """A template (knob) candidate where the gate takes a kernel file: its language's backend runs it
    (``interpret(spec, inputs)``, ``output_shapes(family, shape)``) and its predicate says which shapes it takes."""

    language: str
    backend: Any = attrs.field(eq=False)
    allowed: Callable[[Mapping[str, int]], str | None] = attrs.field(eq=False)

    def to_json(self) -> None:
        return None


def run_cpu_gate(kfile, language: str, family: str, dtype: str, shape: Mapping[str, int],
                 knobs: Mapping[str, Any] | None = None, guard: Sequence[str | os.PathLike] = (),
                 timeout: float = 600.0, plan: GatePlan | None = None,
                 progress: Callable[[str], None] | None = None, keep: str | os.PathLike | None = None) -> GateVerdict:
    """Draw the plan (unless given), make every case's inputs here, run the candidate in a child process whose
    working directory, HOME and TMPDIR are a fresh directory of its own, and judge what it returned; a file
    changed under ``guard`` (the campaign directory) is a ``writes`` finding. ``keep``: a directory that receives
    every case's ``inputs-<i>.npz`` / ``outputs-<i>.npz`` and the child's ``report.json`` before the work
    directory goes."""
    from mosaic.families import make_inputs
    from mosaic.records import KernelSpec

    knobs = dict(knobs or {})
    plan = plan or draw_plan(family, shape, dtype, kfile.granules(knobs), max_elements=CPU_MAX_ELEMENTS)
    template = isinstance(kfile, Template)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mosaic-gate-") as tmp:
        work = Path(tmp)
        inputs = []
        for i, case in enumerate(plan.cases):
            spec = KernelSpec(family=family, shape=dict(case.shape), dtype=dtype, language=language, knobs=knobs)
            arrays = make_inputs(spec, case.seed, case.values)
            np.savez(work / f"inputs-{i}.npz", **arrays)
            inputs.append(arrays)
        request = {"kernel_file": kfile.to_json(), "template": template, "language": language, "family": family,
                   "dtype": dtype,
                   "knobs": knobs, "work": str(work), "cases": [{"shape": dict(c.shape)} for c in plan.cases]}
        req = work / "request.json"
        req.write_text(json.dumps(request))
        before = snapshot(guard)
        # the interpreter runs on the CPU: the child sees no GPU (on a campaign's host the worker holds it)
        env = {**os.environ, "HOME": str(work), "TMPDIR": str(work), "PYTHONDONTWRITEBYTECODE": "1",
               "CUDA_VISIBLE_DEVICES": ""}
        if progress:
            progress(f"gate: {len(plan.cases)} cases ({len(plan.shapes)} shapes x {len(plan.seeds)} seeds x "
                     f"{len(plan.distributions)} distributions) in a child process")
        try:
            proc = subprocess.run([sys.executable, "-m", "mosaic.gate", str(req)], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=timeout)
            report = json.loads((work / "report.json").read_text()) if (work / "report.json").is_file() else \
                {"error": f"the child exited {proc.returncode} without a report: "
                          f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:] or ''}", "cases": []}
        except subprocess.TimeoutExpired:
            report = {"error": f"the child ran past {timeout:.0f} s and was killed", "cases": []}
        written = changed_files(before, snapshot(guard))
        if report.get("unavailable") and not written:
            return GateVerdict(False, (), 0, plan, time.monotonic() - t0, unavailable=str(report["unavailable"]))
        outputs: list = []
        for i in range(len(plan.cases)):
            p = work / f"outputs-{i}.npz"
            if p.is_file():
                with np.load(p, allow_pickle=False) as z:
                    outputs.append({k: z[k] for k in z.files})
            else:
                outputs.append(None)
        verdict = judge(plan, inputs, report, outputs, [output_shapes(kfile, c, plan.family) for c in plan.cases], written)
        if keep is not None:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for p in work.glob("*.npz"):
                shutil.copyfile(p, Path(keep) / p.name)
            (Path(keep) / "report.json").write_text(json.dumps(report))
    return attrs.evolve(verdict, wall_s=time.monotonic() - t0)


def cpu_shape(family: str, granules: Mapping[str, int]) -> dict[str, int]:
    """The campaign shape of the CPU stage: the family's example shape, each dimension rounded up to a multiple
    of what the kernel declares (the interpreter runs one CTA after another: a campaign's own shape is too large)."""
    from mosaic import families

    fam = families.get(family)
    if fam is None:
        raise BadInput(f"no family '{family}'", "--family")
    out = {}
    for d in fam.dims:
        g = max(1, int(granules.get(d, 1)))
        out[d] = -(-max(int(fam.example[d]), g) // g) * g
    return out


def interprets(kfile, language: str) -> bool:
    """True when ``language``'s backend runs this kernel file on the CPU (``interpret``); nothing is imported
    beyond the plugin's backend."""
    from mosaic.errors import MosaicError
    from mosaic.kernel_files import file_backend

    try:
        return hasattr(file_backend(kfile, language), "interpret")
    except MosaicError:
        return False


def template_interprets(language: str, family: str) -> Template | None:
    """The :class:`Template` of ``language``'s ``family`` template when its backend runs it on the CPU
    (``interprets(family)``, ``interpret``, ``output_shapes``) and its knob class has a predicate
    (``DEPENDENCIES.check``); None otherwise."""
    from mosaic.plugins import host
    from mosaic.proposers.dependencies import dependencies_of

    try:
        backend = host().get("languages", language).backend
        knob_cls = backend.knobs(family)
    except Exception:  # noqa: BLE001 - no such language or family here: no CPU stage
        return None
    runs = getattr(backend, "interprets", None)
    deps = dependencies_of(knob_cls)
    if runs is None or not runs(family) or deps is None or deps.check is None:
        return None
    return Template(language, backend, lambda shape: None)


def template_stage(language: str, family: str, dtype: str, knobs: Mapping[str, Any], gpu,
                   guard: Sequence[str | os.PathLike] = (), timeout: float = 600.0,
                   progress: Callable[[str], None] | None = None) -> GateVerdict | None:
    """The gate's CPU stage for a template candidate (``knobs`` of ``language``'s ``family`` template) that its
    backend runs in the interpreter: the family's example shape (doubled until the template's ``can_implement``
    takes it) and two unseen shapes inside ``can_implement``, x two seeds x every distribution. None when the
    template does not run on the CPU (:func:`template_interprets`)."""
    from mosaic import families
    from mosaic.proposers.dependencies import dependencies_of
    from mosaic.records import KernelSpec

    t = template_interprets(language, family)
    if t is None:
        return None
    why = getattr(t.backend, "interpret_unavailable", lambda: None)()
    if why:
        return GateVerdict(False, (), 0, None, unavailable=why)
    knob_cls = t.backend.knobs(family)
    check = dependencies_of(knob_cls).check
    own = knob_cls(**dict(knobs))

    def allowed(shape: Mapping[str, int]) -> str | None:
        spec = KernelSpec(family=family, shape=dict(shape), dtype=dtype, language=language, knobs=dict(knobs))
        try:
            found = check(own, spec, gpu)
        except Exception as exc:  # noqa: BLE001 - a predicate that cannot judge a shape refuses it
            return f"{type(exc).__name__}: {exc}"
        return "; ".join(d.line() for d in found) or None

    fam = families.get(family)
    shape = {d: int(v) for d, v in fam.example.items()}
    for _ in range(10):
        if allowed(shape) is None:
            break
        shape = {d: (v * 2 if d in fam.dims else v) for d, v in shape.items()}
    else:
        return GateVerdict(False, (), 0, None, unavailable=f"no CPU-sized shape that the template takes "
                                                          f"({allowed(shape)})")
    plan, missing = device_plan(family, shape, dtype, draw_seeds(), allowed=allowed, max_elements=CPU_MAX_ELEMENTS,
                                campaign_distributions=None)
    if progress and missing:
        progress(f"gate: {'; '.join(missing)}")
    return run_cpu_gate(attrs.evolve(t, allowed=allowed), language, family, dtype, shape, dict(knobs), guard=guard,
                        timeout=timeout, plan=plan, progress=progress)


def cpu_stage(kfile, language: str, family: str, dtype: str, knobs: Mapping[str, Any] | None = None,
              guard: Sequence[str | os.PathLike] = (), timeout: float = 600.0,
              progress: Callable[[str], None] | None = None) -> GateVerdict:
    """The gate's CPU stage for one kernel file, before any hardware: :func:`run_cpu_gate` at :func:`cpu_shape`
    and two unseen shapes, in the language's interpreter (Pallas: jax's, race detector on)."""
    own = {k: v for k, v in dict(knobs or {}).items() if kfile.knob(k) is not None}
    return run_cpu_gate(kfile, language, family, dtype, cpu_shape(family, kfile.granules(own)), own, guard=guard,
                        timeout=timeout, progress=progress)


__all__ = ["CPU_MAX_ELEMENTS", "DEVICE_MAX_ELEMENTS", "DEVICE_PLAN", "Finding", "GateCase", "GatePlan",
           "GateVerdict", "STAGES", "Template", "campaign_seeds", "changed_files", "cpu_shape",
           "cpu_stage", "device_plan", "digest", "draw_plan", "draw_seeds", "interprets", "judge",
           "judge_cases", "predicate_granules", "run_cpu_gate", "snapshot", "template_interprets",
           "template_stage", "unseen_shapes"]

if __name__ == "__main__":
    raise SystemExit(main())
