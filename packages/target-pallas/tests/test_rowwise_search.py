"""The ``knobs`` proposer reaches the Pallas row-wise knob table from the rows a CuTe DSL rmsnorm reference (quack's)
leaves against the Pallas rmsnorm (the reverse campaign of issue 19): the pallas constructs name the row-wise knobs
beside the gemm ones (nothing is built: proposals only, checked with the plugin's CPU can-implement predicate).

The rows are the ones the fingerprints differ in: quack's, lifted from its CPU lowering (``mosaic lift`` of the
``mosaic run --reference examples/kernels/cute/quack_rmsnorm.py`` preview's reference bundle: 128 threads, 1 KiB
static shared memory, cp.async loads, st.global stores, 16 warps per SM) against the Pallas defaults (215064 B of
dynamic shared memory, TMA loads and stores, one CTA of 4 warps per SM)."""

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from mosaic.catalog import catalog_from_host
from mosaic.plugins import host
from mosaic.proposers import Request
from mosaic.proposers.knobs import KnobsProposer, construct_knobs
from mosaic.records import Discrepancy, KernelSpec
from mosaic.run.campaign import Campaign
from mosaic_target_pallas.constructs import CONSTRUCTS
from mosaic_target_pallas.knobs import FAMILY_KNOBS
from mosaic_target_pallas.rowwise_knobs import ROWWISE_KNOBS, can_implement

#: the H200's first minutes of the campaign (2026-12-02): quack's captured reference and the naive Pallas gate bundle
H200 = (Path(__file__).resolve().parents[3] / "results" / "2026-12-02" / "session9" / "C-reverse" /
        "h200-quack-rmsnorm-to-pallas" / "bundles")
ROWS = (Discrepancy("launch", "smem.dynamic", 0, 215064, 1, "knob"),
        Discrepancy("launch", "smem.static", 1024, 0, 2, "knob"),
        Discrepancy("launch", "grid", [2048, 1, 1], [1024, 1, 1], 3, "knob"),
        Discrepancy("launch", "occupancy.warps_per_sm", 16, 4, 4, "knob"),
        Discrepancy("instruction", "transfer.form", ["cp.async"], ["tma"], 5, "rewrite"),
        Discrepancy("instruction", "transfer.store_form", ["st.global"], ["tma.store"], 6, "rewrite"))


def test_every_construct_knob_is_a_field_of_a_pallas_knob_class():
    fields = {f.name for cls in (*FAMILY_KNOBS.values(), *ROWWISE_KNOBS.values()) for f in attrs.fields(cls)}
    rowwise = {f.name for cls in ROWWISE_KNOBS.values() for f in attrs.fields(cls)}
    named = set()
    for c in CONSTRUCTS:
        for knob, _ in construct_knobs(c.expression):
            assert knob in fields, f"{c.concept}: {knob!r} is no Pallas knob"
            named.add(knob)
    assert rowwise - named == {"online"}  # every row-wise knob but softmax's algorithm choice has a concept


@pytest.mark.parametrize("family", ["rmsnorm", "softmax"])
def test_the_reference_rows_reach_the_row_wise_knobs(family):
    cls = ROWWISE_KNOBS[family]
    c = Campaign.from_json({"source": "cute", "target": "pallas", "family": family, "shape": "16384x8192",
                            "dtype": "bf16"})
    req = Request(campaign=c.to_json(), parent="p", knobs=attrs.asdict(cls()), rows=ROWS, layers=(), incumbent={},
                  reference={}, tried=frozenset())
    proposals = KnobsProposer(c, cls, catalog_from_host(host())).propose(req)
    gpu = host().get("gpus", "h200")
    spec = KernelSpec(family=family, shape={"rows": 16384, "cols": 8192}, dtype="bf16", language="pallas", knobs={})
    buildable = {(p.edit["knob"], p.edit["value"]) for p in proposals if not can_implement(cls(**p.knobs), spec, gpu)}
    # blocks_per_cta only from a grid row read as persistence (the knobs proposer may decide that a grid row whose
    # both sides exceed the SM count says nothing about a persistent loop)
    required = {"max_concurrent_steps", "copy", "out_slots", "block_rows", "tma_cols"}
    assert required <= {k for k, _ in buildable} <= required | {"blocks_per_cta"}, buildable
    # no TMA, no shared-memory ring, like the reference: reached through the shared-memory rows
    assert ("copy", "direct") in buildable
    # a third stage fits 8192 columns only in place: the smem rule's compound edit
    third = next(p for p in proposals if (p.edit["knob"], p.edit["value"]) == ("max_concurrent_steps", 3))
    assert third.edit.get("compound") and third.knobs["out_slots"] == 0
    # two-row blocks need a narrower vector (two warps share a row)
    two = next(p for p in proposals if (p.edit["knob"], p.edit["value"]) == ("block_rows", 2))
    assert two.knobs["vector"] == 4
    assert len(buildable) >= 8, buildable


def test_the_h200_diff_reaches_the_row_wise_knobs():
    """The real rows: ``mosaic diff`` of the H200's quack reference bundle (132.42 us) against the naive Pallas
    candidate's gate bundle (180.50 us) -- grid 16384 vs 1024, dynamic shared memory 16400 vs 215064 B, 121 vs 56
    registers, 16 vs 4 warps per SM, cp.async vs TMA -- and the knobs proposer's edits from them."""
    ref, cand = H200 / "reference.bundle", H200 / "cand-fd6b813df4bd086f.bundle"
    if not (ref.is_dir() and cand.is_dir()):
        pytest.skip(f"the recorded H200 bundles are not in this checkout ({H200})")
    p = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "diff", "--json", str(ref),
                        str(cand)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    fields = ("layer", "key", "reference", "candidate", "rank", "edit", "where", "why")
    rows = tuple(Discrepancy(**{k: r[k] for k in fields}) for r in json.loads(p.stdout)["rows"])
    by_key = {r.key: r for r in rows}
    assert by_key["grid"].reference == [16384, 1, 1] and by_key["grid"].candidate == [1024, 1, 1]
    assert by_key["smem.dynamic"].candidate == 215064  # the knob class's own count of the defaults' buffers
    cls = ROWWISE_KNOBS["rmsnorm"]
    c = Campaign.from_json({"source": "cute", "target": "pallas", "family": "rmsnorm", "shape": "16384x8192",
                            "dtype": "bf16"})
    req = Request(campaign=c.to_json(), parent="p", knobs=attrs.asdict(cls()), rows=rows, layers=(), incumbent={},
                  reference={}, tried=frozenset())
    proposals = KnobsProposer(c, cls, catalog_from_host(host())).propose(req)
    gpu = host().get("gpus", "h200")
    spec = KernelSpec(family="rmsnorm", shape={"rows": 16384, "cols": 8192}, dtype="bf16", language="pallas",
                      knobs={})
    buildable = [(p.edit["knob"], p.edit["value"]) for p in proposals if not can_implement(cls(**p.knobs), spec, gpu)]
    # the top-ranked rows lead: grid (blocks_per_cta, when the proposer reads it as persistence) and smem.dynamic
    assert proposals[0].edit["row"]["key"] in ("grid", "smem.dynamic")
    assert {k for k, _ in buildable} >= {"max_concurrent_steps", "copy", "out_slots", "block_rows", "blocks_per_cta"}
    # blocks_per_cta through the CTA tile (block_rows x blocks_per_cta rows), whatever the grid row says: longer walks
    # pay the pipeline's fill (the weight row and the first stages) fewer times
    assert ("blocks_per_cta", 16) in buildable and ("blocks_per_cta", 32) in buildable
    # round robin over causes: the first round is one edit per cause, so the store-form cause's best edit, the
    # direct loads (no shared memory: many CTAs per SM), comes within it, and 2-row blocks (half the buffers) soon
    # after; a third stage (in place) is a later edit of the transfer-form cause (its smem.dynamic symptom asks for
    # less shared memory first), but still before the long walks (blocks_per_cta 8, 16, 32)
    order = [(p.edit["knob"], p.edit["value"]) for p in proposals]
    causes = {p.edit["row"]["key"] for p in proposals}
    assert ("copy", "direct") in order[:len(causes) + 1], order
    assert order.index(("block_rows", 2)) < 2 * (len(causes) + 1), order
    assert order.index(("max_concurrent_steps", 3)) < order.index(("blocks_per_cta", 8)), order
    assert ("block_rows", 2) in buildable
    assert len(buildable) >= 8, buildable
