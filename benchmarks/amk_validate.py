"""Validator throughput on schedules the size of a SmolLM2-135M lowering.

Builds a random-init checkpoint with SmolLM2-135M's real dimensions (30 layers, hidden 576, 9/3
heads, vocab 49152; transformers + save_pretrained, no hub), lowers one decode step at 16 positions
with the default ScheduleConfig (and with a coarse config: one task per GEMV), and measures
``validate()`` on the in-memory Schedule records: one process, then one process per core (the
validator is Python + numpy, so cores scale it), as schedules/s and tasks/s. It also measures the file
path (JSON text -> ``json.loads`` -> validate on the raw object, which reads it as columns without
building records), and the same two figures for the rule table alone (the pre-optimisation path)
(``mosaic_amk.validate.validate_rules``, "before"). Every timed validate must return ``ok``, and on
every timed schedule ``validate`` must equal the rule table (verdict and diagnostics) with the fast
screen itself accepting (``mosaic_amk.validate.parity.compare``).

Two floors are printed beside the figures: ``json.loads`` alone (the file path cannot beat it) and the
*read floor*: touching every value of the records that the rule table reads (the 9 task fields, every
wait's counter and threshold, every operand name, parameter value and ``ranges`` entry) with C-level
iteration and no checks at all. No validator reading these Python records in CPython gets below it.

Goal (issue #35): >= 2,000 schedules/s per core on the default lowering. Baseline: the AutoMegaKernel
paper reports 5,150 schedules/s (schedule sizes not stated).

    .venv/bin/python benchmarks/amk_validate.py [--seconds 3] [--parity N]

``--parity N`` also compares the fast path with the rule table on N single-injection mutants of each
audit class and 4N random DAGs (``mosaic_amk.validate.parity.run``) and prints the per-class table.
Prints a table and writes benchmarks/results/amk_validate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections import deque
from itertools import chain
from multiprocessing import get_context
from operator import attrgetter
from pathlib import Path

PAPER = 5150.0
_OK = type("Ok", (), {"ok": True})()
GOAL_PER_CORE = 2000.0  # issue #35: schedules/s per core on the default SmolLM2-135M lowering
_SCHEDULES: list = []
_FIELDS = [attrgetter(k) for k in ("id", "op", "sm", "signal", "inputs", "outputs", "waits", "params", "ranges")]
_COUNTER, _THRESHOLD = attrgetter("counter"), attrgetter("threshold")
_BUF = [attrgetter(k) for k in ("name", "shape", "kind")]


def _touch(s) -> None:
    """Read every value of the records that the rule table reads, C-level iteration, no checks."""
    tasks = s.tasks
    _, _, _, _, ins, outs, waits, params, ranges = (list(map(f, tasks)) for f in _FIELDS)
    for f in _BUF:
        deque(map(f, s.buffers), 0)
    flat = list(chain.from_iterable(waits))
    deque(map(_COUNTER, flat), 0)
    deque(map(_THRESHOLD, flat), 0)
    deque(chain.from_iterable(ins), 0)
    deque(chain.from_iterable(outs), 0)
    deque(chain.from_iterable(map(dict.values, params)), 0)
    deque(chain.from_iterable(ranges), 0)
    deque(chain.from_iterable(chain.from_iterable(map(dict.values, ranges))), 0)


def _loop_rate(fn, schedules: list, seconds: float) -> float:
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for s in schedules:
            fn(s)
            n += 1
    return n / (time.perf_counter() - t0)


def _rate(schedules: list, seconds: float, reference: bool = False) -> tuple[float, int]:
    from mosaic_amk.validate import validate
    from mosaic_amk.validate import validate_rules as validate_reference

    if reference:
        validate = validate_reference  # noqa: F811 - the "before" figure
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for s in schedules:
            if not validate(s).ok:
                raise SystemExit("a real lowering was rejected: the benchmark is void")
            n += 1
    return n / (time.perf_counter() - t0), n


def _worker(args: tuple[str, float]) -> tuple[float, int]:
    key, seconds = args
    return _rate([s for k, s in _SCHEDULES if k == key], seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="timing window per measurement")
    ap.add_argument("--parity", type=int, default=0, metavar="N",
                    help="also compare the fast path with the rule table on N mutants per audit class")
    args = ap.parse_args()

    from mosaic.plugins import host
    from mosaic_amk import columns
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.lowering import lower
    from mosaic_amk.schedule import Schedule
    from mosaic_amk.tiny_models import SMOLLM2_135M, make_checkpoint
    from mosaic_amk.validate import parity, validate
    from mosaic_amk.validate import validate_rules as validate_reference

    gpu = host().get("gpus", "h200")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="amk-bench-") as d:
        spec = import_checkpoint(make_checkpoint(d, config=SMOLLM2_135M))
    build_s = time.perf_counter() - t0
    configs = {
        "default": ScheduleConfig(),
        "coarse": ScheduleConfig(gemv_rows_per_task=1 << 20, lm_head_rows_per_task=1 << 20,
                                 attention_kv_heads_per_task=spec.num_kv_heads),
    }
    positions = range(0, 160, 10)
    for key, cfg in configs.items():
        _SCHEDULES.extend((key, lower(spec, cfg, gpu, p)) for p in positions)
    cores = os.cpu_count() or 1
    rows = []
    for key in configs:
        mine = [s for k, s in _SCHEDULES if k == key]
        for s in mine:  # the fast path decides every timed schedule, and equals the rule table on it
            ok, fast, diffs = parity.compare(s)
            if not (ok and fast and not diffs):
                raise SystemExit(f"fast path and rule table disagree on a real lowering ({ok}, {fast}, {diffs})")
        size = len(mine[0].tasks)
        one, n1 = _rate(mine, args.seconds)
        with get_context("fork").Pool(cores) as pool:
            parts = pool.map(_worker, [(key, args.seconds)] * cores)
        multi = sum(r for r, _ in parts)
        texts = [s.dumps() for s in mine]

        def json_rate(fn, texts=texts) -> float:
            t1 = time.perf_counter()
            n_json = 0
            while time.perf_counter() - t1 < args.seconds:
                for text in texts:
                    assert fn(json.loads(text)).ok
                    n_json += 1
            return n_json / (time.perf_counter() - t1)

        from_json = json_rate(validate)
        loads = json_rate(lambda raw: _OK)  # json.loads alone: the floor of the file path
        ref_one, _ = _rate(mine, args.seconds, reference=True)
        ref_json = json_rate(validate_reference)
        floor = _loop_rate(_touch, mine, args.seconds)  # reading the records alone
        cols = _loop_rate(columns.from_schedule, mine, args.seconds)  # the screen's first step alone
        Schedule.from_json(json.loads(texts[0]))  # the format round-trips
        rows.append({"config": key, "tasks": size, "buffers": len(mine[0].buffers),
                     "counters": mine[0].num_counters, "distinct_schedules": len(mine),
                     "schedules_per_s_1proc": round(one, 1), "schedules_per_s_all_cores": round(multi, 1),
                     "schedules_per_s_per_core": round(multi / cores, 1),
                     "tasks_per_s_1proc": round(one * size), "tasks_per_s_all_cores": round(multi * size),
                     "us_per_schedule_1proc": round(1e6 / one, 1),
                     "schedules_per_s_from_json_1proc": round(from_json, 1),
                     "json_loads_only_per_s": round(loads, 1), "validated_1proc": n1,
                     "read_floor_us": round(1e6 / floor, 1), "read_floor_schedules_per_s": round(floor, 1),
                     "columns_us": round(1e6 / cols, 1),
                     "before_schedules_per_s_1proc": round(ref_one, 1),
                     "before_schedules_per_s_from_json_1proc": round(ref_json, 1),
                     "speedup_1proc": round(one / ref_one, 1)})
    head = ["config", "tasks", "before 1 proc /s", "1 proc /s", "speedup", f"{cores} procs /s", "per core /s",
            "tasks/s (1 proc)", "us/schedule", "read floor us", "before JSON /s", "from JSON /s", "json.loads /s",
            "vs paper", "vs goal"]
    table = [[r["config"], r["tasks"], r["before_schedules_per_s_1proc"], r["schedules_per_s_1proc"],
              f"{r['speedup_1proc']}x", r["schedules_per_s_all_cores"], r["schedules_per_s_per_core"],
              f"{r['tasks_per_s_1proc'] / 1e6:.2f}M", r["us_per_schedule_1proc"], r["read_floor_us"],
              r["before_schedules_per_s_from_json_1proc"], r["schedules_per_s_from_json_1proc"],
              r["json_loads_only_per_s"],
              f"{r['schedules_per_s_all_cores'] / PAPER:.3f}x", f"{r['schedules_per_s_per_core'] / GOAL_PER_CORE:.3f}x"]
             for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *table]) for i in range(len(head))]
    for line in [head, ["-" * w for w in widths], *table]:
        print("  ".join(str(c).rjust(w) for c, w in zip(line, widths, strict=True)))
    d = next(r for r in rows if r["config"] == "default")
    met = d["schedules_per_s_per_core"] >= GOAL_PER_CORE
    print(f"SmolLM2-135M default lowering: {d['schedules_per_s_per_core']:.0f} schedules/s per core "
          f"({d['tasks_per_s_1proc'] / 1e6:.2f}M tasks/s in one process; {d['schedules_per_s_all_cores']:.0f}/s on "
          f"{cores} cores); goal {GOAL_PER_CORE:.0f}/s per core: {'met' if met else 'NOT met'}. Reading the records "
          f"alone takes {d['read_floor_us']:.0f} us ({d['read_floor_schedules_per_s']:.0f}/s at most per core), "
          f"the columns {d['columns_us']:.0f} us")
    parity_rows = []
    if args.parity:
        from mosaic_amk.validate.audit import real_lowerings

        t2 = time.perf_counter()
        parity_rows = parity.run(real_lowerings(), args.parity, 4 * args.parity, seed=1)
        print(parity.table(parity_rows))
        print(f"parity: {sum(r.schedules for r in parity_rows)} schedules in {time.perf_counter() - t2:.0f}s")
    out = Path(__file__).parent / "results" / "amk_validate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "amk_validate", "model": "SmolLM2-135M-shaped (random init)",
                               "baseline_paper_schedules_per_s": PAPER,
                               "goal_schedules_per_s_per_core": GOAL_PER_CORE, "goal_met": met, "cores": cores,
                               "python": platform.python_version(), "checkpoint_build_s": round(build_s, 1),
                               "rows": rows, "parity": [r.to_json() for r in parity_rows]}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
