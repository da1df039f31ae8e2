"""The knobs proposer offers the catalog's C++ rewrites for a parent that is a .cu kernel file, one cause at a time."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from mosaic.catalog import catalog_from_host
from mosaic.lift.causes import rank_rows
from mosaic.lift.diff import rank_key
from mosaic.plugins import host
from mosaic.proposers import Request
from mosaic.proposers.knobs import KnobsProposer
from mosaic.records import Discrepancy

SOFTMAX = Path(__file__).parent / "data" / "softmax.cu"


def proposer():
    campaign = SimpleNamespace(target="cutlass", family="softmax", shape={"rows": 4096, "cols": 8192}, dtype="f32",
                               gpu="h200", start=str(SOFTMAX))
    return KnobsProposer(campaign, None, catalog_from_host(host()))


def request(rows, source):
    return Request(campaign={}, parent="p", knobs={"threads": 256}, rows=rows, layers=(), incumbent={},
                   reference={}, tried=frozenset(), source=source)


def test_an_exact_exp_gets_the_approximate_rewrite_first_and_a_division_its_own_cause():
    rows = rank_rows([(Discrepancy("numerics", "exp.form", ["approx"], ["precise"], 1, "knob"), 1.0),
                      (Discrepancy("machine", "hot_loop.length", 600, 14000, 1, "knob"), 0.95),
                      (Discrepancy("numerics", "div.form", ["approx"], ["ieee"], 1, "knob"), 1.0)], rank_key)
    assert [(r.key, r.cause) for r in rows][:2] == [("exp.form", ""), ("hot_loop.length", "exp.form")]
    out = proposer().propose(request(rows, SOFTMAX.read_text()))
    sources = [p for p in out if p.edit["kind"] == "source"]
    names = [p.edit["rewrite"] for p in sources]
    # each cause's first rewrite before any cause's second: exp's, then division's, then exp's next
    assert names[0] in ("exp-approx@cutlass", "exp2-fold@cutlass", "fast-math@cutlass")
    assert names[1] in ("div-approx@cutlass", "fast-math@cutlass") and names[1] != names[0]
    assert "exp-precise@cutlass" not in names and "div-ieee@cutlass" not in names  # the wrong direction
    first = sources[0]
    assert first.source != SOFTMAX.read_text() and first.edit["row"]["key"] == "exp.form"
    assert first.edit["name"] == "softmax.cu" and first.edit["origin"] == "rewrite" and first.parent == "p"
    assert len({p.edit["sha256"] for p in sources}) == len(sources)


def test_no_source_no_rewrite():
    rows = rank_rows([(Discrepancy("numerics", "exp.form", ["approx"], ["precise"], 1, "knob"), 1.0)], rank_key)
    assert [p for p in proposer().propose(request(rows, None)) if p.edit["kind"] == "source"] == []
