"""Lifting reads the CuTe attention forward (lowered for sm_90a on the CPU): its consumer role's hot loop holds the
two MMAs of a key block (S = Q K^T from shared memory, O += P V with P from registers), the softmax's MUFU.EX2 and
the bf16 conversion of P. Against the same kernel with P staged through shared memory (``p_in='smem'``) the diff
ranks ``mma.operands`` first, the hot loop's mix, order and length grouped under it as its symptoms, and the knobs
proposer's first edit from those rows is ``p_in='registers'``."""

import json
import subprocess
import sys

import attrs
import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (Python >= 3.12): run in .venv312")

MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
SHAPE = "batch=1,seq=1024,heads=2,head_dim=128"


def lowered(tmp_path, name, *knobs):
    args = [a for k in knobs for a in ("--knob", k)]
    out = tmp_path / f"{name}.bundle"
    p = subprocess.run([*MOSAIC, "capture", "--lang", "cute", "--family", "attention", "--shape", SHAPE, "--dtype",
                        "bf16", *args, "--lower-only", "--gpu", "h200", "-o", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    return out


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attn-lift")
    return lowered(tmp, "registers"), lowered(tmp, "smem", "p_in=smem")


def lift(bundle) -> dict:
    p = subprocess.run([*MOSAIC, "lift", "--json", str(bundle)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def features(fp: dict) -> dict:
    return {(f["key"], f["role"]): f["value"] for layer in fp["layers"].values() for f in layer}


def test_the_consumer_loop_holds_both_mmas_the_softmax_and_the_conversion(bundles):
    f = features(lift(bundles[0]))
    assert f[("mma.operands", "")] == ["registers", "smem"]  # S from shared memory, P V with P from registers
    assert f[("exp.form", "")] == ["approx"]
    assert "F2FP.BF16.F32.PACK_AB" in f[("conversion.modes", "")]
    mix = f[("hot_loop.mix", "consumer")]
    # 8 HGMMA k16 steps for S (head_dim 128) and 8 for P V (block_n 128); a 64x128 score tile per warpgroup is 64
    # scores per thread, one MUFU.EX2 each (the rest of the MUFU class: the rescale's exp2 of the max's change)
    assert mix["mma"] == 16 and mix["mufu"] >= 64, mix
    assert f[("mma.operands", "")] != features(lift(bundles[1]))[("mma.operands", "")]


@pytest.mark.parametrize("which,stages", [(0, 2), (1, 2)])
def test_pipeline_stages_is_the_ring_not_the_key_loop_trip_count(bundles, which, stages):
    """The consumer's key loop compares its counter with the trip count (seq / block_n = 8 here, 32 at seq 4096)
    for its exit branch, and its stage index with 2 for the wrap: lift reads the wrap (S1), not the exit test."""
    f = features(lift(bundles[which]))
    assert f[("pipeline.stages", "consumer")] == stages
    assert f.get(("pipeline.stages", "producer"), stages) == stages  # where the producer's loop gives one


def test_the_diff_ranks_the_operand_source_first_and_the_proposer_moves_p_in(bundles):
    from mosaic.catalog import catalog_from_host
    from mosaic.plugins import host
    from mosaic.proposers import Request
    from mosaic.proposers.knobs import KnobsProposer
    from mosaic.records import Discrepancy
    from mosaic.run.campaign import Campaign
    from mosaic_target_cute.knobs import AttentionKnobs

    ref, cand = bundles
    p = subprocess.run([*MOSAIC, "diff", "--json", str(ref), str(cand)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(p.stdout)["rows"]
    assert rows[0]["key"] == "mma.operands" and rows[0]["cause"] == ""
    assert {r["key"] for r in rows if r["cause"] == "mma.operands"} >= {"hot_loop.mix"}
    fields = ("layer", "key", "reference", "candidate", "rank", "edit", "where", "why", "cause", "cost")
    rows = tuple(Discrepancy(**{k: r[k] for k in fields}) for r in rows)
    c = Campaign.from_json({"source": "pallas", "target": "cute", "family": "attention", "dtype": "bf16",
                            "gpu": "h200", "shape": SHAPE})
    req = Request(campaign=c.to_json(), parent="p", knobs=attrs.asdict(AttentionKnobs(p_in="smem")), rows=rows,
                  layers=(), incumbent={}, reference={}, tried=frozenset())
    proposals = KnobsProposer(c, AttentionKnobs, catalog_from_host(host())).propose(req)
    assert (proposals[0].edit["knob"], proposals[0].edit["value"]) == ("p_in", "registers"), proposals[0].edit
