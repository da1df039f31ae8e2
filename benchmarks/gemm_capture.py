#!/usr/bin/env python3
"""bf16 GEMM bundles captured on the H200 with cuBLAS (torch.matmul) timed by the same timer in the same run: CUTLASS
(three configurations), Pallas (jax's Hopper matmul under several TuningConfigs + the project's own pipelined kernel)
and CuTe DSL (the project's naive and warp-specialised gemm).

Every capture goes through core's ``mosaic.capture.capture`` (one child process per kernel, with a timeout):
lower (Pallas: MOSAIC_GPU_DUMP_TO -> PTX, SASS, ptxas log; CuTe: cute.compile -> PTX, cubin, SASS; CUTLASS: nvcc,
cached under $MOSAIC_CACHE_DIR, the configurations lowered in parallel first), prepare, poison, run, float64 oracle,
then device time from core's CUPTI timer (core falls back to CUDA events and says so in the bundle's timings.json
``source``/``fallback_reason`` when cupti-python is missing). An unbuildable configuration (jax's tile_n=256 with 4
steps: 360 KB of shared memory) is recorded and stepped over. Writes (at most 4 files):
  --json PATH (default $OUT/gemm_capture-<tag>.json)   every figure: status, time, noise, launch record, registers,
                                                       oracle errors
  the same path with .tar.gz                           the bundles
Parts (each fits one 10-minute device call): ``pallas``, ``cute`` (CuTe + cuBLAS), ``all`` (both), and ``cutlass``
(CUTLASS + cuBLAS at 4096^3 with normal inputs, the oracle on the full 4096^3 in float64, and at 512x384x256 with
integer inputs, a bit-exact oracle with the outputs kept; needs the CUTLASS headers, $MOSAIC_CUTLASS_INCLUDE).
``--lower-only`` lowers every configuration without running anything (works on a CPU machine).
``--quick`` (about 2 minutes with ``--part all``): the re-check after the CuTe epilogue fix -- two tuned CuTe configs
(128x128 s4 with per-warpgroup 64-row epilogue sub-tiles; 128x256 s4 persistent 2x1 cluster with one 128-row sub-tile
over both consumer warpgroups), cuBLAS, and the Pallas s4 config (its bundle carries SASS and a cubin assembled by
ptxas from the captured PTX); 4 blocks of 20 runs each. With ``--part cutlass`` it skips the small-shape captures.
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

from _device import add_json, isolated, log, nvidia_smi, out_dir, plain, versions, write_json

BIG = {"m": 4096, "n": 4096, "k": 4096}
SMALL = {"m": 512, "n": 384, "k": 256}
CONFIGS = {  # CUTLASS
    "coop-128x128x64-c1x2": dict(kernel_schedule="cooperative", epilogue_schedule="tma-cooperative",
                                 tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2),
    "coop-128x256x64-c2x1": dict(kernel_schedule="cooperative", epilogue_schedule="tma-cooperative",
                                 tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1),
    "pingpong-64x128x64-c1x1-s4": dict(kernel_schedule="pingpong", epilogue_schedule="tma",
                                       tile_m=64, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, stages=4),
}
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


def spec(lang: str, shape: dict, knobs: dict | None = None, name: str = ""):
    from mosaic.records import KernelSpec

    return KernelSpec(family="gemm", shape=shape, dtype="bf16", language=lang, knobs=knobs or {}, name=name)


def shape_str(shape: dict) -> str:
    return f"{shape['m']}x{shape['n']}x{shape['k']}"


def child_cublas(shape: dict, values: str, runs: int, blocks: int, out: str, result: str) -> int:
    from mosaic.capture import CaptureOptions, capture_in_process
    from mosaic.families.gemm import runnable_factory

    r = capture_in_process(spec("cublas", shape, name="torch.matmul"), "h200", Path(out),
                           CaptureOptions(values=values, runs=runs, blocks=blocks), runnable_factory=runnable_factory)
    Path(result).write_text(json.dumps(r.to_json(), default=plain))
    return 0


def problems(r: dict, exact: int | None = None) -> list[str]:
    """What fails a capture's acceptance (the ``gpu`` tests' check): status ok, the oracle's numerics pass with no
    failing element and the error within the guard band, a device time, and (``exact``) that many outputs checked
    exactly (integer inputs)."""
    if r.get("status") != "ok":
        return [f"status {r.get('status')}: {r.get('message', '')[:300]}"]
    s = r.get("summary") or {}
    o = (s.get("oracle") or {}).get("c") or {}
    out = [] if s.get("numerics_pass") else ["numerics did not pass"]
    if o.get("failures") != 0 or not o.get("max_error_over_band", 2.0) <= 1.0:
        out.append(f"oracle: {o.get('failures')} failures, max error / band {o.get('max_error_over_band')}")
    if not (s.get("time_ns") or 0) > 0:
        out.append("no device time")
    if exact is not None and o.get("exact_checked") != exact:
        out.append(f"{o.get('exact_checked')} outputs checked exactly, not {exact}")
    return out


def capture_checked(lang: str, name: str, knobs: dict, shape: dict, dest: Path, opts, exact: int | None = None,
                    files: tuple = ()) -> tuple[dict, list[str]]:
    """One capture through core's capture and what fails its acceptance: :func:`problems`, the bundle's integrity
    (mosaic bundle verify) and the machine-code ``files`` it must hold. Returns the result record and the problems."""
    from mosaic.bundle import load_bundle, verify_bundle
    from mosaic.capture import capture

    r = capture(spec(lang, shape, knobs, name), "h200", dest, opts).to_json()
    out = problems(r, exact)
    if not out:
        out += verify_bundle(dest)
        out += [f"no {f} in the bundle" for f in files if f not in load_bundle(dest).manifest["files"]]
    return r, out


def table(captures: dict) -> str:
    rows = [["kernel", "shape", "status", "time us", "TFLOP/s", "noise us", "grid/block/cluster", "regs",
             "max|err|", "mean|err|", "err/band", "exact"]]
    for name, c in captures.items():
        s = c.get("summary", {}) or {}
        shape = c.get("shape", "")
        t = s.get("time_ns")
        m, n, k = (int(v) for v in shape.split("x")) if shape else (0, 0, 0)
        tflops = f"{2 * m * n * k / t / 1e3:.0f}" if t else "-"
        launch = s.get("launch") or {}
        lr = (f"{tuple(launch['grid'])}/{launch['block'][0]}/{tuple(launch['cluster'])}" if launch else "-")
        regs = launch.get("registers_per_thread", (s.get("resources") or {}).get("registers", "-"))
        o = (s.get("oracle") or {}).get("c", {})
        f = lambda v, fmt: format(v, fmt) if isinstance(v, int | float) else "-"  # noqa: E731
        rows.append([name, shape, c.get("status", "?"), f(t / 1e3 if t else None, ".2f"), tflops,
                     f((s.get("noise_ns") or 0) / 1e3 if s.get("noise_ns") is not None else None, ".2f"), lr,
                     str(regs), f(o.get("max_abs_error"), ".3g"),
                     f(o.get("mean_abs_error"), ".3g"), f(o.get("max_error_over_band"), ".3f"),
                     str(o.get("exact_checked", "-"))])
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def lower_cutlass(configs: dict, work: Path) -> dict:
    """Lower the CUTLASS configurations in parallel (nvcc, one `mosaic capture --lower-only` process each)."""
    log(f"lowering {len(configs)} CUTLASS configuration(s) in parallel")
    procs, out = {}, {}
    for name, knobs in configs.items():
        cmd = [sys.executable, "-c", "from mosaic.cli import main; main()", "capture", "--lang", "cutlass", "--family",
               "gemm", "--shape", shape_str(BIG), "--dtype", "bf16", "--lower-only", "--force", "--timeout", "540",
               "-o", str(work / f"lower-{name}.bundle"), *[f"--knob={k}={v}" for k, v in knobs.items()]]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, p in procs.items():
        try:
            text, _ = p.communicate(timeout=560)
        except subprocess.TimeoutExpired:
            p.kill()
            text = "timeout"
        out[name] = {"status": "lowered" if p.returncode == 0 else "unbuildable", "message": text.strip()[-500:],
                     "shape": ""}
        log(f"  {name}: rc={p.returncode} {text.strip().splitlines()[-1] if text.strip() else ''}")
    return out


def jobs_of(part: str, quick: bool, lower_only: bool, runs: int, blocks: int) -> list[tuple]:
    """(key, lang, name, knobs, shape, CaptureOptions) of every capture of ``part``."""
    from mosaic.capture import CaptureOptions

    jobs = []
    if part == "cutlass":
        big = CaptureOptions(lower_only=lower_only, timeout=240, values="normal", runs=50, blocks=20)
        small = CaptureOptions(lower_only=lower_only, timeout=120, values="int", runs=20, blocks=5)
        for label, shape, opts in (("4096", BIG, big), ("small", SMALL, small)):
            if quick and label == "small":
                continue
            jobs += [(f"{n} {label}", "cutlass", n, k, shape, opts) for n, k in CONFIGS.items()]
            if not lower_only:  # cuBLAS: the default runs and blocks
                jobs.append((f"cublas {label}", "cublas", "cublas", None, shape,
                             CaptureOptions(timeout=opts.timeout, values=opts.values)))
        return jobs
    opts = CaptureOptions(lower_only=lower_only, timeout=300, runs=runs, blocks=blocks)
    if part in ("pallas", "all"):
        jobs += [(n, "pallas", n, k, BIG, opts) for n, k in PALLAS.items()]
    if part in ("cute", "all"):
        # the naive kernel takes milliseconds per run: fewer runs keep the call inside its time limit
        jobs += [(n, "cute", n, k, BIG, CaptureOptions(lower_only=lower_only, timeout=300, runs=5, blocks=5)
                  if n == "cute-naive" else opts) for n, k in CUTE.items()]
        if not lower_only:
            jobs.append(("cublas-torch.matmul", "cublas", "cublas-torch.matmul", None, BIG, opts))
    if quick:
        jobs = [j for j in jobs if j[2] in QUICK or j[1] == "cublas"]
    return jobs


def main(a: argparse.Namespace) -> int:
    from mosaic.capture import capture

    work = Path(os.environ.get("GEMM_CAPTURE_WORK", "/tmp/gemm-capture"))
    bundles = work / f"bundles-{a.part}"
    bundles.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # jax must not take 75% of the GPU
    tag = f"{a.part}{'-quick' if a.quick else ''}{'-lowered' if a.lower_only else ''}"
    path = a.json if a.json is not None else out_dir() / f"gemm_capture-{tag}.json"
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "part": a.part, "lower_only": a.lower_only,
                     "quick": a.quick, "shape": BIG, "dtype": "bf16", "captures": {},
                     "env": {**versions(("jax", "jaxlib", "cutlass", "cupti", "torch", "absl")),
                             "nvidia_smi": nvidia_smi("name,driver_version,clocks.max.sm")}}
    log(f"env: {summary['env']}")
    lowered = lower_cutlass(CONFIGS, work) if a.part == "cutlass" and not a.lower_only else {}
    summary["captures"].update({f"lower {n}": r for n, r in lowered.items()})
    for key, lang, name, knobs, shape, opts in jobs_of(a.part, a.quick, a.lower_only, a.runs, a.blocks):
        t0 = time.time()
        dest = bundles / f"{key.replace(' ', '-')}.bundle"
        if lang == "cutlass" and lowered and lowered[name]["status"] != "lowered":
            summary["captures"][key] = {"status": "skipped", "message": "did not lower", "shape": shape_str(shape)}
            continue
        if lang == "cublas":
            res = work / f"{key.replace(' ', '-')}.result.json"
            res.unlink(missing_ok=True)
            r = isolated(__file__, ["--child-cublas", shape_str(shape), opts.values, str(opts.runs), str(opts.blocks),
                                    str(dest), str(res)], opts.timeout, res)
        else:
            r = capture(spec(lang, shape, knobs, name), "h200", dest, opts).to_json()
        r.update(knobs=knobs, shape=shape_str(shape), seconds=round(time.time() - t0, 1))
        summary["captures"][key] = r
        if not a.lower_only:
            r["problems"] = problems(r, SMALL["m"] * SMALL["n"] if opts.values == "int" else None)
        s = r.get("summary") or {}
        log(f"  {key}: {r.get('status')} in {r['seconds']} s; time {(s.get('time_ns') or 0) / 1e3:.2f} us "
            f"[{s.get('timer', '?')}]; {r.get('message', '')[:300]}{'; PROBLEMS: ' if r.get('problems') else ''}"
            f"{'; '.join(r.get('problems') or [])}")
    summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_json(path, summary, indent=1, default=plain)
    tar_path = path.with_suffix(".tar.gz")
    with tarfile.open(tar_path, "w:gz") as tar:
        for b in sorted(bundles.glob("*.bundle")):
            tar.add(b, arcname=b.name)
    size = tar_path.stat().st_size
    print("\n" + table({k: v for k, v in summary["captures"].items() if not k.startswith("lower ")}))
    print(f"\nwrote {path} and {tar_path} ({size / 2**20:.1f} MiB)")
    if size > 16 * 2**20:
        print("WARNING: the tarball exceeds 16 MiB and will not come back from the device")
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json(ap, "gemm_capture")
    ap.add_argument("--part", choices=("pallas", "cute", "all", "cutlass"), default="all")
    ap.add_argument("--lower-only", action="store_true", help="lower every configuration; run nothing")
    ap.add_argument("--quick", action="store_true",
                    help="the re-check subset (2 tuned CuTe configs, cuBLAS, Pallas s4), 4 blocks x 20 runs; "
                         "with --part cutlass: no small-shape captures")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per block (pallas, cute)")
    ap.add_argument("--blocks", type=int, default=10, help="blocks (their medians' range is the noise)")
    ap.add_argument("--child-cublas", nargs=6, metavar=("SHAPE", "VALUES", "RUNS", "BLOCKS", "OUT", "RESULT"))
    a = ap.parse_args(argv)
    if a.quick:
        a.runs, a.blocks = min(a.runs, 20), min(a.blocks, 4)
    return a


if __name__ == "__main__":
    args = parse_args()
    if args.child_cublas:
        shape_s, values, runs_, blocks_, dest, result = args.child_cublas
        m, n, k = (int(v) for v in shape_s.split("x"))
        sys.exit(child_cublas({"m": m, "n": n, "k": k}, values, int(runs_), int(blocks_), dest, result))
    sys.exit(main(args))
