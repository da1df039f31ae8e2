"""The cutlass plugin's catalog entries name real GemmKnobs fields, and the knobs proposer moves tile,
cluster, stages and kernel schedule from diff rows through them (nothing built: proposals only)."""

import attrs
from mosaic.catalog import CONCEPT_NAMES, catalog_from_host, completeness
from mosaic.plugins import host
from mosaic.proposers import Request
from mosaic.proposers.knobs import KnobsProposer, construct_knobs
from mosaic.records import Discrepancy
from mosaic.run.campaign import Campaign
from mosaic_target_cutlass.attention import AttentionKnobs
from mosaic_target_cutlass.constructs import CONSTRUCTS
from mosaic_target_cutlass.gemm import GemmKnobs

FIELDS = {f.name for f in attrs.fields(GemmKnobs)}
ATTENTION_FIELDS = {f.name for f in attrs.fields(AttentionKnobs)}
#: the concepts attention adds: their knobs are AttentionKnobs fields
ATTENTION_CONCEPTS = {"online-softmax-rescale", "exp2-log2e-fold", "two-mma-pipeline", "causal-block-skip",
                      "gqa-head-mapping", "p-operand-source"}


def test_every_named_knob_is_a_knob_of_its_family_and_every_concept_is_covered():
    named, attention_named = set(), set()
    for c in CONSTRUCTS:
        assert c.concept in CONCEPT_NAMES
        fields, seen = (ATTENTION_FIELDS, attention_named) if c.concept in ATTENTION_CONCEPTS else (FIELDS, named)
        for knob, _ in construct_knobs(c.expression):
            assert knob in fields, f"{c.concept}: '{knob}' is not a field of the family's knob class"
            seen.add(knob)
    assert {"tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n", "stages", "kernel_schedule",
            "epilogue_schedule", "tile_scheduler"} <= named
    assert ATTENTION_FIELDS <= attention_named | {"block_m"}  # block_m moves with consumer_warpgroups (a rule)
    assert len({c.concept for c in CONSTRUCTS}) == len(CONCEPT_NAMES) == len(CONSTRUCTS)
    cat = catalog_from_host(host())
    assert cat.entry("pipeline-stage", "cutlass").source == "cutlass"  # from the plugin
    assert not [d for d in completeness(cat, languages=("cutlass",))]


def _proposals(rows, **knobs):
    c = Campaign.from_json({"source": "pallas", "target": "cutlass", "family": "gemm", "shape": "4096x4096x4096",
                            "dtype": "bf16"})
    current = attrs.asdict(GemmKnobs(**knobs))
    req = Request(campaign=c.to_json(), parent="p", knobs=current, rows=tuple(rows), layers=(), incumbent={},
                  reference={}, tried=frozenset())
    return [(p.edit["knob"], p.edit["value"], p.edit.get("implies"), p.knobs)
            for p in KnobsProposer(c, GemmKnobs, catalog_from_host(host())).propose(req)]


def row(key, ref, cand, rank=1, layer="launch", edit="knob"):
    return Discrepancy(layer=layer, key=key, reference=ref, candidate=cand, rank=rank, edit=edit)


def test_cluster_row_moves_the_axis_that_differs_first():
    got = _proposals([row("cluster", [1, 1, 1], [2, 1, 1])], cluster_m=2)
    assert got[0][:2] == ("cluster_m", 1)  # the reference's value for that axis before any neighbour
    got = _proposals([row("cluster", [2, 1, 1], [1, 1, 1])])
    assert got[0][:2] == ("cluster_m", 2) and ("cluster_n", 2) in [g[:2] for g in got]


def test_mma_shape_row_moves_the_tile():
    got = _proposals([row("mma.shape", ["m64n128k16"], ["m64n256k16"], layer="instruction")], tile_n=256)
    assert got[0][:2] == ("tile_n", 128)
    assert {"tile_m", "tile_k"} <= {g[0] for g in got}


def test_stages_move_from_auto_to_the_reference_depth():
    got = _proposals([row("pipeline.stages", 4, 7, layer="control")])
    assert got[0][:2] == ("stages", 4) and got[0][3]["stages"] == 4
    got = _proposals([row("pipeline.stages", 4, 6, layer="control")], stages=6)
    assert got[0][:2] == ("stages", 4)


def test_kernel_schedule_moves_with_the_epilogue_it_needs():
    got = _proposals([row("roles", ["all"], ["role0", "role1"], edit="rewrite")])
    sched = [g for g in got if g[0] == "kernel_schedule"]
    assert sched and sched[0][1] == "pingpong" and sched[0][2] == {"epilogue_schedule": "tma"}
    assert sched[0][3]["epilogue_schedule"] == "tma" and sched[0][3]["kernel_schedule"] == "pingpong"
    back = _proposals([row("roles", ["all"], ["producer", "consumer"], edit="rewrite")],
                      kernel_schedule="pingpong", epilogue_schedule="tma", tile_m=128)
    coop = next(g for g in back if g[0] == "kernel_schedule")
    assert coop[1] == "cooperative" and coop[3]["epilogue_schedule"] == "tma-cooperative"
