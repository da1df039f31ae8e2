#!/usr/bin/env python3
"""Issue 5 on the H200: Pallas (jax's Hopper matmul, several TuningConfigs, + the project's own pipelined
kernel) and CuTe DSL (the project's naive and warp-specialised gemm) captured as bundles for bf16 4096^3,
with cuBLAS (torch.matmul) timed by the same timer in the same run.

Every capture goes through core's ``mosaic.capture.capture`` (one child process per kernel, with a timeout):
lower (Pallas: MOSAIC_GPU_DUMP_TO -> PTX, SASS, ptxas log; CuTe: cute.compile -> PTX, cubin, SASS), prepare,
poison, run, float64 oracle, then device time from core's CUPTI timer (core falls back to CUDA events
and says so in the bundle's timings.json ``source``/``fallback_reason`` when cupti-python is missing).
An unbuildable configuration (jax's tile_n=256 with 4 steps: 360 KB of shared memory) is recorded and
stepped over. Writes under OUT (at most 4 files):
  issue5-<part>.json       every figure: status, time, noise, launch record, registers, oracle errors
  issue5-<part>.tar.gz     the bundles
Parts (each fits one 10-minute device call): ``pallas``, ``cute`` (CuTe + cuBLAS), or ``all``.
``--lower-only`` lowers every configuration without running anything (works on a CPU machine).
``--quick`` (about 2 minutes with ``--part all``): the re-check after the CuTe epilogue fix -- two tuned
CuTe configs (128x128 s4 with per-warpgroup 64-row epilogue sub-tiles; 128x256 s4 persistent 2x1 cluster
with one 128-row sub-tile over both consumer warpgroups), cuBLAS, and the Pallas s4 config (its bundle now
carries SASS and a cubin assembled by ptxas from the captured PTX); 4 blocks of 20 runs each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

SHAPE = {"m": 4096, "n": 4096, "k": 4096}
PALLAS = {
    "pallas-jax-128x128x64-s4": dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4),
    "pallas-jax-128x128x64-s3": dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=3),
    "pallas-jax-128x128x64-s4-gm-w4": dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                           grid_minor_dim="m", grid_tile_width=4),
    "pallas-jax-128x128x64-s4-clm": dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                         cluster_dimension="m"),
    "pallas-jax-128x256x64-s4": dict(tile_m=128, tile_n=256, tile_k=64, max_concurrent_steps=4),  # unbuildable
    "pallas-own-128x128x64-s4": dict(kernel="pipelined", tile_m=128, tile_n=128, tile_k=64,
                                     max_concurrent_steps=4, delay_release=1),
}
QUICK = ("pallas-jax-128x128x64-s4", "cute-128x128-s4", "cute-128x256-s4-persistent-c2x1-sw8")
CUTE = {
    "cute-naive": dict(kernel="naive"),
    "cute-128x128-s4": dict(tile_mn=[128, 128], stages=4),
    "cute-128x256-s4-persistent": dict(tile_mn=[128, 256], stages=4, persistent=True, epi_tile=[64, 64]),
    "cute-128x256-s4-persistent-c2x1-sw8": dict(tile_mn=[128, 256], stages=4, persistent=True, cluster_mn=[2, 1],
                                                swizzle=8, raster="n", epi_tile=[128, 32]),
    "cute-128x128-s6-persistent-c1x2": dict(tile_mn=[128, 128], stages=6, persistent=True, cluster_mn=[1, 2]),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def spec(lang: str, knobs: dict | None, name: str):
    from mosaic.records import KernelSpec

    return KernelSpec(family="gemm", shape=SHAPE, dtype="bf16", language=lang, knobs=knobs or {}, name=name)


def child_cublas(out: str, result: str, runs: int, blocks: int) -> int:
    from mosaic.capture import CaptureOptions, capture_in_process
    from mosaic.cublas import runnable_factory

    r = capture_in_process(spec("cublas", None, "torch.matmul"), "h200", Path(out),
                           CaptureOptions(runs=runs, blocks=blocks),
                           runnable_factory=runnable_factory)
    Path(result).write_text(json.dumps(r.to_json()))
    return 0


def isolated(args: list[str], timeout: float, result: Path) -> dict:
    try:
        proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "message": f"killed after {timeout:.0f} s"}
    if result.is_file():
        return json.loads(result.read_text())
    return {"status": "failed", "message": f"exit {proc.returncode}", "tail": (proc.stdout + proc.stderr)[-3000:]}


def row(name: str, r: dict) -> str:
    s = r.get("summary") or {}
    t = s.get("time_ns")
    flops = 2 * SHAPE["m"] * SHAPE["n"] * SHAPE["k"]
    launch = s.get("launch") or {}
    res = s.get("resources") or {}
    o = (s.get("oracle") or {}).get("c", {})
    err = o.get("max_error_over_band")
    return (f"{name:<40} {r.get('status', '?'):<12} "
            + (f"{t / 1e3:9.2f} us {flops / t / 1e3:6.0f} TFLOP/s noise {(s.get('noise_ns') or 0) / 1e3:6.2f} us "
               f"[{s.get('timer', '?')}] " if t else f"{'-':>9}    {'':>14} ")
            + (f"grid {launch.get('grid')} block {launch.get('block')} cluster {launch.get('cluster')} "
               f"regs {launch.get('registers_per_thread')} " if launch else f"regs {res.get('registers', '-')} ")
            + (f"err/band {err:.3f}" if isinstance(err, int | float) else "")
            + (f" {r.get('message', '')[:160]}" if r.get("status") not in ("ok", "lowered") else ""))


def main(out: Path, part: str, lower_only: bool, runs: int, blocks: int, quick: bool = False) -> int:
    from mosaic.capture import CaptureOptions, capture

    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("ISSUE5_WORK", "/tmp/issue5"))
    bundles = work / f"bundles-{part}"
    bundles.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # jax must not take 75% of the GPU
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "part": part, "lower_only": lower_only,
                     "quick": quick,
                     "shape": SHAPE, "dtype": "bf16", "captures": {}, "env": {}}
    for mod in ("jax", "jaxlib", "cutlass", "cupti", "torch", "absl"):
        try:
            m = __import__(mod)
            summary["env"][mod] = getattr(m, "__version__", "importable")
        except Exception as exc:  # noqa: BLE001
            summary["env"][mod] = f"NOT importable: {type(exc).__name__}: {exc}"
    log(f"env: {summary['env']}")
    jobs = []
    if part in ("pallas", "all"):
        jobs += [("pallas", n, k) for n, k in PALLAS.items()]
    if part in ("cute", "all"):
        jobs += [("cute", n, k) for n, k in CUTE.items()]
        if not lower_only:
            jobs.append(("cublas", "cublas-torch.matmul", None))
    if quick:
        jobs = [j for j in jobs if j[1] in QUICK or j[0] == "cublas"]
    for lang, name, knobs in jobs:
        t0 = time.time()
        dest = bundles / f"{name}.bundle"
        # the naive kernel takes milliseconds per run: fewer runs keep the call inside its time limit
        few = name == "cute-naive"
        opts = CaptureOptions(lower_only=lower_only, timeout=300, runs=5 if few else runs,
                              blocks=5 if few else blocks)
        if lang == "cublas":
            res = work / "cublas.result.json"
            res.unlink(missing_ok=True)
            r = isolated(["--child-cublas", str(dest), str(res), str(runs), str(blocks)], 300, res)
        else:
            r = capture(spec(lang, knobs, name), "h200", dest, opts).to_json()
        r["knobs"] = knobs
        r["seconds"] = round(time.time() - t0, 1)
        summary["captures"][name] = r
        log(row(name, r) + f"  ({r['seconds']} s)")
    summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    tag = f"{part}{'-quick' if quick else ''}{'-lowered' if lower_only else ''}"
    (out / f"issue5-{tag}.json").write_text(json.dumps(summary, indent=1))
    with tarfile.open(out / f"issue5-{tag}.tar.gz", "w:gz") as tar:
        for b in sorted(bundles.glob("*.bundle")):
            tar.add(b, arcname=b.name)
    size = (out / f"issue5-{tag}.tar.gz").stat().st_size
    print("\n" + "\n".join(row(n, r) for n, r in summary["captures"].items()))
    print(f"\nwrote {out / f'issue5-{tag}.json'} and {out / f'issue5-{tag}.tar.gz'} ({size / 2**20:.1f} MiB)")
    if size > 16 * 2**20:
        print("WARNING: the tarball exceeds 16 MiB and will not come back from the device")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/issue5-out"))
    ap.add_argument("--part", choices=("pallas", "cute", "all"), default="all")
    ap.add_argument("--lower-only", action="store_true", help="lower every configuration; run nothing")
    ap.add_argument("--quick", action="store_true",
                    help="the re-check subset (2 tuned CuTe configs, cuBLAS, Pallas s4), 4 blocks x 20 runs")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per block")
    ap.add_argument("--blocks", type=int, default=10, help="blocks (their medians' range is the noise)")
    ap.add_argument("--child-cublas", nargs=4, metavar=("OUT", "RESULT", "RUNS", "BLOCKS"))
    a = ap.parse_args()
    if a.child_cublas:
        dest, result, runs_, blocks_ = a.child_cublas
        sys.exit(child_cublas(dest, result, int(runs_), int(blocks_)))
    if a.quick:
        a.runs, a.blocks = min(a.runs, 20), min(a.blocks, 4)
    sys.exit(main(Path(a.out), a.part, a.lower_only, a.runs, a.blocks, a.quick))
