#!/usr/bin/env python3
"""The Pallas rmsnorm and softmax kernels (mosaic_target_pallas.rowwise) over their knob table on the GPU, each
configuration checked against the float64 oracle and timed interleaved with the family's torch yardstick (core's
CUPTI timer, an L2 flush before every run, the median of ``--blocks`` blocks of ``--runs`` runs), beside the
physical floor. Every table value that fits the shape is one row (a single edit of the defaults, mended by the
knob class's dependency table); a configuration that fails is a row saying so, never a crash.

    python3 benchmarks/pallas_rowwise.py [--shape 16384x8192] [--dtype bf16] [--runs 20] [--blocks 3]
    # prints one line per configuration; writes $OUT/pallas_rowwise.json
"""

from __future__ import annotations

import statistics
import time
import traceback

from _device import OneLineParser, add_json, json_path, log, plain, write_json


def timed(timer, flush, pair, runs, blocks) -> list[float]:
    """Median device time (us) of each runnable of ``pair``, interleaved run by run, over ``blocks`` blocks."""
    per = [[] for _ in pair]
    for i in range(blocks):
        for j, t in enumerate(timer.time_interleaved(pair, runs, warmup=5 if i == 0 else 1, flush=flush,
                                                     clocks=False)):
            per[j].append(statistics.median(t.times_ns))
    return [statistics.median(p) / 1e3 for p in per]


def one(family, shape, dtype, knobs, gpu, timer, flush, runs, blocks, workdir, inputs, torch, cache) -> dict:
    """One configuration: oracle check (the float64 reference computed once per family, ``cache``), then timed
    interleaved with the family's torch yardstick ``torch`` on the same inputs."""
    from mosaic.families import physical_floor_ns
    from mosaic.oracle import check
    from mosaic.records import KernelSpec
    from mosaic_target_pallas.backend import PallasBackend

    spec = KernelSpec(family=family, shape=shape, dtype=dtype, language="pallas", knobs=knobs)
    row = {"family": family, "knobs": knobs, "floor_us": physical_floor_ns(family, shape, dtype, gpu) / 1e3}
    try:
        mine = PallasBackend().prepare(spec, gpu, workdir, inputs)
        mine.poison()
        mine.launch()
        verdict = check(family, inputs, mine.output(), dtype, cache=cache)
        row.update({"oracle_pass": verdict.passed, "reason": verdict.reason})
        pallas_us, torch_us = timed(timer, flush, [mine, torch], runs, blocks)
        mine.close()
        row.update({"status": "ok", "pallas_us": pallas_us, "torch_us": torch_us,
                    "vs_torch": torch_us / pallas_us, "floor_fraction": row["floor_us"] / pallas_us})
    except Exception as exc:  # noqa: BLE001 - a failing configuration is a row
        row.update({"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:400],
                    "trace": traceback.format_exc()[-1500:]})
    return row


def line(r: dict, base: dict) -> str:
    edit = {k: v for k, v in r["knobs"].items() if base.get(k) != v} or "defaults"
    head = f"{r['family']:8s} {str(edit):60s}"
    if r["status"] != "ok":
        return f"{head} FAILED: {r['error']}"
    return (f"{head} oracle {'pass' if r['oracle_pass'] else 'FAIL'}  pallas {r['pallas_us']:8.2f} us  torch "
            f"{r['torch_us']:8.2f} us  (torch/pallas {r['vs_torch']:.3f})  floor {r['floor_us']:7.2f} us "
            f"({100 * r['floor_fraction']:.1f}%)")


def main() -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="16384x8192")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    p.add_argument("--families", default="rmsnorm,softmax")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--gpu", default="h200")
    add_json(p, "pallas_rowwise")
    a = p.parse_args()
    import tempfile
    from pathlib import Path

    import attrs
    from mosaic.errors import MosaicError
    from mosaic.families import make_inputs, yardstick_runnable
    from mosaic.oracle import check
    from mosaic.oracle.cache import ReferenceCache
    from mosaic.plugins import host
    from mosaic.records import KernelSpec
    from mosaic.timing.device import L2Flush
    from mosaic.timing.timer import make_timer
    from mosaic_target_pallas.rowwise_knobs import ROWWISE_KNOBS, table_configs

    try:
        rows, cols = (int(x) for x in a.shape.lower().split("x"))
    except ValueError:
        p.error(f"--shape must be ROWSxCOLS, got {a.shape!r}")
    gpu = host().get("gpus", a.gpu)
    try:
        timer = make_timer("cupti")
        flush = L2Flush(gpu.l2_bytes)
    except MosaicError as exc:
        print(f"pallas_rowwise: error: needs a CUDA device ({exc.line()})", flush=True)
        return 2
    log(f"timer {timer.source} {getattr(timer, 'reason', '')}; gpu record {gpu.name}; {rows}x{cols} {a.dtype}")
    shape = {"rows": rows, "cols": cols}
    out, t0 = [], time.time()
    workdir = Path(tempfile.mkdtemp(prefix="pallas_rowwise_"))
    for family in a.families.split(","):
        base = attrs.asdict(ROWWISE_KNOBS[family]())
        yard = KernelSpec(family, shape, a.dtype, "torch")
        inputs = make_inputs(yard, 0, "normal")
        torch = yardstick_runnable(yard, inputs)
        torch.poison()
        torch.launch()
        cache = ReferenceCache(None)
        verdict = check(family, inputs, torch.output(), a.dtype, cache=cache)
        log(f"{family}: torch yardstick oracle {'pass' if verdict.passed else 'FAIL: ' + verdict.reason}")
        seen = []
        for knob, value, knobs in table_configs(family, KernelSpec(family, shape, a.dtype, "pallas"), gpu):
            if knobs is None:
                print(f"{family:8s} {knob}={value}: does not fit {rows}x{cols} (no buildable compound edit)", flush=True)
                continue
            if knobs in seen:
                continue
            seen.append(knobs)
            out.append(one(family, shape, a.dtype, knobs, gpu, timer, flush, a.runs, a.blocks, workdir, inputs, torch,
                           cache))
            print(line(out[-1], base), flush=True)
        torch.close()
    flush.close()
    path = write_json(json_path(a), {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "timer": timer.source,
                                     "gpu": gpu.name, "shape": shape, "dtype": a.dtype, "runs": a.runs,
                                     "blocks": a.blocks, "seconds": round(time.time() - t0, 1), "rows": out},
                      indent=1, default=plain)
    log(f"wrote {path}")
    return 0 if all(r["status"] == "ok" and r["oracle_pass"] for r in out) else 1


if __name__ == "__main__":
    raise SystemExit(main())
