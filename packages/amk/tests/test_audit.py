"""A small audit run (the CI audit): mutants of real lowerings in every class plus random DAGs, labelled by the
oracle; one class per validator rule, each rejected by that rule alone; the oracle independent of the validator."""

from __future__ import annotations

import ast
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.cli import main
from mosaic_amk.validate import CODES, validate
from mosaic_amk.validate.audit import (
    CONTROL,
    MUTATORS,
    RULE_CLASSES,
    bases_for,
    random_dag,
    real_lowerings,
    run_audit,
    table,
)


@pytest.fixture(scope="module")
def bases():
    return real_lowerings(quick=True)  # every tiny family and the int8 variant, 5 quick configs (one with pages) x 2


def test_small_audit_has_zero_false_accepts_and_rejects_in_every_class(bases):
    report = run_audit(1400, seed=3, workers=1, bases=bases, classes=(*MUTATORS, "random-dag"))
    rows = {r.name: r for r in report.rows}
    assert report.false_accepts == 0, report.examples
    assert report.real.schedules == len(bases) == 70 and report.real.rejected == 0  # 5 quick configs x 2 pos x 7
    assert report.real.oracle_unsafe == 0
    assert set(rows) == {*MUTATORS, "random-dag"}
    for name, r in rows.items():
        assert r.schedules >= 40, (name, r)  # every class has a nonzero denominator
        if name in CONTROL:
            assert r.rejected == 0 and r.oracle_unsafe == 0, (name, r)  # safe mutations stay accepted
        else:
            assert r.rejected > 0, (name, r)
    # the oracle sees real problems in the classes that inject them, and the validator rejects those
    for name in ("drop-wait", "add-cycle", "over-threshold", "oob-counter", "oob-buffer", "capacity-overflow",
                 "kv-read-before-append", "write-race", "partial-threshold", "first-of-n", "random-dag"):
        assert rows[name].oracle_unsafe > 0, (name, rows[name])
    for name in ("add-cycle", "over-threshold", "oob-counter", "oob-buffer", "capacity-overflow"):
        assert rows[name].oracle_unsafe == rows[name].schedules == rows[name].rejected
    for code, name in RULE_CLASSES.items():  # each rule's class: its unsafe injections are all rejected
        assert rows[name].rejected > 0 and rows[name].false_accepts == 0, (code, rows[name])
    text = table(report)
    assert "real-lowerings" in text and "false accepts: 0" in text and "(control)" in text and "total (all)" in text
    assert "schedules/s" in text and "| queue-order |" in table(report, markdown=True)
    data = json.loads(json.dumps(report.to_json()))
    assert data["false_accepts"] == 0 and data["seed"] == 3 and data["n"] == 1400 and data["schedules_per_s"] > 0
    assert data["totals"]["all"]["schedules"] == report.total and "commit" in data
    assert {c["name"]: c["targets"] for c in data["classes"] if c["targets"]} == {v: k for k, v in RULE_CLASSES.items()}


def test_every_rule_has_a_class_rejected_by_that_rule_alone(bases):
    """RULE_CLASSES names one mutation class per diagnostic code; each of its mutants that the validator rejects
    carries that one code and no other (the injection breaks that rule alone)."""
    assert set(RULE_CLASSES) == set(CODES)
    plain = [s for _, s in bases]
    # a dropped wait may be implied by others; a fill may be ordered by the loader's earlier fills' waits
    always = set(RULE_CLASSES) - {"unordered-read", "kv-order", "page-reuse", "page-fill-ahead"}
    for code, name in RULE_CLASSES.items():
        seen, rejected = 0, 0
        for k in range(30):
            rng = random.Random(f"rule/{name}/{k}")
            s = None
            pool = bases_for(name, plain)
            for _ in range(20):
                s = MUTATORS[name](pool[rng.randrange(len(pool))], rng)
                if s is not None:
                    break
            assert s is not None, (code, name)
            seen += 1
            result = validate(s)
            if not result.ok:
                rejected += 1
                assert result.codes() == {code}, (code, name, k, result.lines())
        assert rejected > 0 and (code not in always or rejected == seen), (code, name, rejected, seen)


def test_the_oracle_shares_no_code_with_the_validator():
    """oracle.py imports nothing of mosaic_amk.validate, and runs with every validator module made unimportable."""
    path = Path(__import__("mosaic_amk.validate.oracle", fromlist=["x"]).__file__)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("mosaic_amk.validate"), ast.dump(node)
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("mosaic_amk.validate") for a in node.names), ast.dump(node)
    code = f"""
import importlib.abc, importlib.util, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "mosaic_amk.validate" or name.startswith("mosaic_amk.validate."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
spec = importlib.util.spec_from_file_location("standalone_oracle", {str(path)!r})
oracle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oracle)
from mosaic_amk.schedule import Buffer, Schedule, Task, Wait
G = {{"bias": False, "residual": False}}
def s(th):
    return Schedule(num_sms=3, buffers=(Buffer("x", "f32", (4,), "input"), Buffer("w", "f32", (4, 4), "weight"),
        Buffer("y", "f32", (4,), "activation"), Buffer("o", "f32", (4,), "output")), num_counters=2,
        tasks=(Task(0, "gemv", 0, ("x", "w"), ("y",), (), 0, {{**G, "row_start": 0, "row_end": 2}}),
               Task(1, "gemv", 1, ("x", "w"), ("y",), (), 0, {{**G, "row_start": 2, "row_end": 4}}),
               Task(2, "add", 2, ("y", "x"), ("o",), (Wait(0, th),), 1, {{}})), outputs=("o",))
assert oracle.explore(s(2), runs=6).safe and not oracle.explore(s(1), runs=6).safe
assert not [m for m in sys.modules if m.startswith("mosaic_amk.validate")]
print("independent")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "independent" in out.stdout, out.stderr


def test_random_dags_are_deterministic_and_mixed():
    a = [random_dag(random.Random(k)).to_json() for k in range(60)]
    b = [random_dag(random.Random(k)).to_json() for k in range(60)]
    assert a == b
    oks = [validate(random_dag(random.Random(k))).ok for k in range(300)]
    assert 0 < sum(oks) < len(oks)  # some accepted, most not


def test_audit_cli_json(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["amk", "audit", "--n", "120", "--workers", "1", "--runs", "4", "--json", "--seed", "5"])
    assert exc.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["false_accepts"] == 0 and data["total_schedules"] >= 120
    assert {"seed", "n", "seconds", "schedules_per_s", "commit", "totals", "classes"} <= set(data)
    assert {r["name"] for r in data["classes"]} == {*MUTATORS, "random-dag"}
