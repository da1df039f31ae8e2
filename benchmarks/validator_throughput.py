"""Validator throughput on one core: the SmolLM2-135M-shaped lowering, unmutated and mutated by every audit class.

Builds a random-init checkpoint with SmolLM2-135M's real dimensions (``tiny_models.SMOLLM2_135M``: 30 layers,
hidden 576, 9/3 heads, vocab 49152; transformers + save_pretrained, no hub), lowers one decode step with the
default ScheduleConfig at ``--positions`` positions (2,721 tasks each) and times, in this one process pinned to
one core (``os.sched_setaffinity``, where the platform has it; the affinity count before pinning is reported):

- ``rule-table``: ``mosaic_amk.validate.validate_rules``, the rule table alone (the definition);
- ``fast-path``: ``mosaic_amk.validate.validate``, the vectorised screen (``validate/screen.py``) and, on any
  doubt or problem, the rule table (so a rejected schedule costs the screen plus the rules);
- ``screen-only``: ``validate.screen.screen_records``, the screen's own cost (its True/False, no diagnostics);

each on (1) the unmutated lowerings (distinct schedule objects, one per position, cycled) and (2) one
single-injection mutant per audit class (``validate.audit.MUTATORS``) and position (``--mutant-positions``;
the page classes mutate the same positions lowered with ``pages = 4``, ``page_bytes = 16384``), so the
rejection paths are timed too. Every path is timed ``--repeats`` times; a repeat is one pass over the
schedules of its set; the table gives the mean (and the best) as schedules/s and tasks/s, by wall clock and by
CPU time (``time.process_time``: what another job on the shared core takes does not count). No path caches
anything between calls: each timed call validates its schedule in full.

Before timing, every schedule of both sets is compared with the rule table (``validate.parity.compare``: same
verdict and the same diagnostics in the same order, the screen never accepting what the rules reject); the
unmutated ones must be accepted by the screen itself. Beside the figures, the *floors*: the time to read one
field of every task (``Task.id``), the screen's columns (``columns.from_schedule``: the nine task fields and
each wait's counter and threshold), and every value the rule table reads (the columns plus every operand name,
parameter value and ``ranges`` entry) with C-level iteration and no check at all. No validator reading these
Python records in CPython runs below the last one.

Goal (issue #35): >= 2,000 schedules/s per core on this lowering (500 us a schedule, 5.4 M tasks/s).

    .venv/bin/python benchmarks/validator_throughput.py [--repeats 5] [--positions 16] [--mutant-positions 2]
        [--profile 15] [--json PATH]

Prints a table, the per-class figures and a cProfile of the fast path (the top ``--profile`` functions by own
time); with ``--json PATH`` writes every figure (per class and the profile too) there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from operator import attrgetter
from pathlib import Path

# every value of the records that the rule table reads, no checks: the floor amk_validate.py measures too
from amk_validate import _touch as read_all

GOAL_PER_CORE = 2000.0  # issue #35: schedules/s per core on the SmolLM2-135M lowering
ROOT = Path(__file__).resolve().parents[1]
_ID = attrgetter("id")


def read_one_field(s) -> None:
    """One attribute of every task (its id): the cost of a single pass over the records."""
    deque(map(_ID, s.tasks), 0)


def pin_one_core() -> dict:
    """Pin this process to one core of its affinity set; returns what was found and done."""
    if not hasattr(os, "sched_getaffinity"):
        return {"affinity_before": os.cpu_count(), "pinned_to": None}
    before = sorted(os.sched_getaffinity(0))
    core = before[0]
    os.sched_setaffinity(0, {core})
    return {"affinity_before": len(before), "pinned_to": core, "affinity_after": len(os.sched_getaffinity(0))}


def time_path(fn, schedules: list, repeats: int) -> dict:
    """``repeats`` passes of ``fn`` over ``schedules``: schedules/s per pass by wall clock and by CPU time."""
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        for s in schedules:
            fn(s)
        t1, c1 = time.perf_counter(), time.process_time()
        wall.append(len(schedules) / (t1 - t0))
        cpu.append(len(schedules) / max(c1 - c0, 1e-9))
    return {"per_s_wall": wall, "per_s_cpu": cpu, "mean_per_s_wall": statistics.fmean(wall),
            "best_per_s_wall": max(wall), "mean_per_s_cpu": statistics.fmean(cpu), "best_per_s_cpu": max(cpu),
            "mean_us_wall": 1e6 / statistics.fmean(wall), "schedules_per_pass": len(schedules)}


def build(positions: int, paged_positions: int) -> tuple[list, list, float]:
    from mosaic.gpus import DEFAULT_GPU
    from mosaic.plugins import host
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.lowering import lower
    from mosaic_amk.tiny_models import SMOLLM2_135M, make_checkpoint

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="validator-throughput-") as d:
        spec = import_checkpoint(make_checkpoint(d, config=SMOLLM2_135M))
    gpu = host().get("gpus", DEFAULT_GPU)
    out = [lower(spec, ScheduleConfig(), gpu, p) for p in range(0, 10 * positions, 10)]
    paged = [lower(spec, ScheduleConfig(pages=4, page_bytes=16384), gpu, p) for p in range(0, 10 * paged_positions, 10)]
    return out, paged, time.perf_counter() - t0


def mutants(bases: list, paged: list, per_class: int) -> dict[str, list]:
    """One single-injection mutant per audit class and base (the first ``per_class`` bases; for the page
    classes, ``audit.PAGE_CLASSES``, the same positions lowered with the page protocol); a class that has
    nothing to mutate on this lowering gets none."""
    from mosaic_amk.validate.audit import MUTATORS, PAGE_CLASSES

    out: dict[str, list] = {}
    for name, mutate in MUTATORS.items():
        got = []
        for k, base in enumerate((paged if name in PAGE_CLASSES else bases)[:per_class]):
            rng = random.Random(f"validator-throughput/{name}/{k}")
            for _ in range(20):
                m = mutate(base, rng)
                if m is not None:
                    got.append(m)
                    break
        out[name] = got
    return out


def check_parity(schedules: list, must_screen: bool) -> list[str]:
    """Differences between ``validate`` and the rule table on each schedule (must be none)."""
    from mosaic_amk.validate import parity

    problems = []
    for k, s in enumerate(schedules):
        ok, fast, diffs = parity.compare(s)
        problems.extend(f"#{k}: {d}" for d in diffs)
        if must_screen and not (ok and fast):
            problems.append(f"#{k}: a real lowering not accepted by the screen itself ({ok}, {fast})")
    return problems


def profile(fn, schedules: list, top: int) -> list[dict]:
    """cProfile of ``fn`` over ``schedules`` (3 passes): the ``top`` functions by own time, per schedule."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        for s in schedules:
            fn(s)
    prof.disable()
    n = 3 * len(schedules)
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    out = []
    for (path, line, name), (_, calls, own, cum, _) in rows:
        where = f"{Path(path).name}:{line}({name})" if line else name
        out.append({"function": where, "calls_per_schedule": calls / n, "own_us": 1e6 * own / n,
                    "cum_us": 1e6 * cum / n})
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _fmt_rate(r: dict, tasks: float) -> list:
    return [f"{r['mean_per_s_wall']:.1f}", f"{r['best_per_s_wall']:.1f}", f"{r['mean_per_s_cpu']:.1f}",
            f"{r['mean_per_s_wall'] * tasks / 1e6:.3f}M", f"{r['mean_us_wall'] / 1e3:.2f}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed passes over each set (the table gives the mean)")
    ap.add_argument("--positions", type=int, default=16, help="distinct unmutated lowerings (positions 0, 10, ...)")
    ap.add_argument("--mutant-positions", type=int, default=2, help="mutants per audit class (one per position)")
    ap.add_argument("--profile", type=int, default=15, metavar="N",
                    help="cProfile the fast path on the unmutated lowerings; print the top N functions (0: skip)")
    ap.add_argument("--json", type=Path, default=None, help="write every figure as JSON here")
    args = ap.parse_args(argv)

    from mosaic_amk.validate import validate, validate_rules
    from mosaic_amk.validate.audit import RULE_CLASSES
    from mosaic_amk.validate.screen import screen_records

    pinned = pin_one_core()
    bases, paged, build_s = build(args.positions, args.mutant_positions)
    tasks = len(bases[0].tasks)
    by_class = mutants(bases, paged, args.mutant_positions)
    muts = [m for ms in by_class.values() for m in ms]
    problems = check_parity(bases, must_screen=True) + check_parity(muts, must_screen=False)
    if problems:
        print("\n".join(problems[:20]))
        raise SystemExit("the fast path and the rule table disagree: the benchmark is void")
    codes = {name: sorted({d.code for m in ms for d in validate_rules(m).diagnostics}) for name, ms in by_class.items()}
    rejected = sum(not validate_rules(m).ok for m in muts)
    mut_tasks = statistics.fmean(len(m.tasks) for m in muts)

    paths = {"rule-table": validate_rules, "fast-path": validate, "screen-only": screen_records}
    rows = []
    for set_name, schedules, per_task in (("unmutated", bases, tasks), ("mutants", muts, mut_tasks)):
        for path, fn in paths.items():
            r = time_path(fn, schedules, args.repeats)
            rows.append({"set": set_name, "path": path, "tasks_per_schedule": round(per_task, 1),
                         "tasks_per_s_wall": round(r["mean_per_s_wall"] * per_task), **r})
    per_class = {}
    for name, ms in by_class.items():
        if ms:
            per_class[name] = {"mutants": len(ms), "codes": codes[name],
                               "rejected": sum(not validate_rules(m).ok for m in ms),
                               "rule_table": time_path(validate_rules, ms, args.repeats)["mean_per_s_wall"],
                               "fast_path": time_path(validate, ms, args.repeats)["mean_per_s_wall"]}
    floors = {name: time_path(fn, bases, args.repeats) for name, fn in
              (("read one field", read_one_field), ("read the columns", _columns_fn()),
               ("read every value", read_all))}

    head = ["set", "path", "/s mean", "/s best", "/s cpu", "tasks/s", "ms/schedule"]
    body = [[r["set"], r["path"], *_fmt_rate(r, r["tasks_per_schedule"])] for r in rows]
    body += [["floor", name, *_fmt_rate(r, tasks)] for name, r in floors.items()]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    print(f"SmolLM2-135M-shaped lowering: {tasks} tasks, {len(bases[0].buffers)} buffers, {bases[0].num_counters} "
          f"counters; {len(bases)} distinct unmutated schedules, {len(muts)} mutants ({rejected} rejected) of "
          f"{len(per_class)} classes; {args.repeats} repeats; affinity {pinned['affinity_before']} core(s), pinned to "
          f"{pinned['pinned_to']}; commit {_commit()}")
    for line in [head, ["-" * w for w in widths], *body]:
        print("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(line, widths,
                                                                                                      strict=True))))
    print()
    chead = ["class", "rule", "mutants", "rejected", "codes", "rule-table /s", "fast-path /s"]
    rule_of = {v: k for k, v in RULE_CLASSES.items()}
    cbody = [[name, rule_of.get(name, ""), c["mutants"], c["rejected"], ",".join(c["codes"]) or "-",
              f"{c['rule_table']:.1f}", f"{c['fast_path']:.1f}"] for name, c in per_class.items()]
    cw = [max(len(str(x[i])) for x in [chead, *cbody]) for i in range(len(chead))]
    for line in [chead, ["-" * w for w in cw], *cbody]:
        print("  ".join(str(c).ljust(w) if i < 2 or i == 4 else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(line, cw, strict=True))))
    empty = sorted(name for name, ms in by_class.items() if not ms)
    if empty:
        print(f"no mutant on this lowering (nothing to mutate): {', '.join(empty)}")
    prof = profile(validate, bases, args.profile) if args.profile else []
    if prof:
        print(f"\ncProfile of the fast path, {len(bases)} unmutated schedules x 3 (under the profiler, so slower); "
              "top functions by own time, us per schedule:")
        pw = max(len(p["function"]) for p in prof)
        for p in prof:
            print(f"  {p['function'].ljust(pw)}  {p['calls_per_schedule']:>8.1f} calls  {p['own_us']:>8.0f} own  "
                  f"{p['cum_us']:>8.0f} cumulative")
    fast = next(r for r in rows if r["set"] == "unmutated" and r["path"] == "fast-path")
    floor = floors["read every value"]["mean_per_s_wall"]
    met = fast["mean_per_s_wall"] >= GOAL_PER_CORE
    print(f"fast path, unmutated: {fast['mean_per_s_wall']:.0f} schedules/s on one core "
          f"({fast['tasks_per_s_wall'] / 1e6:.2f}M tasks/s); goal {GOAL_PER_CORE:.0f}/s: {'met' if met else 'NOT met'}; "
          f"reading every value the rules read, with no check, runs at {floor:.0f}/s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "validator_throughput", "model": "SmolLM2-135M-shaped (random init), default ScheduleConfig",
            "commit": _commit(), "python": platform.python_version(), "argv": sys.argv[1:] if argv is None else argv, "repeats": args.repeats,
            "tasks": tasks, "buffers": len(bases[0].buffers), "counters": bases[0].num_counters,
            "distinct_unmutated": len(bases), "mutants": len(muts), "mutants_rejected": rejected,
            "no_mutant_classes": empty, "build_s": round(build_s, 1), "cpu": pinned,
            "goal_schedules_per_s_per_core": GOAL_PER_CORE, "goal_met": met, "rows": rows,
            "floors": floors, "per_class": per_class, "profile": prof}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def _columns_fn():
    from mosaic_amk import columns

    return columns.from_schedule


if __name__ == "__main__":
    raise SystemExit(main())
