"""Benchmark: lift and diff a pair of SASS listings of >= 50,000 instructions each.

Goal (issue 3): lift + diff <= 1 s on the 2-core CI machine. The pair is two heavily unrolled kernels
written as straight-line PTX and assembled here by ptxas for sm_90a (reference: --fmad=true,
candidate: --fmad=false) and disassembled by the pip
nvdisasm; the SASS is cached under benchmarks/results/lift_diff/. Prints a table and writes
benchmarks/results/lift_diff.json.  Usage: .venv/bin/python benchmarks/lift_diff.py [--repeat N]
``--pallas-reference`` times the shipped Pallas reference bundle against the H200 CuTe capture (the
Pallas -> CuTe campaign's diff) and against itself; ``--pair REF CAND`` any two inputs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"
CACHE = OUT / "lift_diff"
GOAL_S = 1.0


def source(n: int) -> str:
    """Straight-line PTX (nvcc's front end takes minutes on C++ this long; ptxas takes seconds on PTX)."""
    body = []
    for j in range(n):
        body.append(f"  ld.global.f32 %fv, [%rd4+{(j % 8192) * 16384}];\n"
                    "  mul.f32 %ft, %fa, %fv;\n  add.f32 %fa, %ft, %fb;\n"
                    "  mul.f32 %fu, %fb, 0f3F7FBE77;\n  add.f32 %fb, %fu, %fv;\n")
    return (".version 8.0\n.target sm_90a\n.address_size 64\n\n"
            ".visible .entry big_unrolled(.param .u64 px, .param .u64 py)\n.maxntid 128, 1, 1\n{\n"
            "  .reg .f32 %fa, %fb, %fv, %ft, %fu;\n  .reg .b64 %rd<8>;\n  .reg .b32 %r<2>;\n"
            "  ld.param.u64 %rd1, [px];\n  ld.param.u64 %rd2, [py];\n  cvta.to.global.u64 %rd1, %rd1;\n"
            "  cvta.to.global.u64 %rd2, %rd2;\n  mov.u32 %r1, %tid.x;\n  mul.wide.u32 %rd3, %r1, 4;\n"
            "  add.s64 %rd4, %rd1, %rd3;\n  add.s64 %rd5, %rd2, %rd3;\n"
            "  mov.f32 %fa, 0f00000000;\n  mov.f32 %fb, 0f3F800000;\n" + "".join(body) +
            "  add.f32 %fa, %fa, %fb;\n  st.global.f32 [%rd5], %fa;\n  ret;\n}\n")


def build(name: str, flags: list[str], n: int) -> Path:
    sass = CACHE / f"{name}.sass"
    if sass.exists():
        return sass
    if shutil.which("ptxas") is None:
        raise SystemExit("error: ptxas is not on PATH and no cached SASS exists under " + str(CACHE))
    from mosaic.toolchain.nvdisasm import disassemble as disassemble_cubin

    CACHE.mkdir(parents=True, exist_ok=True)
    ptx = CACHE / f"big_{n}.ptx"
    ptx.write_text(source(n))
    cubin = CACHE / f"{name}.cubin"
    subprocess.run(["ptxas", "-arch=sm_90a", "-O3", *flags, "-o", str(cubin), str(ptx)], check=True)
    sass.write_text(disassemble_cubin(cubin))
    return sass


PALLAS_REFERENCE = ROOT.parent / "packages/target-pallas/src/mosaic_target_pallas/references/gemm-4096x4096x4096-bf16-h200.bundle"
CUTE_CAPTURE = ROOT.parent / "packages/core/tests/data/h200/cute-128x256-s4-persistent-c2x1-sw8.bundle"


def time_pair(ref: Path, cand: Path, repeat: int) -> int:
    """``mosaic diff REF CAND`` as a campaign runs it (lift both, then diff), timed; 0 when the median meets
    the goal."""
    from mosaic.lift.diff import diff_fingerprints
    from mosaic.lift.inputs import lift_pair

    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        a, b = lift_pair(ref, cand)
        result = diff_fingerprints(a, b)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"{ref.name} ({a.instructions} instructions) -> {cand.name} ({b.instructions}): lift + diff median "
          f"{med:.3f} s, best {min(times):.3f} s over {repeat}, {len(result.rows)} rows; goal <= {GOAL_S:.1f} s: "
          + ("meets" if med <= GOAL_S else "MISSES"))
    return 0 if med <= GOAL_S else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--n", type=int, default=11000, help="unrolled iterations per kernel")
    ap.add_argument("--pair", nargs=2, type=Path, metavar=("REF", "CAND"),
                    help="time lift + diff of these two inputs instead (bundles, cubins, SASS or PTX)")
    ap.add_argument("--pallas-reference", action="store_true",
                    help="time the shipped Pallas reference bundle against the H200 CuTe capture, and itself")
    args = ap.parse_args()
    if args.pair:
        return time_pair(*args.pair, args.repeat)
    if args.pallas_reference:
        return max(time_pair(PALLAS_REFERENCE, CUTE_CAPTURE, args.repeat),
                   time_pair(PALLAS_REFERENCE, PALLAS_REFERENCE, args.repeat))
    from mosaic.lift.diff import diff_fingerprints
    from mosaic.lift.inputs import lift_pair, lift_path

    ref = build(f"ref_{args.n}", ["--fmad=true"], args.n)
    cand = build(f"cand_{args.n}", ["--fmad=false"], args.n)
    times, lifts, serial = [], [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        a, b = lift_pair(ref, cand)  # what `mosaic diff` runs: both sides at once on two cores
        t1 = time.perf_counter()
        result = diff_fingerprints(a, b)
        t2 = time.perf_counter()
        times.append(t2 - t0)
        lifts.append(t1 - t0)
        t3 = time.perf_counter()
        diff_fingerprints(lift_path(ref), lift_path(cand))
        serial.append(time.perf_counter() - t3)
    best, med = min(times), statistics.median(times)
    rows = [("reference instructions", f"{a.instructions}"), ("candidate instructions", f"{b.instructions}"),
            ("lift both (median)", f"{statistics.median(lifts):.3f} s"), ("lift + diff (median)", f"{med:.3f} s"),
            ("lift + diff (best)", f"{best:.3f} s"),
            ("lift + diff, one core (median)", f"{statistics.median(serial):.3f} s"), ("goal", f"<= {GOAL_S:.1f} s"),
            ("rows", f"{len(result.rows)}: " + ", ".join(f"{r.layer}/{r.key}" for r in result.rows[:4]))]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(w)}  {v}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "lift_diff.json").write_text(json.dumps({
        "benchmark": "lift_diff", "reference_instructions": a.instructions, "candidate_instructions": b.instructions,
        "repeat": args.repeat, "lift_both_median_s": statistics.median(lifts), "lift_diff_median_s": med,
        "lift_diff_best_s": best, "lift_diff_one_core_median_s": statistics.median(serial), "goal_s": GOAL_S, "meets_goal": med <= GOAL_S,
        "rows": [r.to_json() for r in result.rows]}, indent=2))
    print("meets goal" if med <= GOAL_S else "MISSES goal", f"(wrote {OUT / 'lift_diff.json'})")
    return 0 if a.instructions >= 50_000 and b.instructions >= 50_000 else 1


if __name__ == "__main__":
    sys.exit(main())
