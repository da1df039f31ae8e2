"""A small audit run: mutants of real lowerings in every class plus random DAGs, labelled by the oracle."""

from __future__ import annotations

import json
import random

import pytest
from mosaic.cli import main
from mosaic_amk.validate import validate
from mosaic_amk.validate.audit import CONTROL, MUTATORS, random_dag, real_lowerings, run_audit, table


@pytest.fixture(scope="module")
def bases():
    return real_lowerings(families=("llama", "mistral", "qwen2"), quick=True)


def test_small_audit_has_zero_false_accepts_and_rejects_in_every_class(bases):
    report = run_audit(1400, seed=3, workers=1, bases=bases, classes=(*MUTATORS, "random-dag"))
    rows = {r.name: r for r in report.rows}
    assert report.false_accepts == 0, report.examples
    assert report.real.schedules == len(bases) == 24 and report.real.rejected == 0  # 4 quick configs x 2 pos x 3
    assert report.real.oracle_unsafe == 0
    for name, r in rows.items():
        assert r.schedules >= 40, (name, r)
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
    text = table(report)
    assert "real-lowerings" in text and "false accepts: 0" in text and "(control)" in text
    assert json.loads(json.dumps(report.to_json()))["false_accepts"] == 0


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
    assert {r["name"] for r in data["classes"]} == {*MUTATORS, "random-dag"}
