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
* ``compile-once --python .venv312/bin/python --rounds R`` — what the CuTe artifact store
  (``mosaic_target_cute.artifact_store``) saves the GPU worker per candidate, on the CPU: the template gemm
  (default knobs unless ``--knob K=V``) is lowered once into a fresh store, then R times each, every time in a
  fresh process (no in-memory JIT cache), the worker's two ways to get the kernel are timed after CuTe DSL's
  import: ``cute.compile`` of the same kernel (what it did before) and loading the lowering's artifact (what it
  does now); plus the lowering's extra cost (writing the artifact). Also checks the artifact's cubin is the
  lowering's, byte for byte, and that the artifact's object file embeds it.

``--json OUT`` writes the rows as JSON too. Example::

    .venv/bin/python benchmarks/campaign_cost.py journal examples/h200-pallas-to-cute-gemm-4096
    .venv/bin/python benchmarks/campaign_cost.py lowering --language cute --python .venv312/bin/python \\
        --lowerings 4 --cores 1,2
    .venv/bin/python benchmarks/campaign_cost.py compile-once --python .venv312/bin/python --rounds 5
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _device import gpu_record


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
    from mosaic.bundle import load_bundle

    timings = load_bundle(bundle, verify=False).read_json("timings")  # read through its storage (maybe xz)
    sessions = (timings or {}).get("sessions", [])
    return max(0.0, float(run.get("cost_s", 0.0)) - gate - sum(float(s.get("wall_s") or 0.0) for s in sessions))


def compile_s(bundle: Path) -> float | None:
    """The lowering's own compile seconds (CuTe: ``compile_seconds=`` among ``lowering.json``'s notes): what
    the worker pays again when it compiles the candidate a second time inside the gate."""
    from mosaic.bundle import load_bundle

    b = load_bundle(bundle, verify=False)
    if "lowering.json" not in b.manifest["files"]:
        return None
    for note in json.loads(b.read_bytes("lowering.json", "json_bytes")).get("notes") or []:
        if isinstance(note, str) and note.startswith("compile_seconds="):
            return float(note.split("=", 1)[1])
    return None


def prepared_how(bundle: Path) -> str | None:
    """How the GPU worker got the candidate's kernel (the gate's ``capture.isolation.prepared``): ``compiled``,
    ``cached``, or, for CuTe with the artifact store, ``loaded artifact ...`` / ``compiled in ... s: <why>``."""
    iso = (json.loads((bundle / "manifest.json").read_text()).get("capture") or {}).get("isolation") or {}
    made = iso.get("prepared") or {}
    return "; ".join(str(v) for v in made.values()) or None


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
                                                            .get("capture") or {}).get("wall_s"),
                          "prepared": None if b is None else prepared_how(b)})
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


# run in a fresh process of the cute plugin's Python: argv = mode, shape "MxNxK", knobs JSON, GPU name, work dir
COMPILE_ONCE_PROBE = r"""
import json, sys, time
from pathlib import Path
mode, shape, knobs, gpu_name, work = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
import cutlass.cute  # noqa: F401 - the import is paid by either way; not timed
from mosaic.plugins import PluginHost
from mosaic.records import KernelSpec
from mosaic_target_cute import artifact_store
from mosaic_target_cute.backend import CuteBackend
from mosaic_target_cute.knobs import GemmKnobs
from mosaic_target_cute.lowering import compile_gemm, line_info
gpu = PluginHost(allow="hopper").load().get("gpus", gpu_name)
m, n, k = (int(v) for v in shape.split("x"))
spec = KernelSpec("gemm", {"m": m, "n": n, "k": k}, "bf16", "cute", knobs)
g = GemmKnobs(**knobs)
key = artifact_store.artifact_key(artifact_store.key_inputs(g, m, n, k, "bf16", gpu.arch, gpu.sm_count, line_info()))
out = {"mode": mode, "key": key}
t = time.perf_counter()
if mode == "lower":
    low = CuteBackend().lower(spec, gpu, work)
    out["notes"] = list(low.notes)
    out["cubin"] = str(low.cubin)
elif mode == "compile":
    compile_gemm(g, m, n, k, "bf16", gpu.arch, gpu.sm_count, work)
else:
    got = artifact_store.load(key)
    if isinstance(got, str):
        raise SystemExit(got)
    out["cubin"] = str(got.build.cubin)
out["seconds"] = time.perf_counter() - t
print("PROBE " + json.dumps(out))
"""


def _probe(python: str, mode: str, shape: str, knobs: dict, gpu: str, work: Path, env: dict) -> dict:
    p = subprocess.run([python, "-c", COMPILE_ONCE_PROBE, mode, shape, json.dumps(knobs), gpu, str(work)],
                       capture_output=True, text=True, env=env, timeout=600)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"compile-once probe '{mode}' failed (exit {p.returncode}): "
                         f"{(p.stderr or p.stdout).strip().splitlines()[-1:] or ''}")
    return json.loads(line[len("PROBE "):])


def compile_once(python: str, rounds: int, shape: str, knobs: dict, gpu: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="mosaic-compile-once-") as tmp:
        env = {**os.environ, "MOSAIC_CUTE_ARTIFACTS": str(Path(tmp) / "store")}
        low = _probe(python, "lower", shape, knobs, gpu, Path(tmp) / "lower", env)
        entry = Path(tmp) / "store" / low["key"]
        manifest = json.loads((entry / "manifest.json").read_text())
        lowered_cubin = Path(low["cubin"]).read_bytes()
        same = (entry / "kernel.cubin").read_bytes() == lowered_cubin
        embedded = lowered_cubin in (entry / "kernel.o").read_bytes()
        object_bytes = (entry / "kernel.o").stat().st_size
        compiles, loads = [], []
        for r in range(rounds):  # alternate, so a change of load on the machine hits both columns alike
            compiles.append(_probe(python, "compile", shape, knobs, gpu, Path(tmp) / f"compile{r}", env)["seconds"])
            loads.append(_probe(python, "load", shape, knobs, gpu, Path(tmp) / f"load{r}", env)["seconds"])
    row = {"shape": shape, "knobs": knobs, "key": low["key"], "rounds": rounds,
           "lowering_compile_s": next(float(x.split("=")[1]) for x in low["notes"] if x.startswith("compile_seconds=")),
           "artifact_export_s": manifest["export_seconds"], "artifact_note": next(
               x for x in low["notes"] if x.startswith("artifact=")),
           "worker_compile_s": [round(x, 3) for x in compiles], "worker_load_s": [round(x, 4) for x in loads],
           "compile_median_s": round(statistics.median(compiles), 3), "load_median_s": round(statistics.median(loads), 4),
           "cubin_same_as_lowering": same, "object_embeds_cubin": embedded,
           "object_bytes": object_bytes}
    row["saved_per_candidate_s"] = round(row["compile_median_s"] - row["load_median_s"], 3)
    return row


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
    lo.add_argument("--gpu", default=None, help="GPU record name (default: the detected device's record)")
    lo.add_argument("--shape", default="4096x4096x4096")
    lo.add_argument("--timeout", type=float, default=600.0)
    co = sub.add_parser("compile-once", help="CuTe: the worker's compile vs loading the lowering's artifact (CPU)")
    co.add_argument("--python", default=sys.executable, help="the interpreter whose env has the cute plugin")
    co.add_argument("--rounds", type=int, default=5)
    co.add_argument("--shape", default="4096x4096x4096")
    co.add_argument("--knob", action="append", default=[], metavar="K=V", help="a knob as JSON value, e.g. stages=3")
    co.add_argument("--gpu", default=None, help="GPU record name (default: the detected device's record)")
    for p in (j, lo, co):
        p.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if hasattr(a, "gpu"):  # the lowering parts run on the CPU: a named record is taken as asked
        a.gpu = gpu_record(a.gpu, on_device=False)
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
                  "prepare) (s) [how the worker prepared it]: "
                  + ", ".join(f"{s['step']}: {s['lower_wait_s']} / {s['compile_s']} / {s['gate_s']} [{s['prepared']}]"
                              for s in r["steps"]))
    elif a.part == "compile-once":
        knobs = {}
        for kv in a.knob:
            name, eq, value = kv.partition("=")
            try:
                knobs[name] = json.loads(value) if eq else None
            except ValueError:
                knobs[name] = value
            if not eq or not name:
                print(f"--knob {kv!r}: expected K=V", file=sys.stderr)
                return 2
        if a.rounds < 1:
            print("--rounds: at least 1", file=sys.stderr)
            return 2
        rows = [compile_once(a.python, a.rounds, a.shape, knobs, a.gpu)]
        r = rows[0]
        print(f"cute gemm {r['shape']} knobs {r['knobs'] or 'default'} (artifact {r['key'][:12]}), {r['rounds']} "
              f"fresh processes each, after CuTe DSL's import:")
        print(f"  worker compile (before): median {r['compile_median_s']} s  {r['worker_compile_s']}")
        print(f"  worker load    (now):    median {r['load_median_s']} s  {r['worker_load_s']}")
        print(f"  saved per candidate: {r['saved_per_candidate_s']} s; lowering's compile {r['lowering_compile_s']} s "
              f"+ artifact export {r['artifact_export_s']} s ({r['object_bytes']} bytes)")
        print(f"  artifact cubin == lowering's cubin: {r['cubin_same_as_lowering']}; object file embeds it: "
              f"{r['object_embeds_cubin']}")
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
