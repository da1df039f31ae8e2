#!/usr/bin/env python3
"""Every family's yardsticks on the GPU: each one's output checked against the float64 oracle on the family's
own generated inputs, then its device time (core's CUPTI timer, an L2 flush before every run, the median of
``--blocks`` blocks of ``--runs`` runs) beside the physical floor of the problem on the GPU record.

Cases: bf16 rmsnorm and softmax 16384 x 8192 (torch), attention 1 x 4096 x 32 x 128 non-causal and causal with
8 KV heads (torch SDPA, SDPA pinned to cuDNN, flash-attn-4), GEMM 4096^3 (cuBLAS). A yardstick whose library is
missing (flash-attn-4 without its wheel) or that fails is a row saying so, never a crash.

    python3 benchmarks/family_yardsticks.py [--runs 20] [--blocks 5] [--gpu h200] [--json PATH]
    # prints one line per case; writes $OUT/family_yardsticks.json
"""

from __future__ import annotations

import statistics
import time
import traceback

from _device import OneLineParser, add_json, gpu_record, json_path, log, plain, write_json

CASES = [
    ("rmsnorm", {"rows": 16384, "cols": 8192}, "torch"),
    ("softmax", {"rows": 16384, "cols": 8192}, "torch"),
    ("attention", {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128}, "torch-sdpa"),
    ("attention", {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128}, "sdpa-flash"),
    ("attention", {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128}, "cudnn"),
    ("attention", {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128}, "flash-attn-4"),
    ("attention", {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128, "kv_heads": 8, "causal": 1}, "torch-sdpa"),
    ("attention", {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128, "kv_heads": 8, "causal": 1}, "sdpa-flash"),
    ("attention", {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128, "kv_heads": 8, "causal": 1}, "cudnn"),
    ("attention", {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128, "kv_heads": 8, "causal": 1},
     "flash-attn-4"),
    ("gemm", {"m": 4096, "n": 4096, "k": 4096}, "cublas"),
]


def one(family, shape, name, gpu, timer, flush, runs, blocks, dtype="bf16") -> dict:
    from mosaic.families import make_inputs, physical_floor_ns, yardstick_runnable
    from mosaic.oracle import check
    from mosaic.records import KernelSpec

    spec = KernelSpec(family, shape, dtype, name)
    row = {"family": family, "shape": shape, "yardstick": name, "dtype": dtype,
           "floor_us": physical_floor_ns(family, shape, dtype, gpu) / 1e3}
    try:
        inputs = make_inputs(spec, 0, "normal")
        r = yardstick_runnable(spec, inputs)
        r.poison()
        r.launch()
        verdict = check(family, inputs, r.output(), dtype)
        row.update({"oracle_pass": verdict.passed, "reason": verdict.reason,
                    "worst_over_band": verdict.outputs[0].max_error_over_band})
        times = []
        for i in range(blocks):
            (t,) = timer.time_interleaved([r], runs, warmup=5 if i == 0 else 1, flush=flush, clocks=False)
            times.append(statistics.median(t.times_ns))
        r.close()
        row.update({"status": "ok", "median_us": statistics.median(times) / 1e3,
                    "block_medians_us": [x / 1e3 for x in times]})
        row["floor_fraction"] = row["floor_us"] / row["median_us"]
    except Exception as exc:  # noqa: BLE001 - a missing library or a failure is a row
        row.update({"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:400],
                    "trace": traceback.format_exc()[-1500:]})
    return row


def line(r: dict) -> str:
    shape = "x".join(str(v) for v in r["shape"].values())
    extra = ",".join(f"{k}={v}" for k, v in r["shape"].items() if k in ("kv_heads", "causal"))
    head = f"{r['family']:9s} {shape:22s} {extra:18s} {r['yardstick']:12s}"
    if r["status"] != "ok":
        return f"{head} FAILED: {r['error']}"
    return (f"{head} oracle {'pass' if r['oracle_pass'] else 'FAIL'} (worst/band {r['worst_over_band']:.3f})  "
            f"{r['median_us']:9.2f} us  floor {r['floor_us']:8.2f} us  ({100 * r['floor_fraction']:.1f}% of floor speed)")



def main() -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--gpu", default=None, help="GPU record name (default: the detected device's record)")
    p.add_argument("--family", default=None, help="only this family's cases")
    p.add_argument("--shape", default=None, help="with --family: this shape for every case of the family "
                   "(e.g. batch=4,seq=4096,heads=32,head_dim=128,causal=1)")
    p.add_argument("--dtype", default="bf16")
    add_json(p, "family_yardsticks")
    a = p.parse_args()
    cases = [c for c in CASES if a.family in (None, c[0])]
    if a.shape is not None:
        if a.family is None:
            p.error("--shape needs --family")
        from mosaic.errors import MosaicError as _Bad
        from mosaic.families import parse_shape

        try:
            shape = parse_shape(a.family, a.shape, "--shape")
        except _Bad as exc:
            p.error(exc.line())
        cases = list({(f, n): (f, shape, n) for f, _, n in cases}.values())  # one case per yardstick
    if not cases:
        p.error(f"no cases for --family {a.family}")
    a.gpu = gpu_record(a.gpu, on_device=True)
    from mosaic.plugins import host
    from mosaic.timing.device import L2Flush
    from mosaic.timing.timer import make_timer

    gpu = host().get("gpus", a.gpu)
    from mosaic.errors import MosaicError

    try:
        timer = make_timer("cupti")
        flush = L2Flush(gpu.l2_bytes)
    except MosaicError as exc:
        print(f"family_yardsticks: error: needs a CUDA device ({exc.line()})", flush=True)
        return 2
    log(f"timer {timer.source} {getattr(timer, 'reason', '')}; gpu record {gpu.name}")
    rows = []
    t0 = time.time()
    for family, shape, name in cases:
        rows.append(one(family, shape, name, gpu, timer, flush, a.runs, a.blocks, a.dtype))
        print(line(rows[-1]), flush=True)
    flush.close()
    path = write_json(json_path(a), {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "timer": timer.source,
                                     "gpu": gpu.name, "runs": a.runs, "blocks": a.blocks,
                                     "seconds": round(time.time() - t0, 1), "rows": rows}, indent=1, default=plain)
    log(f"wrote {path}")
    return 0 if all(r["status"] == "ok" and r["oracle_pass"] for r in rows if r["yardstick"] != "flash-attn-4") else 1


if __name__ == "__main__":
    raise SystemExit(main())
