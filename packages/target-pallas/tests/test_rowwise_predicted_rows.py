"""The row-wise knob classes predict two rows of the diff (``PREDICTS``: dynamic shared memory and grid), and the
``knobs`` proposer orders its edits by them (``mosaic.proposers.predicted``).

The predictions are checked against the H200: every candidate the session-12 quack rmsnorm -> Pallas campaign built
(``results/2026-12-02/session12/rmsnorm-campaign/campaign.tar.xz``) recorded its launch as CUPTI saw it, and the
prediction from the candidate's knobs must read the same bytes and the same grid. The ordering is checked from two
states of that campaign, with its real rows (quack: 16384 CTAs, 16400 B of dynamic shared memory)."""

import io
import json
import tarfile
from pathlib import Path

import attrs
import pytest
from mosaic.catalog import catalog_from_host
from mosaic.plugins import host
from mosaic.proposers import Request
from mosaic.proposers.knobs import KnobsProposer
from mosaic.proposers.predicted import Gauge, distance
from mosaic.records import Discrepancy, KernelSpec
from mosaic.run.campaign import Campaign
from mosaic_target_pallas.rowwise_knobs import ROWWISE_KNOBS, RmsnormKnobs, can_implement

CAMPAIGN = (Path(__file__).resolve().parents[3] / "results" / "2026-12-02" / "session12" / "rmsnorm-campaign" /
            "campaign.tar.xz")
SHAPE = {"rows": 16384, "cols": 8192}
SPEC = KernelSpec(family="rmsnorm", shape=SHAPE, dtype="bf16", language="pallas", knobs={})


def built_launches():
    """(knobs, launch record) of every candidate bundle in the recorded campaign that the H200 launched."""
    out = []
    with tarfile.open(CAMPAIGN) as tar:
        names = set(tar.getnames())
        for name in sorted(names):
            if name.endswith("/launch.json") and "/cand-" in name:
                manifest = name.rsplit("/", 1)[0] + "/manifest.json"
                launch = json.load(io.TextIOWrapper(tar.extractfile(name)))
                knobs = json.load(io.TextIOWrapper(tar.extractfile(manifest)))["kernel"]["knobs"]
                out.append((knobs, launch))
    return out


def test_the_predictions_read_what_the_h200_launched():
    launches = built_launches()
    assert len(launches) >= 10  # every timed or gated candidate of the campaign
    for knobs, launch in launches:
        assert launch["source"] == "cupti"
        k = RmsnormKnobs(**knobs)
        assert RmsnormKnobs.PREDICTS["smem.dynamic"](k, SPEC) == launch["dynamic_smem"], knobs
        assert RmsnormKnobs.PREDICTS["grid"](k, SPEC) == launch["grid"], knobs
    # the campaign spanned what the prediction must get right: TMA stages, in place, 2-row blocks and direct copies
    assert {launch["dynamic_smem"] for _, launch in launches} >= {2048, 83992, 215064, 215072}


def rows(grid, smem):
    return (Discrepancy("launch", "grid", [16384, 1, 1], grid, 1, "knob"),
            Discrepancy("launch", "smem.dynamic", 16400, smem, 2, "knob"),
            Discrepancy("launch", "registers", 121, 32, 3, "knob"))


def propose(knobs, grid, smem, history=()):
    c = Campaign(source="cute", target="pallas", family="rmsnorm", shape=SHAPE, dtype="bf16", gpu="h200")
    req = Request(campaign={}, parent="p", knobs=knobs, rows=rows(grid, smem), layers=(), incumbent={}, reference={},
                  tried=frozenset(), history=history, gpu=host().get("gpus", "h200").to_json())
    return KnobsProposer(c, RmsnormKnobs, catalog_from_host(host())).propose(req)


def test_from_the_defaults_edits_that_bring_the_rows_nearer_come_first_and_refused_ones_last():
    start = attrs.asdict(RmsnormKnobs())
    out = propose(start, [1024, 1, 1], 215064)
    gpu = host().get("gpus", "h200")
    gauge = Gauge(RmsnormKnobs.PREDICTS, RmsnormKnobs, SPEC, rows([1024, 1, 1], 215064), start)
    changes = [gauge.change(p.knobs) for p in out]
    refused = [bool(can_implement(RmsnormKnobs(**p.knobs), SPEC, gpu)) for p in out]
    assert not refused[0] and changes[0] < 0
    # the grid row (rank 1) leads with the knobs the catalog never named for it: blocks_per_cta and block_rows
    first_grid = [p for p in out if p.edit["row"]["key"] == "grid"][:3]
    assert {p.edit["knob"] for p in first_grid} == {"blocks_per_cta", "block_rows"}
    # every edit the CPU predicate refuses comes after every one it admits, each naming the rule it breaks
    last_ok = max(i for i, r in enumerate(refused) if not r)
    assert all(refused[last_ok + 1:]) and all(out[i].edit.get("violates") for i in range(last_ok + 1, len(out)))
    assert not any(refused[:last_ok + 1])
    # among the buildable ones, none that moves the predicted rows farther comes before one that brings them nearer
    kept = [c for c, r in zip(changes, refused, strict=True) if not r]
    first_away = next(i for i, c in enumerate(kept) if c > 0)
    assert all(c <= 0 for c in kept[:first_away]) and all(c > 0 for c in kept[first_away:])
    # the journal keeps what was predicted
    assert out[0].edit["predicted"]["rows"]["grid"]["reference"] == [16384, 1, 1]


def test_from_the_recorded_incumbent_the_next_edit_is_the_one_the_sweep_found():
    # 5f9c7d8af6782f15, the campaign's last incumbent (139.04 us): 2-row blocks in place, 4 blocks a CTA. Its rows
    # point at more CTAs: blocks_per_cta=2 (4096 CTAs) first, which results/2026-12-02/session12/copy-ceiling timed at
    # 132.90 us against quack's 131.55 (the recorded campaign never reached it: it spent its budget on edits that moved
    # shared memory away from the reference's, or could not build)
    incumbent = {**attrs.asdict(RmsnormKnobs()), "block_rows": 2, "vector": 4, "out_slots": 0}
    out = propose(incumbent, [2048, 1, 1], 83992)
    assert (out[0].edit["knob"], out[0].edit["value"]) == ("blocks_per_cta", 2)
    assert out[0].edit["predicted"]["rows"]["grid"]["value"] == [4096, 1, 1]
    # the stage and output-slot edits the recorded campaign timed next (148.70, 156.16 us) move shared memory away
    order = [(p.edit["knob"], p.edit["value"]) for p in out]
    assert order.index(("max_concurrent_steps", 3)) > order.index(("blocks_per_cta", 2))
    assert out[order.index(("max_concurrent_steps", 3))].edit["predicted"]["change"] > 0


def test_a_class_without_predictions_keeps_its_order():
    # the gemm knob classes predict nothing: no edit carries a prediction, none is held back by one
    cls = host().get("languages", "pallas").backend.knobs("gemm")
    assert not getattr(cls, "PREDICTS", None)
    assert distance(0, 16400) is None and distance([2, 66, 1], [132, 1, 1]) == 0.0


@pytest.mark.parametrize("family", sorted(ROWWISE_KNOBS))
def test_both_row_wise_families_predict(family):
    assert set(ROWWISE_KNOBS[family].PREDICTS) == {"smem.dynamic", "grid"}
