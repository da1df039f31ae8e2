"""Validator throughput on schedules the size of a SmolLM2-135M lowering.

Builds a random-init checkpoint with SmolLM2-135M's real dimensions (30 layers, hidden 576, 9/3
heads, vocab 49152; transformers + save_pretrained, no hub), lowers one decode step at 16 positions
with the default ScheduleConfig (and with a coarse config: one task per GEMV), and measures
``validate()`` on the in-memory Schedule records: one process, then one process per core (the
validator is Python + numpy, so cores scale it). It also measures the file path (JSON text ->
``json.loads`` -> validate on the raw object, which reads it as columns without building records), and
the same two figures for the rule table alone (the pre-optimisation path) (``mosaic_amk.validate.validate_rules``,
"before"). Every timed validate must return ``ok``.

Baseline: the AutoMegaKernel paper reports 5,150 schedules/s; the goal here is >= 50,000/s.

    .venv/bin/python benchmarks/amk_validate.py [--seconds 3]

Prints a table and writes benchmarks/results/amk_validate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

PAPER = 5150.0
_OK = type("Ok", (), {"ok": True})()
GOAL = 50000.0
_SCHEDULES: list = []


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
    args = ap.parse_args()

    from mosaic.plugins import host
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.lowering import lower
    from mosaic_amk.schedule import Schedule
    from mosaic_amk.tiny_models import SMOLLM2_135M, make_checkpoint
    from mosaic_amk.validate import validate
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
        Schedule.from_json(json.loads(texts[0]))  # the format round-trips
        rows.append({"config": key, "tasks": size, "buffers": len(mine[0].buffers),
                     "counters": mine[0].num_counters, "distinct_schedules": len(mine),
                     "schedules_per_s_1proc": round(one, 1), "schedules_per_s_all_cores": round(multi, 1),
                     "tasks_per_s_all_cores": round(multi * size), "us_per_schedule_1proc": round(1e6 / one, 1),
                     "schedules_per_s_from_json_1proc": round(from_json, 1),
                     "json_loads_only_per_s": round(loads, 1), "validated_1proc": n1,
                     "before_schedules_per_s_1proc": round(ref_one, 1),
                     "before_schedules_per_s_from_json_1proc": round(ref_json, 1),
                     "speedup_1proc": round(one / ref_one, 1)})
    head = ["config", "tasks", "before 1 proc /s", "1 proc /s", "speedup", f"{cores} procs /s", "us/schedule",
            "before JSON /s", "from JSON /s", "json.loads /s", "vs paper", "vs goal"]
    table = [[r["config"], r["tasks"], r["before_schedules_per_s_1proc"], r["schedules_per_s_1proc"],
              f"{r['speedup_1proc']}x", r["schedules_per_s_all_cores"], r["us_per_schedule_1proc"],
              r["before_schedules_per_s_from_json_1proc"], r["schedules_per_s_from_json_1proc"],
              r["json_loads_only_per_s"],
              f"{r['schedules_per_s_all_cores'] / PAPER:.3f}x", f"{r['schedules_per_s_all_cores'] / GOAL:.4f}x"]
             for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *table]) for i in range(len(head))]
    for line in [head, ["-" * w for w in widths], *table]:
        print("  ".join(str(c).rjust(w) for c, w in zip(line, widths, strict=True)))
    best = max(r["schedules_per_s_all_cores"] for r in rows if r["config"] == "default")
    print(f"SmolLM2-135M default lowering: {best:.0f} schedules/s on {cores} cores "
          f"(paper {PAPER:.0f}/s; goal {GOAL:.0f}/s: {'met' if best >= GOAL else 'NOT met'})")
    out = Path(__file__).parent / "results" / "amk_validate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "amk_validate", "model": "SmolLM2-135M-shaped (random init)",
                               "baseline_paper_schedules_per_s": PAPER, "goal_schedules_per_s": GOAL,
                               "goal_met": best >= GOAL, "cores": cores, "python": platform.python_version(),
                               "checkpoint_build_s": round(build_s, 1), "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
