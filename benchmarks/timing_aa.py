#!/usr/bin/env python3
"""The decision rule's A/A test on the H200: noise calibrated on a bf16 GEMM 4096^3 against itself, then A/A
decisions of the kernel against itself (the false-win rate, goal <= 1%) and planted variants of the same kernel with
K = 4224 (+3.1% work: must be classified slower and rejected) and K = 3968 (-3.1%: must be accepted), every block
timed a b a b ... run by run with core's CUPTI timer (CUDA events, declared, without cupti-python), an L2 flush
between runs.

The kernel is a CUTLASS configuration of benchmarks/gemm_capture.py (lowered first, nvcc cached under
$MOSAIC_CACHE_DIR; needs the CUTLASS headers, $MOSAIC_CUTLASS_INCLUDE) or ``cublas`` (torch.matmul); a configuration
that does not lower falls back to cuBLAS. The measurement runs in a child process with a timeout (300 s); a failure
is recorded, never fatal.

    python3 benchmarks/timing_aa.py [--kernel coop-128x128x64-c1x2|cublas] [--decisions 100] [--runs 30] [--json PATH]
    # prints the A/A lines; writes $OUT/timing_aa.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _device import add_json, isolated, json_path, log, plain, write_json
from gemm_capture import BIG, CONFIGS, lower_cutlass, spec

PLANTED_K = {"slower": 4224, "faster": 3968}


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
    from mosaic.families.gemm import TorchMatmul
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
    Path(result).write_text(json.dumps(res, indent=1, default=plain))
    return 0


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


def main(a: argparse.Namespace) -> int:
    work = Path(os.environ.get("GEMM_CAPTURE_WORK", "/tmp/gemm-capture"))
    work.mkdir(parents=True, exist_ok=True)
    kernel = a.kernel
    if kernel != "cublas" and lower_cutlass({kernel: CONFIGS[kernel]}, work)[kernel]["status"] != "lowered":
        kernel = "cublas"
    log(f"A/A and planted variants on {kernel}")
    res = work / "aa.result.json"
    res.unlink(missing_ok=True)
    aa = isolated(__file__, ["--child-aa", kernel, str(res), str(a.runs), str(a.decisions)], 300, res)
    path = write_json(json_path(a), {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "aa": aa}, indent=1,
                      default=plain)
    print("\n".join(aa_lines(aa)))
    print(f"\nwrote {path}")
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json(ap, "timing_aa")
    ap.add_argument("--kernel", choices=(*CONFIGS, "cublas"), default=next(iter(CONFIGS)))
    ap.add_argument("--decisions", type=int, default=100, help="A/A decisions")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per block")
    ap.add_argument("--child-aa", nargs=4, metavar=("KERNEL", "RESULT", "RUNS", "DECISIONS"))
    return ap.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    if args.child_aa:
        sys.exit(child_aa(args.child_aa[0], args.child_aa[1], int(args.child_aa[2]), int(args.child_aa[3])))
    sys.exit(main(args))
