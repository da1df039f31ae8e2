"""Causes before symptoms: grouping, expected cost, the campaign's measured costs and the proposer's round robin."""

from __future__ import annotations

from mosaic.lift.causes import PRIOR, measured_costs, rank_rows, rerank, to_time
from mosaic.lift.diff import rank_key
from mosaic.proposers import Proposal
from mosaic.proposers.knobs import round_robin
from mosaic.records import Discrepancy
from mosaic.run.report import why_unfixed


def row(layer, key, ref, cand, edit="knob"):
    return Discrepancy(layer, key, ref, cand, 1, edit)


def ranked(*pairs):
    return rank_rows(pairs, rank_key)


def test_a_math_form_outranks_the_register_and_loop_rows_it_explains():
    # the rsqrt pair of the issue: registers 18 vs 14 ranked first under the layer order
    rows = ranked((row("launch", "registers", 18, 14), 0.22), (row("instruction", "hot_loop.mix", {}, {}), 0.4),
                  (row("sequence", "hot_loop.order", "a", "b"), 0.5), (row("numerics", "div.form", ["ieee"], []), 1.0),
                  (row("numerics", "fma.contraction", "fused", "mixed"), 1.0))
    assert [r.key for r in rows][:1] == ["div.form"]
    assert {r.key: r.cause for r in rows} == {"div.form": "", "registers": "div.form", "hot_loop.mix": "div.form",
                                              "hot_loop.order": "div.form", "fma.contraction": "div.form"}
    assert [r.rank for r in rows] == [1, 2, 3, 4, 5]
    # the cause's cost includes half of its symptoms' own costs
    own = PRIOR["div.form"]
    assert rows[0].cost > own and abs(rows[0].cost - (own + 0.5 * sum(r.cost for r in rows[1:]))) < 1e-3


def test_a_cause_is_never_grouped_under_a_weaker_one_and_unrelated_causes_stand_alone():
    rows = ranked((row("numerics", "fma.contraction", "fused", "unfused"), 1.0),
                  (row("launch", "grid", [132, 1, 1], [264, 1, 1]), 0.5))
    assert all(r.cause == "" for r in rows)  # grid is no consequence of contraction, nor the reverse
    # alone, a symptom is a cause of its own (a register cap explains its spills)
    rows = ranked((row("machine", "spills", 0, 64), 1.0), (row("launch", "registers", 255, 32), 0.87))
    assert [(r.key, r.cause) for r in rows] == [("registers", ""), ("spills", "registers")]


def test_equal_costs_fall_back_to_the_layer_order():
    rows = ranked((row("control", "pipeline.stages", 2, 4), 0.5), (row("launch", "block", [128], [256]), 0.4 / 0.35 * 0.5))
    assert rows[0].cost == rows[1].cost and [r.key for r in rows] == ["block", "pipeline.stages"]


def test_measured_costs_drop_a_key_whose_edits_bought_nothing_and_rerank_moves_its_group_last():
    rows = ranked((row("numerics", "exp.form", ["precise"], ["approx"]), 1.0),
                  (row("machine", "hot_loop.length", 600, 14000), 0.95), (row("launch", "grid", [1], [2]), 0.5))
    assert rows[0].key == "exp.form"
    history = [{"edit": {"row": {"key": "exp.form"}}, "outcome": "null", "accepted": False, "gain_ns": 3.0},
               {"edit": {"row": {"key": "grid"}}, "outcome": "faster", "accepted": True, "gain_ns": 50.0}]
    measured = measured_costs(history, gap_ns=100.0)
    assert measured == {"exp.form": 0.0, "grid": 0.5}
    again = rerank(rows, measured)
    assert [(r.key, r.cause, r.rank) for r in again] == [("grid", "", 1), ("exp.form", "", 2),
                                                         ("hot_loop.length", "exp.form", 3)]
    assert again[0].cost == 0.5 and again[1].cost == 0.0
    assert rerank(rows, {}) == rows


def test_to_time_is_a_share_of_the_gap_capped_by_the_floor():
    assert to_time(0.5, candidate_ns=300.0, reference_ns=100.0) == 100.0
    assert to_time(1.0, candidate_ns=300.0, reference_ns=100.0, floor_ns=250.0) == 50.0
    assert to_time(0.5, candidate_ns=90.0, reference_ns=100.0) == 0.0


def test_round_robin_tries_every_cause_once_before_any_second_edit_knob_causes_first():
    rows = ranked((row("instruction", "transfer.form", ["tma"], ["ld.global"], edit="rewrite"), 1.0),
                  (row("launch", "registers", 40, 30), 0.25), (row("numerics", "exp.form", ["approx"], ["precise"]), 1.0),
                  (row("launch", "grid", [1], [2]), 0.5))
    by_key = {r.key: r for r in rows}

    def e(name):
        return ((name,), Proposal(True, "p", {"kind": "knob", "knob": name}, {name: 1}))

    per_row = [(r, {"transfer.form": [e("t1"), e("t2")], "registers": [e("r1")], "exp.form": [e("x1"), e("x2")],
                    "grid": [e("g1")]}[r.key]) for r in rows]
    out = [identity[0] for identity, _ in round_robin(per_row)]
    # registers is a symptom of transfer.form: its edits follow the cause's own in that group; the rewrite-class
    # cause (transfer.form) comes after the knob-class causes, in rank order within each class
    assert by_key["registers"].cause == "transfer.form"
    heads = [r.key for r in rows if not r.cause and r.edit == "knob"]
    firsts = {"exp.form": "x1", "grid": "g1"}
    assert out[:3] == [firsts[heads[0]], firsts[heads[1]], "t1"]
    assert out.index("x2") > out.index("t1") and out.index("r1") > out.index("t2")
    # a group's source rewrites come after its knob edits
    src = ((("source", "abc"), Proposal(True, "p", {"kind": "source"}, {}, "text")))
    n = next(i for i, (r, _) in enumerate(per_row) if r.key == "exp.form")
    out = [identity for identity, _ in round_robin(per_row, {n: [src]})]
    assert out.index(("source", "abc")) > out.index(("x2",))


def test_why_a_remaining_row_was_not_fixed():
    edits = [{"step": 1, "edit": {"row": {"key": "exp.form"}}, "outcome": "rejected", "reason_code": "null"},
             {"step": 2, "edit": {"row": {"key": "grid"}}, "outcome": "rejected", "reason_code": "unbuildable"},
             {"step": 3, "edit": {"row": {"key": "grid"}}, "outcome": "rejected", "reason_code": "slower"}]
    assert why_unfixed({"key": "exp.form"}, edits)["code"] == "null"
    grid = why_unfixed({"key": "grid"}, edits)
    assert grid["code"] == "slower" and grid["steps"] == [2, 3] and "step 3" in grid["text"]
    assert why_unfixed({"key": "transfer.form"}, edits)["code"] == "no-edit"
    symptom = why_unfixed({"key": "hot_loop.length", "cause": "exp.form"}, edits)
    assert symptom["code"] == "null" and symptom["text"].startswith("a consequence of exp.form")
