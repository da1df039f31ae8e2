"""The campaign report, built from the journal: json, markdown and a self-contained html with svg plots."""

import json
import re
import subprocess
import sys
from pathlib import Path

from mosaic.run.report import build_report, to_markdown, write_report

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402

MOSAIC = str(Path(sys.executable).parent / "mosaic")


def test_report_of_an_exploring_campaign(tmp_path):
    src = rf.build_campaign(tmp_path / "c", ref_us=rf.UNREACHABLE_US, toml=rf.EXPLORE_TOML)
    assert subprocess.run([MOSAIC, "run", "--offline", str(src), "--quiet"], capture_output=True).returncode == 0
    out = src / "offline"
    rep = json.loads((out / "report.json").read_text())
    journal = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    steps = sorted(e["step"] for e in journal if e["event"] == "proposal")
    assert [e["step"] for e in rep["edits"]] == steps  # every edit, accepted or rejected, with its reason
    assert all(e["reason"] or e["outcome"] == "accepted" for e in rep["edits"])
    codes = {e["reason_code"] for e in rep["edits"]}
    assert {"naive", "faster", "slower", "null", "proposal"} <= codes
    # 8 stages do not fit shared memory and the CPU predicate says so: that edit waits behind every buildable one
    # and the 12 timed candidates run out first (test_an_unbuildable_step_is_reported: how one reads)
    assert "unbuildable" not in codes
    assert rep["null_results"] and all(e["reason_code"] == "null" for e in rep["null_results"])
    assert rep["yardstick"]["name"] == "cuBLAS" and 168_000 < rep["yardstick"]["time_ns"] < 169_600
    f = rep["final"]
    assert f["timed_candidates"] == 12 and not f["within_noise_or_faster"]
    assert abs(f["fraction_of_yardstick"] - rep["yardstick"]["time_ns"] / f["t_incumbent_ns"]) < 1e-12
    assert rep["reference"]["floor_ns"] < rep["reference"]["time_ns"]
    md = (out / "report.md").read_text()
    assert "| step | edit |" in md and "stages=5" in md and "## Null results" in md
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 2 and "reference ± noise" in html
    assert not re.search(r"<script|src=|href=", html)  # self-contained, nothing fetched
    assert len(re.findall(r"<circle", html)) >= 12  # candidate points and distance points


def test_closer_but_slower_is_reported(tmp_path):
    head = {"event": "campaign", "format": "mosaic-journal", "campaign": {"source": "a", "target": "b"},
            "gpu": {"name": "h200"}, "workbench": "offline", "proposer": "knobs"}
    ev = [head,
          {"event": "proposal", "step": 1, "key": "k1", "ok": True, "parent": "n", "edit": {"kind": "knob",
           "knob": "stages", "value": 5}, "knobs": {}},
          {"event": "build", "key": "k1", "ok": True, "reason": "", "reason_code": "", "distance": 0.1},
          {"event": "verdict", "key": "k1", "step": 1, "decision": "rejected", "reason_code": "slower",
           "reason": "slower", "t_candidate": 180e3, "t_incumbent": 175e3, "d_candidate": 0.1, "d_incumbent": 0.4,
           "closer_but_slower": True}]
    rep = build_report(ev)
    assert [e["key"] for e in rep["closer_but_slower"]] == ["k1"] and rep["final"] is None


def test_an_unbuildable_step_is_reported():
    head = {"event": "campaign", "format": "mosaic-journal", "campaign": {"source": "a", "target": "b"},
            "gpu": {"name": "h200"}, "workbench": "offline", "proposer": "knobs"}
    why = "[smem-per-block] shared memory 266240 B exceeds h200's 232448 B per block"
    ev = [head,
          {"event": "proposal", "step": 1, "key": "k8", "ok": True, "parent": "n", "edit": {"kind": "knob",
           "knob": "stages", "value": 8, "violates": ["smem-per-block"]}, "knobs": {"stages": 8}},
          {"event": "build", "key": "k8", "ok": False, "reason": why, "reason_code": "unbuildable"}]
    rep = build_report(ev)
    (e,) = rep["edits"]
    assert (e["outcome"], e["reason_code"], e["reason"]) == ("rejected", "unbuildable", why)
    assert "| 1 | stages=8 |" in to_markdown(rep) and "rejected (unbuildable)" in to_markdown(rep)


def test_report_is_rebuilt_from_the_journal_alone(tmp_path):
    src = rf.build_campaign(tmp_path / "c")
    subprocess.run([MOSAIC, "run", "--offline", str(src), "--quiet"], check=True, capture_output=True)
    out = src / "offline"
    first = (out / "report.json").read_text()
    (out / "report.json").unlink()
    write_report(out)
    assert (out / "report.json").read_text() == first
