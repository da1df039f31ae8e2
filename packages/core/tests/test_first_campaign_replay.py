"""The first live Pallas -> CuTe campaign (H200, 2026-11-30, bf16 GEMM 4096^3; results/2026-11-30/
campaign-pallas-cute-1) replayed through the knobs proposer, CPU only.

The recorded run spent 6 of 11 steps on a 1-byte static shared-memory difference, tried swizzle=2 twice,
reverted its accepted persistent=true twice, and never moved the CTA tile (no concept mapped to it). The
reference's lowering record says its CTA tile is (128, 256); the naive CuTe candidate's is (128, 128).
Bundles (reference, the naive translation, the final incumbent) are trimmed copies (data/h200-first-campaign/trim.py).
"""

import json
from pathlib import Path

import pytest
from mosaic.bundle import verify_bundle
from mosaic.catalog import catalog_from_host
from mosaic.lift.diff import diff_fingerprints
from mosaic.lift.inputs import lift_bundle
from mosaic.plugins import host
from mosaic.proposers import Request
from mosaic.proposers.knobs import KnobsProposer
from mosaic.run.campaign import Campaign
from mosaic.run.loop import proposer_history

DATA = Path(__file__).parent / "data" / "h200-first-campaign"
NAIVE, FINAL = "60070b15b65cfb56", "bd67d5c7f402f91e"
EVENTS = [json.loads(line) for line in (DATA / "journal.jsonl").read_text().splitlines()]
KNOBS = {e["key"]: e["knobs"] for e in EVENTS if e["event"] == "proposal" and e.get("key")}


@pytest.fixture(scope="module")
def gpu():
    return host().get("gpus", "h200")


@pytest.fixture(scope="module")
def diffs(gpu):
    ref = lift_bundle(DATA / "reference.bundle", gpu=gpu)
    return {k: diff_fingerprints(ref, lift_bundle(DATA / f"cand-{k}.bundle", gpu=gpu)) for k in (NAIVE, FINAL)}


@pytest.fixture(scope="module")
def proposer():
    c = Campaign.from_json(json.loads((DATA / "campaign.json").read_text()))
    return KnobsProposer(c, host().get("languages", "cute").backend.knobs("gemm"), catalog_from_host(host()))


def propose(proposer, diffs, key, history=()):
    req = Request(campaign={}, parent=key, knobs=KNOBS[key], rows=diffs[key].rows, layers=diffs[key].layers,
                  incumbent={}, reference={}, tried=frozenset(), history=tuple(history))
    return proposer.propose(req)


def edits(proposals):
    return [(p.edit["knob"], p.edit["value"]) for p in proposals]


def test_the_trimmed_bundles_verify():
    bundles = sorted(DATA.glob("*.bundle"))
    assert len(bundles) == 3 and all(verify_bundle(b) == [] for b in bundles)
    notes = json.loads((DATA / "reference.bundle" / "lowering.json").read_text())["notes"]
    assert "cta_tile=(128, 256)" in notes


@pytest.mark.parametrize("key", [NAIVE, FINAL])
def test_a_one_byte_static_smem_difference_is_no_row(diffs, key):
    rows = {r.key: r for r in diffs[key].rows}
    assert "smem.static" not in rows  # reference 1 byte (jax), candidate 0
    assert rows["smem.dynamic"].reference == 229440 and rows["smem.dynamic"].candidate in (148480, 197632)


def test_the_naive_translation_reaches_the_reference_tile_within_five_proposals(proposer, diffs):
    out = propose(proposer, diffs, NAIVE)
    first = edits(out)
    assert ("tile_mn", [128, 256]) in first[:5], first[:10]
    tile = next(p for p in out if p.edit["knob"] == "tile_mn")
    # reached through a row whose concept is the CTA tile (its shared memory per stage, its MMAs per k-step, its
    # k-loop unroll: the causes-first ranking may put any of them first)
    assert tile.edit["concept"] == "cta-tile" and tile.edit["row"]["key"] in ("smem.dynamic", "hot_loop.mix",
                                                                             "loop.unroll")
    assert len({json.dumps(p.knobs, sort_keys=True) for p in out}) == len(out)  # no knob set listed twice


def test_proposer_history_folds_the_recorded_journal():
    h = proposer_history(EVENTS)
    assert [x["step"] for x in h] == list(range(1, 12))
    assert [x["outcome"] for x in h] == ["faster", "slower", "unbuildable", "faster", "slower", "slower", "slower",
                                         "slower", "null", "faster", "slower"]
    assert [x["step"] for x in h if x["accepted"]] == [1, 4, 10]
    assert h[0]["edit"]["knob"] == "persistent" and h[0]["knobs"]["persistent"] is True


def test_the_last_incumbent_neither_reverts_nor_retries(proposer, diffs):
    """Step 11 of the recorded run proposed persistent=false (reverting step 1) from the final incumbent."""
    history = proposer_history([e for e in EVENTS if (e.get("step") or 0) <= 10])
    before = edits(propose(proposer, diffs, FINAL))
    after = edits(propose(proposer, diffs, FINAL, history))
    # both grids are persistent (132 CTAs on 132 SMs): the grid row no longer leads to persistent=false at all
    assert ("persistent", False) not in before
    assert ("swizzle", 2) in before and ("stages", 4) in before and ("epi_tile", [64, 32]) in before
    # reverts of accepted edits: persistent false->true (1), stages 4->5 (4), epi_tile [64,32]->[64,64] (10)
    for edit in [("persistent", False), ("stages", 4), ("epi_tile", [64, 32])]:
        assert edit not in after
    # retries of rejected edits with the knobs they interact with unchanged (raster for swizzle)
    for edit in [("swizzle", 2), ("stages", 6), ("stages", 2)]:
        assert edit not in after
    assert after[0] == ("tile_mn", [128, 256])


def test_a_rejected_swizzle_comes_back_when_raster_moves_and_unbuildable_depends_on_every_knob(proposer, diffs):
    history = proposer_history([e for e in EVENTS if (e.get("step") or 0) <= 10])
    moved = {**KNOBS[FINAL], "raster": "n", "swizzle": 4}  # raster 'n' needs swizzle > 1
    req = Request(campaign={}, parent="x", knobs=moved, rows=diffs[FINAL].rows, layers=(), incumbent={},
                  reference={}, tried=frozenset(), history=tuple(history))
    assert ("swizzle", 2) in edits(proposer.propose(req))  # step 2/6 tried it with raster 'm'
    # step 3: stages=8 was unbuildable with persistent=true; from the naive (persistent=false) it is a new edit
    naive = edits(propose(proposer, diffs, NAIVE, history))
    assert ("stages", 8) in naive
    with_persistent = {**KNOBS[NAIVE], "persistent": True}  # exactly step 3's other knobs
    req = Request(campaign={}, parent="y", knobs=with_persistent, rows=diffs[NAIVE].rows, layers=(), incumbent={},
                  reference={}, tried=frozenset(), history=tuple(history))
    assert ("stages", 8) not in edits(proposer.propose(req))
