"""Where the diff ranks each planted cause of the cause corpus, under whatever ranking the code has now.

For every pair of pairs.json: the planted (layer, key), its rank before (from before_ranks.json, written by
this script with the layer-ordered ranking of ``diff.rank_key`` at commit 9adebb1, before issue 38's cause
ranking), its rank now and the top three rows now. Lifts the committed cubins (the pip nvdisasm and cuobjdump; no nvcc).

    .venv/bin/python packages/core/tests/lift/causes/ranks.py            # the table
    .venv/bin/python packages/core/tests/lift/causes/ranks.py --json F   # also write the record (before_ranks.json's shape)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARTIFACTS = HERE / "artifacts"
SPEC = json.loads((HERE / "pairs.json").read_text())
BEFORE = HERE / "before_ranks.json"


def diff_pair(name: str):
    """The current diff of pair ``name`` (reference -> candidate), from the committed cubins."""
    from mosaic.lift.diff import diff_fingerprints
    from mosaic.lift.inputs import lift_path

    pair = SPEC["pairs"][name]
    return diff_fingerprints(lift_path(ARTIFACTS / f"{pair['ref']}.cubin"),
                             lift_path(ARTIFACTS / f"{pair['cand']}.cubin"))


def record() -> dict:
    """Per pair: the planted row, its rank now (0 when it is missing), the first six row keys, the symptoms."""
    out = {}
    for name, pair in SPEC["pairs"].items():
        rows = diff_pair(name).rows
        key = pair["planted"][1]
        rank = next((r.rank for r in rows if r.key == key), 0)
        out[name] = {"planted": pair["planted"], "rank_before": rank, "rows_before": [r.key for r in rows[:6]],
                     "symptoms": pair["symptoms"]}
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH", help="write the record (before_ranks.json's shape) to PATH")
    args = ap.parse_args(argv)
    now = record()
    before = json.loads(BEFORE.read_text()) if BEFORE.exists() else {}
    head = f"{'pair':<16} {'planted':<38} {'before':>6} {'now':>4}  top 3 now"
    print(head)
    print("-" * len(head))
    for name, r in now.items():
        was = before.get(name, {}).get("rank_before", "-")
        print(f"{name:<16} {'/'.join(r['planted']):<38} {was!s:>6} {r['rank_before']:>4}  "
              f"{', '.join(r['rows_before'][:3])}")
    first = sum(1 for r in now.values() if r["rank_before"] == 1)
    print(f"\nplanted row ranked first in {first} of {len(now)} pairs")
    if args.json:
        Path(args.json).write_text(json.dumps(now, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
