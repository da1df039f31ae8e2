"""The CUTLASS GEMM knob class ties the tile scheduler to the tiling, on the recorded Pallas -> CUTLASS 4096^3
campaign (H200, examples/h200-pallas-to-cutlass-gemm-4096/journal.jsonl).

There, step 3 tile_scheduler=persistent was rejected (slower) on 128x128 tiles, cluster 1x1, pingpong. With
the retry rule reading only the CUTLASS constructs, tile_scheduler interacted with kernel_schedule alone, so
on the 8192^3 winner's tiling (128x256, cluster 2x1) with the same kernel schedule the rejection still barred
it, although whether a persistent (or stream-K) tile loop pays depends on the tiles each SM walks. The knob
class now says so (``metadata={"interacts": ("tile_m", "tile_n", "cluster_m", "cluster_n")}``): the retry
key of the recorded rejection names the tiling; a new tiling is a new edit, the same tiling still is not."""

import json
from pathlib import Path

import pytest
from mosaic.catalog import catalog_from_host
from mosaic.plugins import host
from mosaic.proposers.knobs import KnobsProposer, blocked
from mosaic.run.campaign import Campaign
from mosaic.run.loop import proposer_history

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "examples" / "h200-pallas-to-cutlass-gemm-4096"
EVENTS = [json.loads(x) for x in (RECORDED / "journal.jsonl").read_text().splitlines()]
PERSISTENT = "7ba596698d3b8e84"  # step 3: tile_scheduler=persistent, rejected slower


@pytest.fixture(scope="module")
def proposer():
    c = Campaign.from_json(json.loads((RECORDED / "campaign.json").read_text()))
    return KnobsProposer(c, host().get("languages", "cutlass").backend.knobs("gemm"), catalog_from_host(host()))


def test_the_cutlass_knob_class_ties_the_tile_scheduler_to_the_tiling(proposer):
    got = proposer.interactions()
    assert {"tile_m", "tile_n", "cluster_m", "cluster_n", "kernel_schedule"} <= got["tile_scheduler"]
    for k in ("tile_m", "tile_n", "cluster_m", "cluster_n"):
        assert "tile_scheduler" in got[k]
    assert "tile_scheduler" not in got.get("stages", set())  # a stage count says nothing of the tile loop
    assert "tile_scheduler" not in got.get("epilogue_schedule", set())


def test_the_recorded_persistent_rejection_names_its_tiling(proposer):
    history = proposer_history([e for e in EVENTS if (e.get("step") or 0) <= 4])
    step3 = next(h for h in history if h["key"] == PERSISTENT)
    assert step3["outcome"] == "slower" and step3["edit"]["knob"] == "tile_scheduler"
    _, retries = blocked(history, proposer.interactions())
    (ctx,) = [c for knob, value, c in retries if (knob, value) == ("tile_scheduler", "persistent")]
    tried = step3["knobs"]
    assert dict(ctx) == {k: tried[k] for k in ("cluster_m", "cluster_n", "kernel_schedule", "tile_m", "tile_n")}
    assert dict(ctx) == {"cluster_m": 1, "cluster_n": 1, "kernel_schedule": "pingpong", "tile_m": 128, "tile_n": 128}

    def barred(knobs: dict) -> bool:  # the retry rule's key for tile_scheduler=persistent from these knobs
        names = proposer.interactions()["tile_scheduler"]
        return ("tile_scheduler", "persistent", tuple(sorted((k, knobs[k]) for k in names))) in retries

    assert barred(tried)  # the same tiling: never retried
    assert barred({**tried, "stages": 5})  # nor after a knob it does not interact with moves
    assert not barred({**tried, "tile_n": 256, "cluster_m": 2})  # the 8192^3 winner's tiling: a new edit
    assert not barred({**tried, "tile_m": 256})
    assert not barred({**tried, "cluster_n": 2})
