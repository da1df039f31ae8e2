"""What a campaign costs: device minutes per timed candidate, lowering wait per step, CPU lowerings per minute.

Two parts:

* ``journal DIR [DIR ...]`` — the GPU columns, read from finished campaign directories (their ``journal.jsonl``
  and ``bundles/``; no GPU needed to read them): device minutes, timed candidates, device minutes per timed
  candidate, and per step the seconds the loop waited for the candidate's lowering (a bundle's
  ``mosaic_run.lower_wait_s``; for bundles written before that field, its cost less the gate's and the timing
  sessions' wall seconds, which is what the rest of the cost is made of), the executor and the GPUs (UUIDs) that
  made the verdicts.
* ``lowering --language cute --lowerings N --cores 1,2`` — the CPU part, run here: N real lower-only captures
  (distinct knob sets, so no compiler cache is shared between the rows) through the Ray executor's lowering
  stage (:class:`mosaic.run.executor.LoweringStage`) on a local Ray runtime of 1 and of C CPUs; lowerings per
  minute of wall time for each.

``--json OUT`` writes the rows as JSON too. Example::

    .venv/bin/python benchmarks/campaign_cost.py journal examples/h200-pallas-to-cute-gemm-4096
    .venv/bin/python benchmarks/campaign_cost.py lowering --language cute --python .venv312/bin/python \\
        --lowerings 4 --cores 1,2
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path


def _bundle_of(directory: Path, key: str) -> Path | None:
    p = directory / "bundles" / f"cand-{key}.bundle"
    return p if (p / "manifest.json").is_file() else None


def lower_wait_s(bundle: Path) -> float | None:
    """Seconds the loop waited for this candidate's lowering (see the module's docstring)."""
    m = json.loads((bundle / "manifest.json").read_text())
    run = m.get("mosaic_run") or {}
    if "lower_wait_s" in run:
        return float(run["lower_wait_s"])
    if not (run.get("build") or {}).get("ok", True):
        return float(run.get("cost_s", 0.0))  # an unbuildable setting costs its lowering only
    gate = float((m.get("capture") or {}).get("wall_s") or 0.0)
    t = bundle / "timings.json"
    sessions = json.loads(t.read_text()).get("sessions", []) if t.is_file() else []
    return max(0.0, float(run.get("cost_s", 0.0)) - gate - sum(float(s.get("wall_s") or 0.0) for s in sessions))


def compile_s(bundle: Path) -> float | None:
    """The lowering's own compile seconds (CuTe: ``compile_seconds=`` among ``lowering.json``'s notes): what
    the worker pays again when it compiles the candidate a second time inside the gate."""
    p = bundle / "lowering.json"
    if not p.is_file():
        return None
    for note in json.loads(p.read_text()).get("notes") or []:
        if isinstance(note, str) and note.startswith("compile_seconds="):
            return float(note.split("=", 1)[1])
    return None


def journal_costs(directory: Path) -> dict:
    from mosaic.run.journal import read_campaign_journal

    events, _ = read_campaign_journal(directory / "journal.jsonl")
    head = events[0]
    stop = next((e for e in events if e["event"] == "stop"), None)
    steps = []
    for e in events:
        if e["event"] == "build" and isinstance(e.get("step"), int):
            b = _bundle_of(directory, e["key"])
            steps.append({"step": e["step"], "key": e["key"], "ok": e["ok"],
                          "lower_wait_s": None if b is None else round(lower_wait_s(b), 3),
                          "compile_s": None if b is None else compile_s(b),
                          "gate_s": None if b is None else (json.loads((b / "manifest.json").read_text())
                                                            .get("capture") or {}).get("wall_s")})
    gpus = sorted({(e.get("gpu") or {}).get("uuid") for e in events if e["event"] == "timed"} - {None})
    cost_s = float(stop["cost_s"]) if stop else sum(float(e.get("cost_s") or 0.0) for e in events)
    timed = stop["timed"] if stop else sum(1 for e in events if e["event"] == "verdict" and e.get("t_incumbent"))
    waits = [s["lower_wait_s"] for s in steps if s["lower_wait_s"] is not None]
    return {"campaign": str(directory), "executor": head.get("executor", "local (not recorded)"),
            "problem": (head.get("campaign") or {}).get("shape"), "target": (head.get("campaign") or {}).get("target"),
            "stop": stop["stop"] if stop else "unfinished", "device_min": round(cost_s / 60, 3), "timed": timed,
            "ahead_unused_min": (round(stop["ahead_unused_cost_s"] / 60, 3)
                                 if stop and "ahead_unused_cost_s" in stop else None),
            "device_min_per_timed": round(cost_s / 60 / timed, 3) if timed else None,
            "lower_wait_mean_s": round(statistics.mean(waits), 2) if waits else None,
            "lower_wait_max_s": round(max(waits), 2) if waits else None, "gpus": gpus, "steps": steps}


def lowering_rates(language: str, n: int, cores: list[int], python: str, gpu: str, shape: dict,
                   timeout: float) -> list[dict]:
    import ray
    from mosaic.records import KernelSpec
    from mosaic.run.executor import CaptureLowerer, LoweringStage
    from mosaic.run.workbench import Kernel, candidate_key

    sets = {"cute": ({"stages": s, "swizzle": w, "raster": r}  # raster 'n' only with a swizzle (the knob's rule)
                     for s, w, r in itertools.product(range(2, 9), (1, 2, 4, 8), ("m", "n")) if r == "m" or w > 1),
            "cutlass": ({"stages": s, "tile_n": t} for s, t in itertools.product(range(2, 8), (128, 256)))}
    if language not in sets:
        raise SystemExit(f"--language: one of {', '.join(sets)}")
    knob_sets = list(itertools.islice(sets[language], n * len(cores)))
    if len(knob_sets) < n * len(cores):
        raise SystemExit(f"--lowerings {n} x {len(cores)} core counts needs more distinct {language} knob sets")
    rows = []
    for i, c in enumerate(cores):
        kernels = []
        for knobs in knob_sets[i * n:(i + 1) * n]:
            spec = KernelSpec("gemm", shape, "bf16", language, knobs)
            kernels.append(Kernel(candidate_key(spec), spec))
        ray.init(num_cpus=c, include_dashboard=False, log_to_driver=False)
        try:
            stage = LoweringStage(CaptureLowerer(gpu, timeout, {language}, python), parallel=c)
            t0 = time.monotonic()
            stage.submit(kernels)
            got = [stage.take(k.key) for k in kernels]
            wall = time.monotonic() - t0
        finally:
            ray.shutdown()
        statuses = sorted({g.status for g in got})
        for g in got:
            if g.status != "lowered":
                print(f"  {g.key}: {g.status}: {g.message[:300]}", flush=True)
        rows.append({"cores": c, "lowerings": n, "wall_s": round(wall, 2),
                     "lowerings_per_min": round(n / wall * 60, 2), "each_s": [round(g.wall_s, 2) for g in got],
                     "statuses": statuses, "loop_wait_s": [round(stage.waits[k.key], 2) for k in kernels]})
        print(f"{c} core(s): {n} {language} lowerings in {wall:.1f} s = {n / wall * 60:.2f}/min "
              f"(each {', '.join(f'{g.wall_s:.1f}' for g in got)} s; {', '.join(statuses)})", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="part", required=True)
    j = sub.add_parser("journal", help="GPU columns from finished campaign directories")
    j.add_argument("dirs", nargs="+", type=Path)
    lo = sub.add_parser("lowering", help="CPU lowerings per minute with 1 and N cores (Ray lowering stage)")
    lo.add_argument("--language", default="cute")
    lo.add_argument("--lowerings", type=int, default=4)
    lo.add_argument("--cores", default="1,2")
    lo.add_argument("--python", default=sys.executable, help="the interpreter whose env has the language's plugin")
    lo.add_argument("--gpu", default="h200")
    lo.add_argument("--shape", default="4096x4096x4096")
    lo.add_argument("--timeout", type=float, default=600.0)
    for p in (j, lo):
        p.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.part == "journal":
        rows = []
        for d in a.dirs:
            if not (d / "journal.jsonl").is_file():
                print(f"{d}: no journal.jsonl", file=sys.stderr)
                return 2
            rows.append(journal_costs(d))
        print("| campaign | executor | stop | device min | + unused ahead (other GPUs) | timed | device min / timed "
              "| lowering wait mean / max (s) | GPUs |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['campaign']} | {r['executor']} | {r['stop']} | {r['device_min']} | "
                  f"{r['ahead_unused_min'] if r['ahead_unused_min'] is not None else '-'} | {r['timed']} | "
                  f"{r['device_min_per_timed']} | {r['lower_wait_mean_s']} / {r['lower_wait_max_s']} | "
                  f"{', '.join(r['gpus']) or 'not recorded'} |")
        for r in rows:
            print(f"\n{r['campaign']}: per step: lowering wait / lowering's compile / gate (incl. the worker's "
                  "second compile) (s): "
                  + ", ".join(f"{s['step']}: {s['lower_wait_s']} / {s['compile_s']} / {s['gate_s']}" for s in r["steps"]))
    else:
        from mosaic.families import parse_shape

        cores = [int(c) for c in a.cores.split(",")]
        rows = lowering_rates(a.language, a.lowerings, cores, a.python, a.gpu, parse_shape("gemm", a.shape),
                              a.timeout)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
