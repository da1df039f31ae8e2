"""Schedule-by-schedule parity of the fast validator with the rule table alone (validate_rules).

Regenerates exactly the schedules of ``mosaic amk audit --n N --seed S`` (same bases, same class plan,
same per-schedule seeds as ``mosaic_amk.validate.audit.run_audit``/``_job``; the oracle is not needed because its
labels do not depend on the validator) and checks, for each one, that ``validate`` and
``validate_reference`` return the same diagnostics (code, where, expected, actual, message, order), on
the records and on the raw JSON. It also counts how many accepted schedules the fast screen accepted by
itself (the rest were decided by the exact rules). Identical verdicts on every schedule, with the oracle
unchanged, mean the audit's per-class table (and its zero false accepts) is unchanged.

    .venv/bin/python benchmarks/amk_validate_parity.py [--n 20000] [--seed 5] [--workers 2]

Prints per-class counts and writes benchmarks/results/amk_validate_parity.json; exit 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from multiprocessing import get_context
from pathlib import Path

_BASES: list = []


def _plan(n: int) -> list[tuple[str, int]]:
    """run_audit's plan when no classes are given: a quarter random DAGs, the rest split over MUTATORS."""
    from mosaic_amk.validate.audit import MUTATORS

    names = list(MUTATORS)
    n_dag = n // 4
    per = (n - n_dag) // len(names)
    plan = [(name, per + (1 if k < (n - n_dag) % len(names) else 0)) for k, name in enumerate(names)]
    return [*plan, ("random-dag", n_dag)]


def _job(args: tuple) -> dict:
    from mosaic_amk import columns
    from mosaic_amk.validate import validate
    from mosaic_amk.validate import validate_rules as validate_reference
    from mosaic_amk.validate.audit import MUTATORS, random_dag
    from mosaic_amk.validate.screen import screen as _screen

    name, start, count, seed = args
    row = {"class": name, "schedules": 0, "rejected": 0, "screen_accepted": 0, "differences": [],
           "new_s": 0.0, "ref_s": 0.0}
    for k in range(start, start + count):
        rng = random.Random(f"{seed}/{name}/{k}")
        if name == "random-dag":
            s = random_dag(rng)
        else:
            s = None
            for _ in range(20):
                s = MUTATORS[name](_BASES[rng.randrange(len(_BASES))], rng)
                if s is not None:
                    break
            if s is None:
                continue
        row["schedules"] += 1
        raw = s.to_json()
        t0 = time.perf_counter()
        got, got_raw = validate(s), validate(raw)
        t1 = time.perf_counter()
        want, want_raw = validate_reference(s), validate_reference(raw)
        row["new_s"] += t1 - t0
        row["ref_s"] += time.perf_counter() - t1
        if got.diagnostics != want.diagnostics or got_raw.diagnostics != want_raw.diagnostics:
            row["differences"].append(k)
        row["rejected"] += not want.ok
        row["screen_accepted"] += bool(_screen(columns.from_schedule(s)))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    from mosaic_amk.validate import validate
    from mosaic_amk.validate import validate_rules as validate_reference
    from mosaic_amk.validate.audit import real_lowerings

    t0 = time.perf_counter()
    bases = real_lowerings(quick=args.n < 5000)
    for _, s in bases:
        assert validate(s).diagnostics == validate_reference(s).diagnostics == ()
    _BASES[:] = [s for _, s in bases]
    chunk = 500
    jobs = [(name, start, min(chunk, count - start), args.seed)
            for name, count in _plan(args.n) for start in range(0, count, chunk)]
    with get_context("fork").Pool(args.workers) as pool:
        parts = pool.map(_job, jobs)
    rows: dict[str, dict] = {}
    for p in parts:
        r = rows.setdefault(p["class"], {"class": p["class"], "schedules": 0, "rejected": 0, "screen_accepted": 0,
                                         "differences": [], "new_s": 0.0, "ref_s": 0.0})
        for k in ("schedules", "rejected", "screen_accepted", "new_s", "ref_s"):
            r[k] += p[k]
        r["differences"] += p["differences"]
    total = sum(r["schedules"] for r in rows.values())
    diffs = sum(len(r["differences"]) for r in rows.values())
    print(f"{'class':24s} {'schedules':>9s} {'rejected':>8s} {'screen-ok':>9s} {'differ':>6s}")
    for r in rows.values():
        print(f"{r['class']:24s} {r['schedules']:9d} {r['rejected']:8d} {r['screen_accepted']:9d} "
              f"{len(r['differences']):6d}")
    new_s, ref_s = sum(r["new_s"] for r in rows.values()), sum(r["ref_s"] for r in rows.values())
    print(f"{total} schedules (+{len(bases)} real lowerings): {diffs} differences; validate+raw time "
          f"new {new_s:.1f}s vs reference {ref_s:.1f}s; {time.perf_counter() - t0:.0f}s wall")
    out = Path(__file__).parent / "results" / "amk_validate_parity.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"n": args.n, "seed": args.seed, "schedules": total, "real_lowerings": len(bases),
                               "differences": diffs, "new_validate_s": round(new_s, 2),
                               "reference_validate_s": round(ref_s, 2), "classes": list(rows.values())},
                              indent=2) + "\n")
    print(f"wrote {out}")
    raise SystemExit(1 if diffs else 0)


if __name__ == "__main__":
    main()
