#!/usr/bin/env python3
"""The Pallas rmsnorm and softmax kernels (mosaic_target_pallas.rowwise) over their knob table on the GPU, each
configuration checked against the float64 oracle and timed interleaved with the family's torch yardstick (core's
CUPTI timer, an L2 flush before every run, the median of ``--blocks`` blocks of ``--runs`` runs), beside the
physical floor. Every table value that fits the shape is one row (a single edit of the defaults, mended by the
knob class's dependency table); a configuration that fails is a row saying so, never a crash.

    python3 benchmarks/pallas_rowwise.py [--shape 16384x8192] [--dtype bf16] [--runs 20] [--blocks 3]
    # prints one line per configuration; writes $OUT/pallas_rowwise.json

A handful of chosen configurations instead of the whole table (seconds, not minutes: what a campaign's first
edits can reach before it runs):

    python3 benchmarks/pallas_rowwise.py --families rmsnorm --only "defaults;copy=direct;block_rows=2,vector=4,out_slots=0"
    python3 benchmarks/pallas_rowwise.py --families rmsnorm --configs FILE   # one configuration a line, same form

Each configuration is ``knob=value,...`` over the knob class's defaults (``defaults``: none). Refused before
any GPU work when a knob or value is unknown or does not fit the shape (one line, exit 2). With ``--only`` or
``--configs`` the oracle checks a sample of whole rows (``--check rows``, default: both families are row-wise,
so every row is its own problem; every element of the output is still scanned for NaN/inf, the poisoned
buffer's unwritten elements) instead of the full float64 reference (``--check full``); ``--time-budget S``
starts no configuration after S seconds.
"""

from __future__ import annotations

import statistics
import time
import traceback
from pathlib import Path

from _device import OneLineParser, add_json, gpu_record, json_path, log, plain, write_json


def timed(timer, flush, pair, runs, blocks) -> list[float]:
    """Median device time (us) of each runnable of ``pair``, interleaved run by run, over ``blocks`` blocks."""
    per = [[] for _ in pair]
    for i in range(blocks):
        for j, t in enumerate(timer.time_interleaved(pair, runs, warmup=5 if i == 0 else 1, flush=flush,
                                                     clocks=False)):
            per[j].append(statistics.median(t.times_ns))
    return [statistics.median(p) / 1e3 for p in per]


START = time.time()
#: rows the ``--check rows`` oracle takes (evenly spaced, first and last included)
SAMPLE_ROWS = 512


def row_sample_check(family, inputs, outputs, dtype):
    """The float64 oracle on SAMPLE_ROWS whole rows (a row-wise family's rows are independent problems), after a
    scan of the whole output for non-finite values (an element the kernel never wrote is NaN)."""
    import numpy as np
    from mosaic.oracle import check

    y = np.asarray(outputs["y"])
    bad = int(np.count_nonzero(~np.isfinite(y)))
    rows = np.unique(np.linspace(0, y.shape[0] - 1, min(SAMPLE_ROWS, y.shape[0])).astype(np.int64))
    sub = {k: (v[rows] if k == "x" else v) for k, v in inputs.items()}
    verdict = check(family, sub, {"y": y[rows]}, dtype)
    passed = verdict.passed and not bad
    reason = "; ".join(r for r in (f"{bad} non-finite element(s) in the whole output" if bad else "",
                                   verdict.reason) if r)
    return passed, reason, f"{len(rows)} sampled rows + a non-finite scan of every element"


def one(family, shape, dtype, knobs, gpu, timer, flush, runs, blocks, workdir, inputs, torch, cache,
        check_mode="full") -> dict:
    """One configuration: oracle check (the float64 reference computed once per family, ``cache``; or
    ``check_mode="rows"``: :func:`row_sample_check`), then timed interleaved with the family's torch yardstick
    ``torch`` on the same inputs."""
    from mosaic.families import physical_floor_ns
    from mosaic.oracle import check
    from mosaic.records import KernelSpec
    from mosaic_target_pallas.backend import PallasBackend

    spec = KernelSpec(family=family, shape=shape, dtype=dtype, language="pallas", knobs=knobs)
    row = {"family": family, "knobs": knobs, "floor_us": physical_floor_ns(family, shape, dtype, gpu) / 1e3}
    try:
        t0 = time.monotonic()
        mine = PallasBackend().prepare(spec, gpu, workdir, inputs)
        mine.poison()
        mine.launch()
        row["prepare_s"] = round(time.monotonic() - t0, 2)
        if check_mode == "rows":
            passed, reason, how = row_sample_check(family, inputs, mine.output(), dtype)
            row.update({"oracle_pass": passed, "reason": reason, "oracle": how})
        else:
            verdict = check(family, inputs, mine.output(), dtype, cache=cache)
            row.update({"oracle_pass": verdict.passed, "reason": verdict.reason, "oracle": "every element"})
        # jax's own stream vs torch's and the flush's: every timed run alone on the device
        from mosaic.timing.device import Serialized

        pallas_us, torch_us = timed(timer, flush, [Serialized(mine), Serialized(torch)], runs, blocks)
        row["serialized"] = True  # sessions 9-10's sweeps were not: the L2 flush could overlap the Pallas kernel
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
    return (f"{head} oracle {'pass' if r['oracle_pass'] else 'FAIL: ' + r['reason'][:200]}  pallas {r['pallas_us']:8.2f} us  torch "
            f"{r['torch_us']:8.2f} us  (torch/pallas {r['vs_torch']:.3f})  floor {r['floor_us']:7.2f} us "
            f"({100 * r['floor_fraction']:.1f}%)")


def parse_configs(text: str, cls, rows: int, cols: int, gpu, dtype: str) -> list[dict]:
    """``knob=value,...;...`` (``defaults``: no edit) -> full knob dicts over ``cls``'s defaults; ValueError with one
    line for an unknown knob, a bad value or knobs that do not fit the shape or the GPU."""
    import attrs
    from mosaic.records import KernelSpec
    from mosaic_target_pallas.rowwise_knobs import can_implement

    names = {f.name for f in attrs.fields(cls)}
    out = []
    for item in (t.strip() for t in text.replace("\n", ";").split(";")):
        if not item or item.startswith("#"):
            continue
        edit = {}
        for part in ([] if item == "defaults" else item.split(",")):
            k, eq, v = part.partition("=")
            if not eq or k.strip() not in names:
                raise ValueError(f"configuration {item!r}: {part!r} is not knob=value with a knob of "
                                 f"{cls.__name__} ({', '.join(sorted(names))})")
            edit[k.strip()] = v.strip()
        try:
            knobs = cls(**edit)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"configuration {item!r}: {exc}") from None
        spec = KernelSpec(family=cls.__name__.replace("Knobs", "").lower(), shape={"rows": rows, "cols": cols},
                          dtype=dtype, language="pallas", knobs={})
        bad = can_implement(knobs, spec, gpu)
        if bad:
            raise ValueError(f"configuration {item!r} cannot run at {rows}x{cols}: "
                             + "; ".join(d.line() for d in bad))
        full = attrs.asdict(knobs)
        if full not in out:
            out.append(full)
    if not out:
        raise ValueError("no configuration given")
    return out



def main() -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="16384x8192")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    p.add_argument("--families", default="rmsnorm,softmax")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--gpu", default=None, help="GPU record name (default: the detected device's record)")
    p.add_argument("--only", default=None, help="configurations 'knob=value,...;...' (instead of the whole table)")
    p.add_argument("--configs", type=Path, default=None, help="a file of configurations, one a line")
    p.add_argument("--check", choices=("rows", "full"), default=None,
                   help="oracle: 'rows' (a sample of whole rows; default with --only/--configs) or 'full'")
    p.add_argument("--time-budget", type=float, default=0.0, help="start no configuration after S seconds")
    add_json(p, "pallas_rowwise")
    a = p.parse_args()
    a.gpu = gpu_record(a.gpu, on_device=True)
    import tempfile

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
    chosen: dict[str, list[dict]] = {}
    if a.only is not None or a.configs is not None:
        if a.only is not None and a.configs is not None:
            p.error("give --only or --configs, not both")
        try:
            text = a.only if a.only is not None else a.configs.read_text()
        except OSError as exc:
            p.error(f"--configs: {exc}")
        for family in a.families.split(","):
            if family not in ROWWISE_KNOBS:
                p.error(f"unknown family {family!r}; known: {', '.join(ROWWISE_KNOBS)}")
            try:
                chosen[family] = parse_configs(text, ROWWISE_KNOBS[family], rows, cols, gpu, a.dtype)
            except ValueError as exc:
                p.error(str(exc))
    check_mode = a.check or ("rows" if chosen else "full")
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
        if check_mode == "rows":
            passed, reason, _ = row_sample_check(family, inputs, torch.output(), a.dtype)
        else:
            verdict = check(family, inputs, torch.output(), a.dtype, cache=cache)
            passed, reason = verdict.passed, verdict.reason
        log(f"{family}: torch yardstick oracle ({check_mode}) {'pass' if passed else 'FAIL: ' + reason}")
        seen = []
        configs = ([(None, None, k) for k in chosen[family]] if chosen else
                   table_configs(family, KernelSpec(family, shape, a.dtype, "pallas"), gpu))
        for knob, value, knobs in configs:
            if a.time_budget and time.time() - START > a.time_budget:
                log(f"time budget {a.time_budget:.0f} s spent: {knobs} and what follows not run")
                out.append({"family": family, "knobs": knobs, "status": "not run", "error": "time budget spent"})
                break
            if knobs is None:
                print(f"{family:8s} {knob}={value}: does not fit {rows}x{cols} (no buildable compound edit)", flush=True)
                continue
            if knobs in seen:
                continue
            seen.append(knobs)
            out.append(one(family, shape, a.dtype, knobs, gpu, timer, flush, a.runs, a.blocks, workdir, inputs, torch,
                           cache, check_mode))
            print(line(out[-1], base), flush=True)
        torch.close()
    flush.close()
    path = write_json(json_path(a), {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "timer": timer.source,
                                     "gpu": gpu.name, "shape": shape, "dtype": a.dtype, "runs": a.runs,
                                     "blocks": a.blocks, "check": check_mode, "seconds": round(time.time() - t0, 1), "rows": out},
                      indent=1, default=plain)
    log(f"wrote {path}")
    return 0 if all(r["status"] == "ok" and r["oracle_pass"] for r in out) else 1


if __name__ == "__main__":
    raise SystemExit(main())
