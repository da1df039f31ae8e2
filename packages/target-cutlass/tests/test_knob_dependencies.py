"""Compound knob edits for CUTLASS: the plugin's dependency table (gemm.DEPENDENCIES) and its CPU predicate
(gemm.can_implement) drive the ``knobs`` proposer; no GPU and no nvcc."""

from types import SimpleNamespace

import pytest
from mosaic.catalog import catalog_from_host
from mosaic.plugins import host
from mosaic.proposers import Request
from mosaic.proposers.dependencies import dependencies_of, violations
from mosaic.proposers.knobs import KnobsProposer
from mosaic.records import Discrepancy, KernelSpec
from mosaic_target_cutlass import gemm

SHAPE = {"m": 4096, "n": 4096, "k": 4096}
#: the recorded CUTLASS campaign's incumbent (pallas -> cutlass 4096^3 on the H200, 186.16 us): ping-pong +
#: persistent on a 128x128 tile
INCUMBENT = {"tile_m": 128, "tile_n": 128, "tile_k": 64, "cluster_m": 1, "cluster_n": 1, "stages": "auto",
             "kernel_schedule": "pingpong", "epilogue_schedule": "tma", "tile_scheduler": "persistent"}
#: the rows of that campaign's last diffs: the consumer loop's MMAs per k-step (jax's CTA tile is 128x256),
#: then the grid (persistence)
ROWS = (Discrepancy("instruction", "hot_loop.mix", {"mma": 8.0, "wgmma.sync": 0.25}, {"mma": 4.0, "wgmma.sync": 0.25},
                    1, "knob"),
        Discrepancy("launch", "grid", [132, 1, 1], [1, 132, 1], 2, "knob"))
#: a grid row whose candidate is not persistent (1024 CTAs on the H200's 132 SMs): it leads to the schedules
NOT_PERSISTENT = (Discrepancy("launch", "grid", [132, 1, 1], [32, 32, 1], 1, "knob"),)
#: what the campaign had accepted (its history): ping-pong, then the persistent scheduler
HISTORY = (
    {"step": 1, "key": "a", "parent": "n", "outcome": "faster", "accepted": True,
     "edit": {"kind": "knob", "knob": "kernel_schedule", "value": "pingpong", "was": "cooperative"},
     "knobs": {**INCUMBENT, "tile_scheduler": "default"}},
    {"step": 2, "key": "b", "parent": "a", "outcome": "faster", "accepted": True,
     "edit": {"kind": "knob", "knob": "tile_scheduler", "value": "persistent", "was": "default"}, "knobs": INCUMBENT},
    {"step": 3, "key": "c", "parent": "b", "outcome": "slower", "accepted": False,
     "edit": {"kind": "knob", "knob": "tile_n", "value": 256, "was": 128}, "knobs": {**INCUMBENT, "tile_n": 256}},
)


def proposals(knobs=INCUMBENT, rows=ROWS, history=HISTORY):
    h = host()
    knob_cls = h.get("languages", "cutlass").backend.knobs("gemm")
    campaign = SimpleNamespace(source="pallas", target="cutlass", family="gemm", shape=SHAPE, dtype="bf16",
                               gpu="h200")
    p = KnobsProposer(campaign, knob_cls, catalog_from_host(h))
    req = Request(campaign={}, parent="b", knobs=knobs, rows=rows, layers=(), incumbent={}, reference={},
                  tried=frozenset(), history=history, gpu=h.get("gpus", "h200").to_json())
    return p.propose(req)


def builds(knobs: dict) -> list[str]:
    """The plugin's own CPU checks: every rule of gemm.problems."""
    spec = KernelSpec("gemm", SHAPE, "bf16", "cutlass", knobs)
    return [d.code for d in gemm.can_implement(gemm.GemmKnobs(**knobs), spec, host().get("gpus", "h200"))]


def test_the_table_is_data_beside_the_knob_class():
    deps = dependencies_of(gemm.GemmKnobs)
    assert deps is gemm.GemmKnobs.DEPENDENCIES and deps.check is gemm.can_implement
    codes = {r.code for r in deps.rules}
    assert {"CUTLASS-EPILOGUE", "CUTLASS-STREAMK", "CUTLASS-SCHEDULER", "CUTLASS-COOP-TILE"} <= codes
    fields = {a.name for a in gemm.GemmKnobs.__attrs_attrs__}
    for r in deps.rules:
        assert set(r.knobs) <= fields and set(r.partners) <= fields, r.code
        for knob, values in r.partners.items():  # every partner value is legal for its field
            for v in values:
                gemm.GemmKnobs(**{knob: v, **({"kernel_schedule": "pingpong", "epilogue_schedule": "tma"}
                                             if knob == "tile_m" and v == 64 else {})})


def test_from_the_cutlass_incumbent_the_tile_row_gets_the_cooperative_128x256_tile_with_a_2x1_cluster():
    out = proposals()
    first = out[0].edit
    assert first["compound"] is True and first["concept"] == "cta-tile"
    assert first["row"]["key"] == "hot_loop.mix" and first["row"]["rank"] == 1  # ONE edit aimed at ONE row
    assert [(p["knob"], p["value"]) for p in first["parts"]] == [
        ("tile_n", 256), ("kernel_schedule", "cooperative"), ("epilogue_schedule", "tma-cooperative"),
        ("cluster_m", 2)]
    assert [p.get("rule") for p in first["parts"]] == [None, "CUTLASS-ACCUMULATORS", "CUTLASS-EPILOGUE",
                                                       "CUTLASS-MULTICAST"]
    assert out[0].knobs == {**INCUMBENT, "tile_n": 256, "kernel_schedule": "cooperative",
                            "epilogue_schedule": "tma-cooperative", "cluster_m": 2}
    assert builds(dict(out[0].knobs)) == []


def test_every_compound_edit_builds_together_while_its_single_edit_did_not():
    h = host()
    deps = gemm.GemmKnobs.DEPENDENCIES
    spec = KernelSpec("gemm", SHAPE, "bf16", "cutlass", {})
    compound = [p for p in proposals() + proposals(rows=NOT_PERSISTENT) if p.edit.get("compound")]
    assert len(compound) >= 3
    seen = set()
    for p in compound:
        parts = p.edit["parts"]
        assert parts[0]["knob"] == p.edit["knob"] and parts[0]["value"] == p.edit["value"]
        together = {**INCUMBENT, **{x["knob"]: x["value"] for x in parts}}
        assert together == dict(p.knobs) and builds(together) == []  # every part, together, builds
        assert violations(deps, gemm.GemmKnobs, together, spec, h.get("gpus", "h200")) == []
        single = {**INCUMBENT, p.edit["knob"]: p.edit["value"]}
        # alone the edit did not build (the plugin's checks) or needed a declared partner
        assert violations(deps, gemm.GemmKnobs, single, spec, h.get("gpus", "h200"))
        seen.add((p.edit["knob"], p.edit["value"]))
    assert {("tile_n", 256), ("tile_scheduler", "stream-k"), ("kernel_schedule", "tma-ws")} <= seen
    assert builds({**INCUMBENT, "tile_scheduler": "stream-k"}) == ["CUTLASS-STREAMK"]
    assert builds({**INCUMBENT, "kernel_schedule": "tma-ws"}) == ["CUTLASS-SCHEDULER"]
    stream_k = next(p for p in compound if p.edit["value"] == "stream-k")
    assert [(x["knob"], x["value"]) for x in stream_k.edit["parts"]] == [
        ("tile_scheduler", "stream-k"), ("kernel_schedule", "cooperative"), ("epilogue_schedule", "tma-cooperative")]


def test_singles_that_build_stay_single_and_a_rejected_compound_is_not_proposed_again():
    out = proposals()
    singles = [p for p in out if not p.edit.get("compound")]
    assert singles and all(builds(dict(p.knobs)) == [] for p in singles)
    assert ("tile_n", 64) in [(p.edit["knob"], p.edit["value"]) for p in singles]
    first = out[0]
    rejected = {"step": 4, "key": "d", "parent": "b", "outcome": "slower", "accepted": False, "edit": first.edit,
                "knobs": dict(first.knobs)}
    again = proposals(history=(*HISTORY, rejected))
    assert dict(first.knobs) not in [dict(p.knobs) for p in again]


@pytest.mark.parametrize("knobs, codes", [
    ({**INCUMBENT, "tile_n": 256}, ["CUTLASS-ACCUMULATORS"]),
    ({**INCUMBENT, "tile_n": 256, "kernel_schedule": "cooperative"}, ["CUTLASS-EPILOGUE", "CUTLASS-MULTICAST"]),
    ({**INCUMBENT, "tile_n": 256, "kernel_schedule": "cooperative", "epilogue_schedule": "tma-cooperative"},
     ["CUTLASS-MULTICAST"]),
    ({**INCUMBENT, "tile_m": 64, "tile_n": 256}, []),  # ping-pong 64x256: 128 accumulators per thread
])
def test_violations_name_the_rules(knobs, codes):
    spec = KernelSpec("gemm", SHAPE, "bf16", "cutlass", {})
    assert violations(gemm.GemmKnobs.DEPENDENCIES, gemm.GemmKnobs, knobs, spec, host().get("gpus", "h200")) == codes


def test_the_report_lists_the_parts_of_a_compound_edit():
    from mosaic.run.report import _edit_text

    first = proposals()[0]
    assert _edit_text({"edit": first.edit}) == ('compound: tile_n=256 + kernel_schedule="cooperative" + '
                                                'epilogue_schedule="tma-cooperative" + cluster_m=2')


#: the H200's pallas -> cutlass 8192^3 campaign of session 8 (results/2026-12-01/session8/cutlass-8192): the
#: first rows of the diff of jax's Pallas matmul against the naive CUTLASS translation (cooperative 128x128,
#: default scheduler: already persistent, 132 CTAs on a [1, 132, 1] grid)
NAIVE = {"tile_m": 128, "tile_n": 128, "tile_k": 64, "cluster_m": 1, "cluster_n": 1, "stages": "auto",
         "kernel_schedule": "cooperative", "epilogue_schedule": "tma-cooperative", "tile_scheduler": "default"}
ROWS_8192 = (
    Discrepancy("launch", "grid", [132, 1, 1], [1, 132, 1], 1, "knob"),
    Discrepancy("launch", "smem.dynamic", 229440, 214016, 2, "knob"),
    Discrepancy("instruction", "access.global.load_width", [], [32], 3, "knob"),
    Discrepancy("instruction", "hot_loop.mix", {"tma.load": 2.0, "bar.sync": 2.0, "mbar.arrive.tx": 2.0,
                                                "mbar.wait": 3.0},
                {"tma.load": 3.0, "mbar.arrive.tx": 1.0, "mbar.wait": 3.0}, 4, "knob"),
    Discrepancy("instruction", "hot_loop.mix", {"mma": 8.0, "mbar.arrive": 1.0, "mbar.wait": 3.0, "wgmma.sync": 2.0},
                {"mma": 4.0, "mbar.arrive": 1.0, "mbar.wait": 4.0, "wgmma.sync": 2.0}, 5, "knob"),
    Discrepancy("control", "warp_role_branches", 1, 2, 6, "rewrite"),
    Discrepancy("control", "pipeline.stages", 4, 6, 7, "knob"),
)


def test_a_grid_row_between_two_persistent_kernels_is_no_lead_to_the_schedules():
    # session 8 spent its four timed steps at 8192^3 on this row (ping-pong, tma-ws, persistent, cooperative;
    # all slower): both grids are 132 CTAs on 132 SMs, only their shape differs, and the template has no
    # raster knob, so the row gives no edit and the tile row leads
    out = proposals(knobs=NAIVE, rows=ROWS_8192, history=())
    assert all(p.edit["row"]["key"] != "grid" for p in out)
    first = out[0]
    assert first.edit["row"]["key"] == "smem.dynamic" and first.edit["concept"] == "cta-tile"
    assert [(p["knob"], p["value"], p.get("rule")) for p in first.edit["parts"]] == [
        ("tile_n", 256, None), ("cluster_m", 2, "CUTLASS-MULTICAST")]
    # the knobs of the 4096^3 campaign's winner (examples/h200-pallas-to-cutlass-gemm-4096, 177.07 us, 98.7% of
    # cuBLAS), reached there at step 5 through ping-pong
    assert dict(first.knobs) == {**NAIVE, "tile_n": 256, "cluster_m": 2}
    assert builds(dict(first.knobs)) == []
    # the same row with a candidate that is not persistent still leads to the schedules, first
    grid = (Discrepancy("launch", "grid", [132, 1, 1], [32, 32, 1], 1, "knob"), *ROWS_8192[1:])
    led = proposals(knobs=NAIVE, rows=grid, history=())
    assert led[0].edit["row"]["key"] == "grid" and led[0].edit["concept"] == "persistent-tile-loop"
    assert {p.edit["knob"] for p in led if p.edit["row"]["key"] == "grid"} == {"kernel_schedule", "tile_scheduler"}


def test_from_the_4096_winner_a_single_that_still_wants_its_partner_comes_after_the_others():
    # examples/h200-pallas-to-cutlass-gemm-4096's final incumbent (cooperative 128x256, 2x1 cluster) and the first
    # rows of its diff: its cluster row points back to 1x1, which CUTLASS-MULTICAST says the wide tile should not
    winner = {**NAIVE, "tile_n": 256, "cluster_m": 2}
    rows = (Discrepancy("launch", "cluster", [1, 1, 1], [2, 1, 1], 1, "knob"),
            Discrepancy("launch", "grid", [132, 1, 1], [2, 66, 1], 2, "knob"),
            Discrepancy("launch", "smem.dynamic", 229440, 214016, 3, "knob"))
    out = proposals(knobs=winner, rows=rows, history=())
    edits = [(p.edit["knob"], p.edit["value"]) for p in out]
    # one cause at a time, round robin: the cluster row's best edit, the shared-memory row's best (the grid row has
    # none: both grids are persistent), then the cluster row's second
    assert edits[:3] == [("cluster_m", 4), ("stages", 4), ("cluster_n", 2)]
    back = edits.index(("cluster_m", 1))
    assert out[back].edit["violates"] == ["CUTLASS-MULTICAST"] and builds(dict(out[back].knobs)) == []
    assert ("tile_n", 128) in edits[:back] and ("tile_k", 128) in edits[:back]
    # after it only edits that also want a partner (tile_m=256: 256 accumulators per consumer thread spill), then
    # those the CPU predicate refuses with no mending partner: 5 stages of 128x256x64 do not fit shared memory
    assert all(p.edit.get("violates") for p in out[back:]) and all("violates" not in p.edit for p in out[:back])
    assert ("tile_m", 256) in edits[back:] and out[edits.index(("tile_m", 256))].edit["violates"] == [
        "CUTLASS-ACCUMULATORS"]
    five = edits.index(("stages", 5))
    assert five > edits.index(("tile_m", 256)) and out[five].edit["violates"] == ["CUTLASS-SMEM"]
