"""Benchmark: what the knobs proposer would try first on a recorded campaign's naive translation (CPU only).

Reads a campaign directory (or a ``campaign.tar.xz`` of one): lifts the reference bundle and the naive
candidate's bundle, diffs them with today's ranking and asks today's knobs proposer for its edits, as the live
loop does at step 1. Prints the ranked rows (causes first, symptoms marked ``<-``), the first ``--first``
edits, and where the edits of ``--knob`` (e.g. ``approx_math``) come in the list, and writes JSON.

    .venv/bin/python benchmarks/first_proposals.py results/2026-12-03/session14/softmax/campaign.tar.xz \\
        --knob approx_math [--json PATH]

The recorded H200 softmax campaign (quack's CuTe DSL softmax -> Pallas, 16384x8192 bf16) spent its 3.5 device
minutes on the grid and never tried ``approx_math``; run against the tree of that day (83b89c4) this prints
``approx_math`` 11th of 21 edits.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path


def campaign_dir(path: Path, scratch: Path) -> Path:
    if path.is_dir():
        return path
    with tarfile.open(path) as tar:
        tar.extractall(scratch, filter="data")
    found = [p.parent for p in scratch.rglob("campaign.json")]
    if len(found) != 1:
        sys.exit(f"error: {path} holds {len(found)} campaign directories, expected one")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("campaign", type=Path, help="a campaign directory or a campaign.tar.xz")
    ap.add_argument("--knob", default=None, help="report where this knob's first edit comes")
    ap.add_argument("--first", type=int, default=8, help="edits to list")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if not args.campaign.exists():
        sys.exit(f"error: {args.campaign} does not exist")

    from mosaic.catalog import catalog_from_host
    from mosaic.lift.diff import diff_fingerprints
    from mosaic.lift.inputs import lift_bundle
    from mosaic.plugins import host
    from mosaic.proposers import Request
    from mosaic.proposers.knobs import KnobsProposer
    from mosaic.run.campaign import Campaign

    with tempfile.TemporaryDirectory() as tmp:
        d = campaign_dir(args.campaign, Path(tmp))
        c = Campaign.from_json(json.loads((d / "campaign.json").read_text()))
        gpu = host().get("gpus", c.gpu)
        events = [json.loads(x) for x in (d / "journal.jsonl").read_text().splitlines()]
        naive = next(e for e in events if e["event"] == "proposal" and e.get("step") == 0)
        ref = lift_bundle(d / "bundles" / "reference.bundle", gpu=gpu)
        cand = lift_bundle(d / "bundles" / f"cand-{naive['key']}.bundle", gpu=gpu)
        diff = diff_fingerprints(ref, cand)
        knob_cls = host().get("languages", c.target).backend.knobs(c.family)
        proposer = KnobsProposer(c, knob_cls, catalog_from_host(host()))
        out = proposer.propose(Request(campaign=c.to_json(), parent=naive["key"], knobs=naive["knobs"],
                                       rows=diff.rows, layers=diff.layers, incumbent={}, reference={},
                                       tried=frozenset(), gpu=gpu.to_json()))
    print(f"{c.source} -> {c.target}, {c.family} {c.shape} {c.dtype} on {c.gpu}: naive {naive['key']}")
    print(f"{'rank':>4}  {'key':<34} {'cost':>5}")
    for r in diff.rows:
        print(f"{r.rank:>4}  {('  <- ' if r.cause else '') + r.key:<34} {r.cost:5.2f}")
    edits = []
    for n, p in enumerate(out, 1):
        e = p.edit or {}
        edits.append({"n": n, "knob": e.get("knob"), "value": e.get("value"), "rewrite": e.get("rewrite"),
                      "row": (e.get("row") or {}).get("key"), "row_rank": (e.get("row") or {}).get("rank"),
                      "parts": [(x["knob"], x["value"]) for x in e.get("parts", [])[1:]]})
    print(f"\nfirst {min(args.first, len(edits))} of {len(edits)} edits:")
    for e in edits[:args.first]:
        what = e["rewrite"] or f"{e['knob']}={e['value']}"
        extra = " + " + ", ".join(f"{k}={v}" for k, v in e["parts"]) if e["parts"] else ""
        print(f"{e['n']:>3}  {what}{extra}  (row {e['row']}, rank {e['row_rank']})")
    at = None
    if args.knob:
        at = next((e["n"] for e in edits if e["knob"] == args.knob), None)
        print(f"\n{args.knob}: edit {at} of {len(edits)}" if at else f"\n{args.knob}: not proposed")
    if args.json:
        args.json.write_text(json.dumps({"campaign": c.to_json(), "naive": naive["key"],
                                         "rows": [r.to_json() for r in diff.rows], "edits": edits,
                                         "knob": args.knob, "knob_at": at}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
