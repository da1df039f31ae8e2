#!/usr/bin/env python3
"""Issue 4 on the H200: CUTLASS bundles, cuBLAS by the same CUPTI timer, oracle figures, A/A test.

Run from the repository root after staging (see scripts/device/issue4.sh). Everything heavy runs in a
child process with a timeout; a failure is recorded in the summary, never fatal. Writes under OUT:
  issue4.json        every figure (captures, oracle errors, times, noise, A/A and planted decisions)
  bundles.tar.gz     all bundles (4096^3: outputs by SHA-256; small shape: outputs as arrays)
and prints a summary table. Phases:
  1. lower the CUTLASS configurations in parallel (nvcc, cached under $MOSAIC_CACHE_DIR)
  2. capture each (own process): bf16 GEMM 4096^3 with normal inputs (oracle on the full 4096^3 in
     float64), and a small 512x384x256 shape with integer inputs (bit-exact oracle; outputs kept)
  3. the same for cuBLAS (torch.matmul, reduced-precision reductions off), timed by the same CUPTI timer
  4. A/A: 20 calibration blocks -> noise; 100 decisions of the kernel against itself -> false-win rate;
     planted variants of the same kernel with K = 4224 (+3.1% work: must be classified slower and
     rejected) and K = 3968 (-3.1%: must be accepted)
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

BIG = {"m": 4096, "n": 4096, "k": 4096}
SMALL = {"m": 512, "n": 384, "k": 256}
CONFIGS = {
    "coop-128x128x64-c1x2": dict(kernel_schedule="cooperative", epilogue_schedule="tma-cooperative",
                                 tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2),
    "coop-128x256x64-c2x1": dict(kernel_schedule="cooperative", epilogue_schedule="tma-cooperative",
                                 tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1),
    "pingpong-64x128x64-c1x1-s4": dict(kernel_schedule="pingpong", epilogue_schedule="tma",
                                       tile_m=64, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, stages=4),
}
PLANTED_K = {"slower": 4224, "faster": 3968}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def spec(lang: str, shape: dict, knobs: dict | None = None, name: str = ""):
    from mosaic.records import KernelSpec

    return KernelSpec(family="gemm", shape=shape, dtype="bf16", language=lang, knobs=knobs or {}, name=name)


# -- cuBLAS through torch: mosaic.families.gemm ------------------------------------------------------
from mosaic.families.gemm import TorchMatmul  # noqa: E402  (the project is installed before this script runs)
from mosaic.families.gemm import runnable_factory as torch_factory  # noqa: E402

# -- children -----------------------------------------------------------------------------------------

def child_cublas(shape: dict, values: str, out: str, result: str) -> int:
    from mosaic.capture import CaptureOptions, capture_in_process

    r = capture_in_process(spec("cublas", shape, name="torch.matmul"), "h200", Path(out),
                           CaptureOptions(values=values), runnable_factory=torch_factory)
    Path(result).write_text(json.dumps(r.to_json(), default=_plain))
    return 0


def run_decisions(ref, slow, fast, measure_pair, noise_pairs=20, decisions=100, planted=20) -> dict:
    """Calibrate noise on ``ref`` against itself (interleaved), then A/A and the planted variants.
    ``measure_pair(a, b)`` -> (runs of a, runs of b) from one block timed a b a b ... run by run."""
    from mosaic.timing.aa import decide_many
    from mosaic.timing.noise import measure_noise

    blocks = []
    for _ in range(noise_pairs):
        blocks += list(measure_pair(ref, ref))
    noise = measure_noise(blocks)

    def pair_of(cand):
        def measure(candidate_first: bool):
            if candidate_first:
                c, b = measure_pair(cand, ref)
                return b, c
            return measure_pair(ref, cand)
        return measure

    aa = decide_many("A/A", pair_of(ref), noise, decisions)
    out = {"noise": noise.to_json(), "aa": aa.to_json()}
    for name, cand in (("planted_slower", slow), ("planted_faster", fast)):
        if cand is not None:
            out[name] = decide_many(name, pair_of(cand), noise, planted).to_json()
    return out


def child_aa(kernel: str, result: str, runs: int, decisions: int = 100) -> int:
    from mosaic.families import make_inputs
    from mosaic.plugins import host
    from mosaic.timing.device import L2Flush
    from mosaic.timing.timer import make_timer

    h = host()
    gpu = h.get("gpus", "h200")
    timer = make_timer("cupti")
    made = {}
    for label, k in (("ref", BIG["k"]), ("slow", PLANTED_K["slower"]), ("fast", PLANTED_K["faster"])):
        sp = spec("cublas" if kernel == "cublas" else "cutlass", {**BIG, "k": k}, CONFIGS.get(kernel))
        inputs = make_inputs(sp, seed=1, values="normal")
        if kernel == "cublas":
            made[label] = TorchMatmul(inputs)
        else:
            made[label] = h.get("languages", "cutlass").backend.prepare(sp, gpu, Path("/tmp"), inputs)
    flush = L2Flush(gpu.l2_bytes)
    def measure_pair(a, b):
        ta, tb = timer.time_interleaved([a, b], runs, warmup=2, flush=flush, clocks=False)
        return ta.times_ns, tb.times_ns

    t0 = time.time()
    res = run_decisions(made["ref"], made["slow"], made["fast"], measure_pair, decisions=decisions)
    res.update({"kernel": kernel, "timer": timer.source, "fallback_reason": getattr(timer, "reason", ""),
                "runs_per_block": runs, "seconds": round(time.time() - t0, 1),
                "planted_k": PLANTED_K, "shape": BIG})
    Path(result).write_text(json.dumps(res, indent=1, default=_plain))
    return 0


def _plain(o):
    """numpy scalars and arrays in results -> JSON numbers and lists."""
    return o.tolist() if hasattr(o, "tolist") else str(o)


def isolated(args: list[str], timeout: float, result: Path) -> dict:
    """Run this script's child mode in its own process; any failure becomes a record."""
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"status": "timeout", "message": f"killed after {timeout:.0f} s", "tail": tail[-2000:]}
    if result.is_file():
        data = json.loads(result.read_text())
        data.setdefault("status", "ok")
        data["wall_s"] = round(time.time() - t0, 1)
        return data
    what = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return {"status": "crashed" if proc.returncode < 0 else "failed", "message": what,
            "tail": (proc.stdout + proc.stderr)[-3000:]}


# -- the summary ----------------------------------------------------------------------------------------

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
        o = (s.get("oracle") or {}).get("c", {})
        f = lambda v, fmt: format(v, fmt) if isinstance(v, int | float) else "-"  # noqa: E731
        rows.append([name, shape, c.get("status", "?"), f(t / 1e3 if t else None, ".2f"), tflops,
                     f((s.get("noise_ns") or 0) / 1e3 if s.get("noise_ns") is not None else None, ".2f"), lr,
                     str(launch.get("registers_per_thread", "-")), f(o.get("max_abs_error"), ".3g"),
                     f(o.get("mean_abs_error"), ".3g"), f(o.get("max_error_over_band"), ".3f"),
                     str(o.get("exact_checked", "-"))])
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def aa_lines(aa: dict) -> list[str]:
    if aa.get("status") not in (None, "ok"):
        return [f"A/A: {aa.get('status')}: {aa.get('message', '')}"]
    n = aa["noise"]
    lines = [f"A/A on {aa['kernel']} ({aa['timer']}, {aa['runs_per_block']} runs/block): noise = t*sd of "
             f"{n.get('pairs', n['blocks'] // 2)} interleaved self-pair differences = {n['value_ns'] / 1e3:.3f} us "
             f"({100 * n['relative']:.2f}% of {n['reference_time_ns'] / 1e3:.2f} us)",
             f"  A/A: {aa['aa']['accepted']} false wins in {aa['aa']['decisions']} decisions "
             f"(rate {100 * aa['aa']['accept_rate']:.1f}%, goal <= 1%)"]
    for key in ("planted_slower", "planted_faster"):
        if key in aa:
            d = aa[key]
            lines.append(f"  {key} (K={PLANTED_K[key.split('_')[1]]}): time ratio {d['mean_time_ratio']:.4f}, "
                         f"accepted {d['accepted']}/{d['decisions']}, classified slower {d['classified_slower']}/"
                         f"{d['decisions']}")
    return lines


def main(out: Path, quick: bool, aa_only: bool = False, decisions: int = 100) -> int:
    from mosaic.capture import CaptureOptions, capture

    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("ISSUE4_WORK", "/tmp/issue4"))
    bundles = work / "bundles"
    bundles.mkdir(parents=True, exist_ok=True)
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "captures": {}, "env": {}}
    try:
        summary["env"]["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm",
                                                       "--format=csv,noheader"], capture_output=True, text=True,
                                                      timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        summary["env"]["nvidia_smi"] = f"unavailable: {exc}"
    try:
        import cupti  # noqa: F401  # type: ignore[import-not-found]
        summary["env"]["cupti"] = "importable"
    except Exception as exc:  # noqa: BLE001
        summary["env"]["cupti"] = f"NOT importable: {exc} (timings fall back to CUDA events, declared)"
    log(f"env: {summary['env']}")

    # 1. lower in parallel (nvcc, one process each)
    configs = dict(list(CONFIGS.items())[:1]) if aa_only else CONFIGS
    log(f"lowering {len(configs)} CUTLASS configuration(s) in parallel")
    procs = {}
    for name, knobs in configs.items():
        cmd = [sys.executable, "-c", "from mosaic.cli import main; main()", "capture", "--lang", "cutlass", "--family", "gemm",
               "--shape", "4096x4096x4096", "--dtype", "bf16", "--lower-only", "--force", "--timeout", "540",
               "-o", str(work / f"lower-{name}.bundle"), *[f"--knob={k}={v}" for k, v in knobs.items()]]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, p in procs.items():
        try:
            text, _ = p.communicate(timeout=560)
        except subprocess.TimeoutExpired:
            p.kill()
            text = "timeout"
        summary["captures"][f"lower {name}"] = {"status": "lowered" if p.returncode == 0 else "unbuildable",
                                                 "message": text.strip()[-500:], "shape": ""}
        log(f"  {name}: rc={p.returncode} {text.strip().splitlines()[-1] if text.strip() else ''}")

    # 2./3. captures, each in its own process
    opts_big = CaptureOptions(timeout=240, values="normal", runs=50, blocks=20)
    opts_small = CaptureOptions(timeout=120, values="int", runs=20, blocks=5)
    jobs = [(name, "cutlass", knobs) for name, knobs in configs.items()] + [("cublas", "cublas", None)]
    for name, lang, knobs in ([] if aa_only else jobs):
        for label, shape, opts in (("4096", BIG, opts_big), ("small", SMALL, opts_small)):
            if quick and label == "small":
                continue
            key = f"{name} {label}"
            dest = bundles / f"{name}-{label}.bundle"
            shape_s = f"{shape['m']}x{shape['n']}x{shape['k']}"
            t0 = time.time()
            if lang == "cutlass":
                if summary["captures"].get(f"lower {name}", {}).get("status") != "lowered":
                    summary["captures"][key] = {"status": "skipped", "message": "did not lower", "shape": shape_s}
                    continue
                r = capture(spec("cutlass", shape, knobs, name=name), "h200", dest, opts).to_json()
            else:
                res = work / f"{name}-{label}.result.json"
                res.unlink(missing_ok=True)
                r = isolated(["--child-cublas", shape_s, opts.values, str(dest), str(res)], opts.timeout, res)
            r["shape"] = shape_s
            summary["captures"][key] = r
            s = r.get("summary", {}) or {}
            log(f"  {key}: {r.get('status')} in {time.time() - t0:.0f} s; time "
                f"{(s.get('time_ns') or 0) / 1e3:.2f} us; {r.get('message', '')[:300]}")

    # 4. A/A + planted on the first CUTLASS configuration that captured, else cuBLAS
    ok = [n for n, _, _ in jobs if summary["captures"].get(f"{n} 4096", {}).get("status") == "ok"
          or (aa_only and summary["captures"].get(f"lower {n}", {}).get("status") == "lowered")]
    kernel = next((n for n in ok if n != "cublas"), "cublas")
    log(f"A/A and planted variants on {kernel}")
    res = work / "aa.result.json"
    res.unlink(missing_ok=True)
    summary["aa"] = isolated(["--child-aa", kernel, str(res), "30", str(decisions)], 300, res)

    # write everything back
    summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    (out / "issue4.json").write_text(json.dumps(summary, indent=1, default=_plain))
    with tarfile.open(out / "bundles.tar.gz", "w:gz") as tar:
        for b in sorted(bundles.glob("*.bundle")):
            tar.add(b, arcname=b.name)
    print()
    print(table({k: v for k, v in summary["captures"].items() if not k.startswith("lower ")}))
    print()
    print("\n".join(aa_lines(summary["aa"])))
    print(f"\nwrote {out / 'issue4.json'} and {out / 'bundles.tar.gz'} "
          f"({(out / 'bundles.tar.gz').stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/issue4-out"))
    ap.add_argument("--quick", action="store_true", help="skip the small-shape captures")
    ap.add_argument("--child-cublas", nargs=4, metavar=("SHAPE", "VALUES", "OUT", "RESULT"))
    ap.add_argument("--aa-only", action="store_true", help="lower one configuration and run only the A/A test")
    ap.add_argument("--decisions", type=int, default=100, help="A/A decisions")
    ap.add_argument("--child-aa", nargs=4, metavar=("KERNEL", "RESULT", "RUNS", "DECISIONS"))
    a = ap.parse_args()
    if a.child_cublas:
        shape_s, values, dest, result = a.child_cublas
        m, n, k = (int(v) for v in shape_s.split("x"))
        sys.exit(child_cublas({"m": m, "n": n, "k": k}, values, dest, result))
    if a.child_aa:
        sys.exit(child_aa(a.child_aa[0], a.child_aa[1], int(a.child_aa[2]), int(a.child_aa[3])))
    sys.exit(main(Path(a.out), a.quick, a.aa_only, a.decisions))
