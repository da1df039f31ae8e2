"""``mosaic fuzz``: random shapes, dtypes, value distributions and seeds for one kernel file against the float64
oracle, until a time budget is spent or a case fails; the failing case is shrunk and written as a bundle.

Each batch is one child process of the gate (:func:`mosaic.gate.run_cpu_gate`), so every case meets every stage of
the gate (kernel, run, output, inputs, race, oracle) and the parent judges. Shapes are drawn inside what the
file declares (``MULTIPLE_OF``): each dimension an odd or even multiple of its granule, the product under
:data:`MAX_ELEMENTS`. Runs where the kernel file's language runs on the CPU (Pallas: jax's GPU interpreter);
a language without a CPU run is refused with one line (its fuzzing needs the device, not built yet).

Shrinking: each dimension of the failing case is halved toward its granule while the case still fails at the
same stage (same seed and distribution; the inputs of a smaller shape are another draw of the same generator),
one dimension at a time, until no halving fails. The smallest failing case goes to ``OUT/smallest-failure.bundle``:
the kernel file, the case's inputs and the kernel's outputs, and ``fuzz.json`` (the case, the finding, the seed).
"""

from __future__ import annotations

import json
import random
import secrets
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from mosaic.errors import BadInput
from mosaic.gate import GateCase, GatePlan, run_cpu_gate

MAX_ELEMENTS = 1 << 16
BATCH = 8
SHRINK_LIMIT = 24  # gate runs spent shrinking at most


@attrs.frozen
class FuzzResult:
    cases: int
    batches: int
    wall_s: float
    failure: dict | None = None  # {"case", "finding"} of the first failure found
    smallest: dict | None = None  # the shrunk case and its finding
    bundle: str | None = None
    seed: int = 0
    unavailable: str = ""

    def to_json(self) -> dict:
        return attrs.asdict(self)


def draw_case(rng: random.Random, dims: Sequence[str], granules: Mapping[str, int], distributions: Sequence[str],
              max_elements: int = MAX_ELEMENTS) -> GateCase:
    shape: dict[str, int] = {}
    for d in dims:
        g = max(1, int(granules.get(d, 1)))
        shape[d] = g * rng.randint(1, max(1, 512 // g))
    while _elements(shape) > max_elements:
        big = max(shape, key=lambda d: shape[d] // max(1, int(granules.get(d, 1))))
        g = max(1, int(granules.get(big, 1)))
        if shape[big] <= g:
            break
        shape[big] = max(g, (shape[big] // 2) // g * g)
    return GateCase(shape, rng.randrange(1, 2**31), rng.choice(list(distributions)), seen=False)


def _elements(shape: Mapping[str, int]) -> int:
    n = 1
    for v in shape.values():
        n *= int(v)
    return n


def _plan(family: str, dtype: str, cases: Sequence[GateCase]) -> GatePlan:
    return GatePlan(family, dtype, tuple(dict(c.shape) for c in cases), tuple(c.seed for c in cases),
                    tuple(sorted({c.values for c in cases})), tuple(cases))


def _halvings(case: GateCase, granules: Mapping[str, int]) -> list[GateCase]:
    out = []
    for d, v in case.shape.items():
        g = max(1, int(granules.get(d, 1)))
        smaller = max(g, (v // 2) // g * g)
        if smaller < v:
            out.append(attrs.evolve(case, shape={**case.shape, d: smaller}))
    return out


def fuzz(kfile, language: str, family: str, dtypes: Sequence[str], knobs: Mapping[str, Any] | None = None,
         minutes: float = 5.0, out: str | Path | None = None, seed: int | None = None, batch: int = BATCH,
         progress: Callable[[str], None] | None = None, max_cases: int | None = None) -> FuzzResult:
    """Fuzz one kernel file for ``minutes`` (or ``max_cases``); stop at the first failure, shrink it and write the
    smallest failing case under ``out``."""
    from mosaic import families

    fam = families.get(family)
    if fam is None:
        raise BadInput(f"no family '{family}'", "--family")
    bad = [d for d in dtypes if d not in fam.dtypes]
    if bad or not dtypes:
        raise BadInput(f"dtype(s) {', '.join(bad) or 'none'}: {family} takes {', '.join(fam.dtypes)}", "--dtype")
    knobs = {k: v for k, v in dict(knobs or {}).items() if kfile.knob(k) is not None}
    granules = kfile.granules(knobs)
    seed = secrets.randbelow(2**31) if seed is None else int(seed)
    rng = random.Random(seed)
    dists = tuple(fam.distributions or ("normal",))
    t0 = time.monotonic()
    deadline = t0 + minutes * 60.0
    cases = batches = 0
    say = progress or (lambda line: None)
    while time.monotonic() < deadline and (max_cases is None or cases < max_cases):
        dtype = rng.choice(list(dtypes))
        drawn = [draw_case(rng, fam.dims, granules, dists) for _ in range(batch)]
        v = run_cpu_gate(kfile, language, family, dtype, drawn[0].shape, knobs, plan=_plan(family, dtype, drawn))
        batches += 1
        if v.unavailable:
            return FuzzResult(cases, batches, time.monotonic() - t0, seed=seed, unavailable=v.unavailable)
        if v.passed:
            cases += len(drawn)
            say(f"fuzz: {cases} cases passed ({batches} batches, {time.monotonic() - t0:.0f} s)")
            continue
        f = v.first
        failing = drawn[f.case] if f.case is not None else drawn[0]
        cases += (f.case + 1) if f.case is not None else len(drawn)
        say(f"fuzz: case {cases} failed [{f.stage}] at {failing.label()} {dtype}; shrinking")
        first = {"case": failing.to_json() | {"dtype": dtype}, "finding": f.to_json()}
        small, finding = _shrink(kfile, language, family, dtype, knobs, failing, f, granules, say)
        bundle = _write(out, kfile, language, family, dtype, knobs, small, finding, seed) if out else None
        return FuzzResult(cases, batches, time.monotonic() - t0, first,
                          {"case": small.to_json() | {"dtype": dtype}, "finding": finding.to_json()},
                          str(bundle) if bundle else None, seed)
    return FuzzResult(cases, batches, time.monotonic() - t0, seed=seed)


def _shrink(kfile, language, family, dtype, knobs, case: GateCase, finding, granules, say):
    """Halve dimensions while the case still fails at the same stage; (smallest case, its finding)."""
    runs = 0
    while runs < SHRINK_LIMIT:
        tries = _halvings(case, granules)
        if not tries:
            break
        v = run_cpu_gate(kfile, language, family, dtype, tries[0].shape, knobs, plan=_plan(family, dtype, tries))
        runs += 1
        hit = next((f for f in v.findings if f.case is not None and f.stage == finding.stage), None)
        if hit is None:
            break
        case, finding = tries[hit.case], attrs.evolve(hit, case=0)
        say(f"fuzz: still fails [{finding.stage}] at {case.label()}")
    return case, finding


def _write(out, kfile, language, family, dtype, knobs, case: GateCase, finding, seed: int) -> Path:
    """The smallest failing case as a bundle: the file, its inputs and outputs, and what failed."""
    from mosaic import safe_paths
    from mosaic.bundle import save_bundle
    from mosaic.records import KernelSpec

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mosaic-fuzz-") as tmp:
        v = run_cpu_gate(kfile, language, family, dtype, case.shape, knobs, plan=_plan(family, dtype, [case]),
                         keep=tmp)
        files: dict[str, tuple[str, Any]] = {f"source/{kfile.name}": ("source", kfile.source)}
        for name, role in (("inputs-0.npz", "inputs"), ("outputs-0.npz", "outputs")):
            if (Path(tmp) / name).is_file():
                files[f"{role}.npz"] = (role, (Path(tmp) / name).read_bytes())
        record = {"case": case.to_json() | {"dtype": dtype}, "finding": finding.to_json(), "fuzz_seed": seed,
                  "reproduced": not v.passed, "verdict": v.to_json()}
        files["fuzz.json"] = ("metrics", json.dumps(record, indent=1))
        spec = KernelSpec(family=family, shape=dict(case.shape), dtype=dtype, language=language, knobs=dict(knobs),
                          name=kfile.name)
        dest = safe_paths.no_link(out / "smallest-failure.bundle")
        save_bundle(dest, kernel=spec, language=language, files=files, overwrite=True,
                    extra={"kernel_file": {**kfile.to_json(), "path": kfile.name, "knob_values": dict(knobs)}, "fuzz": {"finding": finding.to_json(),
                                                                    "seed": case.seed, "values": case.values}})
    return dest


__all__ = ["BATCH", "FuzzResult", "MAX_ELEMENTS", "draw_case", "fuzz"]
