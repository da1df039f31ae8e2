"""Knob dependencies as data (mosaic.proposers.dependencies) and the knobs proposer's compound edits, on a
toy knob class and on the CuTe plugin's table (tile <-> stages <-> shared memory); booleans move the way the
row points."""

import sys
from pathlib import Path

import attrs
from mosaic.catalog import catalog_from_host
from mosaic.errors import Diagnostic
from mosaic.plugins import host
from mosaic.proposers import Request
from mosaic.proposers.dependencies import Dependencies, Dependency, complete, dependencies_of, violations
from mosaic.proposers.knobs import KnobsProposer, candidate_values
from mosaic.records import Discrepancy, KernelSpec
from mosaic.run.campaign import Campaign

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402


@attrs.frozen
class Toy:
    a: int = 1
    b: str = "x"
    c: int = 1


def _check(k, spec, gpu):
    out = []
    if k.a == 2 and k.b != "y":
        out.append(Diagnostic("TOY-AB", "b", "y", k.b, "a=2 needs b=y"))
    if k.b == "y" and k.c == 1:
        out.append(Diagnostic("TOY-BC", "c", ">1", k.c, "b=y needs c>1"))
    return out


TOY = Dependencies(check=_check, rules=(
    Dependency("TOY-AB", ("a", "b"), {"b": ("z", "y")}),
    Dependency("TOY-BC", ("b", "c"), {"c": (2, 3)}),
    Dependency("TOY-PAIR", ("a", "c"), {"c": (3,)}, needs=lambda k: k["a"] == 3 and k["c"] != 3),
))
SPEC = KernelSpec("gemm", {"m": 8, "n": 8, "k": 8}, "bf16", "toy", {})


def test_complete_finds_the_fewest_partner_changes_in_rule_then_value_order():
    gpu = host().get("gpus", "h200")
    assert violations(TOY, Toy, {"a": 2, "b": "x", "c": 1}, SPEC, gpu) == ["TOY-AB"]
    parts = complete(TOY, Toy, {"a": 2, "b": "x", "c": 1}, {"a"}, SPEC, gpu)
    assert [(p["knob"], p["value"], p["code"]) for p in parts] == [("b", "y", "TOY-AB"), ("c", 2, "TOY-BC")]
    assert complete(TOY, Toy, {"a": 1, "b": "x", "c": 1}, {"a"}, SPEC, gpu) == []  # nothing needed
    assert complete(TOY, Toy, {"a": 2, "b": "x", "c": 1}, {"a", "b"}, SPEC, gpu) is None  # b may not move
    # a known partner: builds, but the table says it wants one
    assert [(p["knob"], p["value"]) for p in complete(TOY, Toy, {"a": 3, "b": "x", "c": 1}, {"a"}, SPEC, gpu)] == [
        ("c", 3)]
    assert complete(TOY, Toy, {"a": 2, "b": "x", "c": 1}, {"a"}, SPEC, gpu, max_parts=1) is None


def test_cute_declares_tile_stages_shared_memory_and_a_bigger_tile_takes_fewer_stages():
    knob_cls = host().get("languages", "cute").backend.knobs("gemm")
    deps = dependencies_of(knob_cls)
    assert deps is not None and deps.rule("smem-per-block").knobs == ("tile_mn", "tile_k", "stages")
    campaign = Campaign(source="pallas", target="cute", family="gemm", shape=rf.SHAPE, dtype="bf16", gpu="h200")
    p = KnobsProposer(campaign, knob_cls, catalog_from_host(host()))
    five = {**rf.HOPPER, "stages": 5, "persistent": True}
    rows = [Discrepancy("instruction", "mma.shape", ["m64n256k16"], ["m64n128k16"], 1, "knob")]
    out = p.propose(Request(campaign={}, parent="p", knobs=five, rows=rows, layers=(), incumbent={}, reference={},
                            tried=frozenset(), gpu=host().get("gpus", "h200").to_json()))
    # 5 stages of a 128x256x64 bf16 tile need 245760 B > 232448: the tile comes with 4 stages, and (the known
    # partner CUTE-MULTICAST: a tile twice as wide as tall) a 2x1 cluster multicasting B; one edit
    first = out[0]
    assert first.edit["knob"] == "tile_mn" and first.edit["value"] == [128, 256] and first.edit["compound"]
    assert [(x["knob"], x["value"], x.get("rule")) for x in first.edit["parts"]] == [
        ("tile_mn", [128, 256], None), ("stages", 4, "smem-per-block"), ("cluster_mn", [2, 1], "CUTE-MULTICAST")]
    assert first.knobs["stages"] == 4 and first.knobs["cluster_mn"] == [2, 1] and knob_cls(**first.knobs)
    # once clustered the wide tile wants no partner: from a 2x1 incumbent a stage edit stays single
    clustered = {**five, "stages": 4, "tile_mn": [128, 256], "cluster_mn": [2, 1]}
    rows = [Discrepancy("control", "pipeline.stages", 3, 4, 1, "knob")]
    out = p.propose(Request(campaign={}, parent="p", knobs=clustered, rows=rows, layers=(), incumbent={},
                            reference={}, tried=frozenset(), gpu=host().get("gpus", "h200").to_json()))
    assert out[0].edit["knob"] == "stages" and out[0].edit["value"] == 3 and not out[0].edit.get("compound")


def test_without_a_gpu_record_or_a_table_the_edits_stay_single():
    knob_cls = host().get("languages", "cute").backend.knobs("gemm")
    p = KnobsProposer(Campaign(source="pallas", target="cute", family="gemm", shape=rf.SHAPE, dtype="bf16",
                               gpu="h200"), None, catalog_from_host(host()))
    assert p.deps is None and dependencies_of(knob_cls) is not None


def test_booleans_move_the_way_the_row_points():
    row = Discrepancy("control", "persistent", True, False, 1, "rewrite")
    assert candidate_values(False, False, row, None, "both") == [True]
    assert candidate_values(True, False, row, None, "both") == []  # never away from the reference
    grid = Discrepancy("launch", "grid", [132, 1, 1], [1024, 1, 1], 1, "knob")
    assert candidate_values(False, False, grid, None, "both") == [True]  # no boolean stated: flipped


def test_a_wide_tile_whose_2x1_cluster_does_not_divide_the_shape_stays_single_and_in_place():
    knob_cls = host().get("languages", "cute").backend.knobs("gemm")
    shape = {"m": 384, "n": 4096, "k": 4096}  # 384 rows: 128-row tiles, but not 2x1 clusters of them
    campaign = Campaign(source="pallas", target="cute", family="gemm", shape=shape, dtype="bf16", gpu="h200")
    p = KnobsProposer(campaign, knob_cls, catalog_from_host(host()))
    rows = [Discrepancy("instruction", "mma.shape", ["m64n256k16"], ["m64n128k16"], 1, "knob")]
    start = {**rf.HOPPER, "persistent": True}
    out = p.propose(Request(campaign={}, parent="p", knobs=start, rows=rows, layers=(), incumbent={}, reference={},
                            tried=frozenset(), gpu=host().get("gpus", "h200").to_json()))
    first = out[0]
    # CUTE-MULTICAST wants a 2x1 cluster, CUTE-SHAPE refuses it here: the single edit is kept, first (a partner
    # exists, it just does not fit this shape), with no 'violates' mark
    assert (first.edit["knob"], first.edit["value"]) == ("tile_mn", [128, 256])
    assert not first.edit.get("compound") and "violates" not in first.edit and first.knobs["cluster_mn"] == [1, 1]


@attrs.frozen
class Looped:
    persistent: bool = attrs.field(default=False, metadata={"interacts": ("tile",)})
    tile: int = 128
    stages: int = 4


def test_a_field_names_the_knobs_its_outcome_depends_on_and_a_rejection_holds_only_for_them():
    from mosaic.proposers.knobs import _context, blocked

    p = KnobsProposer(Campaign(source="pallas", target="toy", family="gemm", shape=rf.SHAPE, dtype="bf16"), Looped,
                      None)
    interacts = p.interactions()
    assert interacts == {"persistent": {"tile"}, "tile": {"persistent"}}  # both ways; stages ties to neither
    tried = {"persistent": True, "tile": 128, "stages": 4}
    history = [{"edit": {"kind": "knob", "knob": "persistent", "value": True, "was": False}, "accepted": False,
                "outcome": "slower", "knobs": tried}]
    _, retries = blocked(history, interacts)
    def retry(knobs):
        return ("persistent", True, _context(knobs, interacts["persistent"])) in retries
    assert retry(tried) and retry({**tried, "stages": 3})  # the stage count says nothing of the tile loop
    assert not retry({**tried, "tile": 256})  # another tiling: a new edit
