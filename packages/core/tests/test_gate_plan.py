"""The numerics gate's plan and judgement (mosaic.gate) without a GPU or a language: unseen shapes inside
what a kernel declares, seeds drawn per run, and each stage named by what the candidate did."""

import numpy as np
import pytest
from mosaic import gate
from mosaic.errors import BadInput
from mosaic.families import make_inputs
from mosaic.kernel_files import read_kernel_file
from mosaic.oracle import oracles
from mosaic.oracle.formats import fmt
from mosaic.records import KernelSpec


def test_plan_has_three_shapes_two_fresh_seeds_every_distribution():
    plan = gate.draw_plan("softmax", {"rows": 8, "cols": 256}, "bf16", {"rows": 4, "cols": 64},
                          max_elements=gate.CPU_MAX_ELEMENTS)
    assert len(plan.shapes) == 3 and plan.shapes[0] == {"rows": 8, "cols": 256}
    assert len({tuple(s.items()) for s in plan.shapes}) == 3
    for s in plan.shapes[1:]:
        assert s["rows"] % 4 == 0 and (s["rows"] // 4) % 2 == 1  # odd multiples of what the kernel declares
        assert s["cols"] % 64 == 0 and (s["cols"] // 64) % 2 == 1
        assert s["rows"] * s["cols"] <= gate.CPU_MAX_ELEMENTS
    assert len(plan.seeds) == 2 and 0 not in plan.seeds and plan.seeds[0] != plan.seeds[1]
    assert plan.distributions == ("normal", "int", "large", "equal-rows", "denormal")
    assert len(plan.cases) == 3 * 2 * 5 and sum(c.seen for c in plan.cases) == 10


def test_seeds_differ_between_runs():
    drawn = {gate.draw_seeds() for _ in range(20)}
    assert len(drawn) == 20


def test_unseen_sizes_are_odd_without_a_granule():
    for s in gate.unseen_shapes(("m", "n", "k"), {"m": 256, "n": 256, "k": 128}, {}):
        assert all(v % 2 == 1 for v in s.values()) and s != {"m": 256, "n": 256, "k": 128}


def test_campaign_shape_outside_the_declared_granule_is_refused():
    with pytest.raises(BadInput, match="not a multiple"):
        gate.draw_plan("softmax", {"rows": 6, "cols": 256}, "bf16", {"rows": 4})


def _right(inputs, dtype="bf16"):
    ref = oracles()["softmax"].reference(inputs, fmt(dtype), fmt(dtype))
    return {"y": fmt(dtype).round(ref["y"].expected).astype(np.float32)}


def _judge(plan, outputs, records=None, written=()):
    inputs = [make_inputs(KernelSpec(family="softmax", shape=dict(c.shape), dtype="bf16", language="pallas",
                                     knobs={}), c.seed, c.values) for c in plan.cases]
    outs = [o(inp) if callable(o) else o for o, inp in zip(outputs, inputs, strict=True)]
    recs = records or [{"inputs_after": gate.digest(inp)} for inp in inputs]
    return gate.judge(plan, inputs, {"cases": recs}, outs, [{"y": tuple(c.shape.values())} for c in plan.cases],
                      written)


def _small_plan():
    return gate.draw_plan("softmax", {"rows": 4, "cols": 64}, "bf16", {"rows": 4, "cols": 64}, max_elements=1024,
                          distributions=("normal", "large"))


def test_right_outputs_pass_every_case():
    plan = _small_plan()
    v = _judge(plan, [_right] * len(plan.cases))
    assert v.passed and v.cases_run == len(plan.cases), v.reason()


def test_each_stage_names_what_it_caught():
    plan = _small_plan()
    n = len(plan.cases)
    zero = _judge(plan, [lambda i: {"y": np.zeros_like(i["x"])}] * n)
    assert not zero.passed and zero.first.stage == "oracle" and zero.first.case == 0
    wrong_shape = _judge(plan, [lambda i: {"y": i["x"][:, :1]}] * n)
    assert wrong_shape.first.stage == "output"
    recs = [{"inputs_after": "changed", "kernel": {"kernels": 1, "outside": {}}}] * n
    assert _judge(plan, [_right] * n, recs).first.stage == "inputs"
    recs = [{"kernel": {"kernels": 0, "language": "Mosaic GPU", "what": "no call"}}] * n
    assert _judge(plan, [_right] * n, recs).first.stage == "kernel"
    recs = [{"kernel": {"kernels": 1, "outside": {"exponential": 1}}}] * n
    v = _judge(plan, [_right] * n, recs)
    assert v.first.stage == "kernel" and "exponential x1" in v.first.reason
    crashed = _judge(plan, [None] * n, [{"error": "ValueError: boom"}] * n)
    assert crashed.first.stage == "run" and "boom" in crashed.first.reason
    wrote = _judge(plan, [_right] * n, written=["/campaign/journal.jsonl"])
    assert wrote.first.stage == "writes" and "journal.jsonl" in wrote.first.reason


def test_a_case_the_child_never_reached_is_a_run_failure():
    plan = _small_plan()
    v = gate.judge(plan, [{}] * len(plan.cases), {"cases": [], "error": "killed"}, [None] * len(plan.cases),
                   [{"y": (4, 64)}] * len(plan.cases))
    assert not v.passed and v.first.stage == "run"


def test_snapshot_sees_created_changed_and_removed_files(tmp_path):
    (tmp_path / "a").write_text("1")
    before = gate.snapshot([tmp_path])
    (tmp_path / "a").write_text("2")
    (tmp_path / "b").write_text("new")
    assert gate.changed_files(before, gate.snapshot([tmp_path])) == [str(tmp_path / "a"), str(tmp_path / "b")]


def test_kernel_file_multiple_of(tmp_path):
    head = 'import dataclasses\nENTRY = "f"\nINPUTS = {"x": ("rows", "cols")}\nOUTPUTS = {"y": ("rows", "cols")}\n'
    knobs = "@dataclasses.dataclass(frozen=True)\nclass Knobs:\n    block_rows: int = 4\n    name: str = 'a'\n" \
            "def f(x, k):\n    return x\n"
    good = tmp_path / "good.py"
    good.write_text(head + 'MULTIPLE_OF = {"rows": "block_rows", "cols": 64}\n' + knobs)
    k = read_kernel_file(good)
    assert k.granules() == {"rows": 4, "cols": 64} and k.granules({"block_rows": 8})["rows"] == 8
    for bad, why in (('{"depth": 2}', "no operand has"), ('{"rows": "name"}', "int knob"), ('{"rows": 0}', "int in")):
        p = tmp_path / "bad.py"
        p.write_text(head + f"MULTIPLE_OF = {bad}\n" + knobs)
        with pytest.raises(BadInput, match=why):
            read_kernel_file(p)
    cu = tmp_path / "k.cu"
    cu.write_text("// mosaic:entry k\n// mosaic:inputs x[rows,cols]\n// mosaic:outputs y[rows,cols]\n"
                  "// mosaic:multiple-of rows=threads cols=8\n"
                  "struct Knobs { static constexpr int threads = 128; };\n__global__ void k(float* x) {}\n")
    assert read_kernel_file(cu).granules() == {"rows": 128, "cols": 8}


def test_optional_shape_entries_are_filled_for_operand_shapes():
    """A shape that leaves out attention's optional entries still gives every operand its dimensions: kv_heads is
    heads and causal 0 (the defaults the canonical shape drops), so a file's ``k[batch,kv_heads,seq,head_dim]``
    reads (batch, heads, seq, head_dim); an explicit kv_heads is kept."""
    from types import SimpleNamespace

    from mosaic.families import full_shape
    from mosaic.gate import GateCase, output_shapes
    from mosaic.kernel_files import Operand

    plain = {"batch": 2, "seq": 64, "heads": 4, "head_dim": 32}
    assert full_shape("attention", plain) == {**plain, "kv_heads": 4, "causal": 0}
    assert full_shape("attention", {**plain, "kv_heads": 2})["kv_heads"] == 2
    assert full_shape("gemm", {"m": 8, "n": 8, "k": 8}) == {"m": 8, "n": 8, "k": 8}
    kfile = SimpleNamespace(outputs=(Operand("o", ("batch", "kv_heads", "seq", "head_dim")),))
    assert output_shapes(kfile, GateCase(plain, 1, "normal"), "attention") == {"o": (2, 4, 64, 32)}
