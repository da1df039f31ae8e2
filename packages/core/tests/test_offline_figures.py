"""``mosaic run --offline DIR`` checks every figure the report prints, not only the decisions.

A recorded H200 campaign (examples/h200-pallas-to-cute-gemm-8192: cuBLAS timed alone and paired with the final
incumbent) is copied and tampered with one way per test: a time in the journal or in a candidate's bundle, the
yardstick's bundle, the reference's noise, the shipped report.md / report.json / report.html, a second bundle
claiming a role. Each must be named, one line per figure (who claims what, what the bundles give), with exit 1
(a figure or verdict mismatch) or 2 (a campaign directory that cannot be re-decided); the untouched examples
re-decide cleanly (exit 0). The times in the asserts are the example's recorded ones.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import add_files, extra_keys, load_bundle, save_bundle

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PAIRED = EXAMPLES / "h200-pallas-to-cute-gemm-8192"
CAMPAIGNS = sorted(p.parent for p in EXAMPLES.glob("h200-*/journal.jsonl"))
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
CAND = "cand-290d97c0c4ae2c8d.bundle"  # step 2 (swizzle=2), a null result: 1749.50 vs 1749.77 us


def offline(src: Path, out: Path) -> tuple[int, str, str]:
    p = subprocess.run([*MOSAIC, "run", "--offline", str(src), "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def figure_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("MISMATCH figure")]


@pytest.fixture
def campaign(tmp_path) -> Path:
    dest = tmp_path / "campaign"
    shutil.copytree(PAIRED, dest)
    return dest


def scale_timings(bundle: Path, factor: float, sessions: str = "candidate_blocks", blocks: bool = True) -> None:
    """Multiply a bundle's recorded times (its own blocks, and one side of every session) by ``factor``; the
    manifest's SHA-256 is rewritten with them (a tamperer who knows the format)."""
    b = load_bundle(bundle)
    t = b.read_json("timings")
    if blocks:  # plain lists of per-run ns, or the capture's TimedRuns objects (times_ns)
        t["blocks"] = [{**blk, "times_ns": [x * factor for x in blk["times_ns"]]} if isinstance(blk, dict)
                       else [x * factor for x in blk] for blk in t["blocks"]]
    for s in t.get("sessions") or []:
        s[sessions] = [[x * factor for x in blk] for blk in s[sessions]]
    add_files(bundle, {"timings.json": ("timings", json.dumps(t))})


def edit_events(path: Path, change) -> None:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(change(e) or e) + "\n" for e in events))


@pytest.mark.parametrize("src", CAMPAIGNS, ids=[p.name for p in CAMPAIGNS])
def test_every_untouched_example_reproduces_every_figure(src, tmp_path):
    rc, out, err = offline(src, tmp_path / "out")
    assert rc == 0, (out, err)
    assert "MISMATCH" not in err and "recorded verdicts and the stop reproduced" in out, (out, err)


def test_the_figures_compared_are_the_ones_the_report_prints():
    from mosaic.run.report import markdown_figures, markdown_of_html, report_figures

    rep = json.loads((PAIRED / "report.json").read_text())
    printed = {k: v[1] for k, v in report_figures(rep).items() if v[1] is not None}
    assert printed == markdown_figures((PAIRED / "report.md").read_text())
    assert printed == markdown_figures(markdown_of_html((PAIRED / "report.html").read_text()))
    assert printed["fraction of the yardstick timed alone"] == "96.9%"
    assert printed["fraction of the yardstick, paired"] == "97.7%"
    assert printed["step 1 t cand (us)"] == "1808.06" and printed["step 1 t inc (us)"] == "1751.34"
    assert printed["step 1 times in its why"] == "1808.06 us, 1751.34 us, 49.73 us"
    assert printed["reference noise (us)"] == "49.73" and printed["reference time (us)"] == "1447.42"
    assert printed["stop reason"] == "converged: the incumbent is within the reference's noise or faster"
    assert len(printed) == 52


@pytest.mark.parametrize("src", CAMPAIGNS, ids=[p.name for p in CAMPAIGNS])
def test_every_printed_figure_reads_back_from_the_markdown_and_the_html(src):
    """The reader of report.md / report.html (markdown_figures) follows the writer (to_markdown, to_html): a change
    to one without the other fails here, not as a 'mismatch' on every shipped campaign."""
    from mosaic.run.journal import read_campaign_journal
    from mosaic.run.report import (
        build_report,
        markdown_figures,
        markdown_of_html,
        report_figures,
        to_html,
        to_markdown,
    )

    rep = build_report(read_campaign_journal(src / "journal.jsonl")[0])
    printed = {k: v[1] for k, v in report_figures(rep).items() if v[1] is not None}
    assert any(k.startswith("step ") for k in printed) and "reference noise (us)" in printed
    assert markdown_figures(to_markdown(rep)) == printed
    assert markdown_figures(markdown_of_html(to_html(rep))) == printed
    shipped = json.loads((src / "report.json").read_text())
    assert markdown_figures((src / "report.md").read_text()) == {
        k: v[1] for k, v in report_figures(shipped).items() if v[1] is not None}


def test_a_recorded_time_in_the_journal_is_flagged(campaign, tmp_path):
    def slower(e):
        if e["event"] == "verdict" and e["step"] == 1:
            return {**e, "t_candidate": e["t_candidate"] * 1.2}
    edit_events(campaign / "journal.jsonl", slower)
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 1, (out, err)
    assert figure_lines(err) == ["MISMATCH figure step 1 t cand (us): the journal claims 2169.67; the bundles give "
                                 "1808.06"], err
    assert "verdicts and the stop reproduced" not in out


def test_a_candidates_bundle_times_are_flagged_against_the_journal_and_every_report(campaign, tmp_path):
    scale_timings(campaign / "bundles" / CAND, 1.2)  # its session against the incumbent, its own blocks
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 1, (out, err)
    assert "MISMATCH verdict 3: recorded step 2 290d97c0c4ae2c8d rejected (null), re-decided step 2 " \
           "290d97c0c4ae2c8d rejected (slower)" in err, err
    lines = figure_lines(err)
    every = "the journal, report.json, report.md and report.html claim"
    # the journal's verdict is the MISMATCH verdict line above; the shipped reports' outcome is a figure
    for want in ("step 2 outcome: report.json, report.md and report.html claim rejected (null); the bundles give "
                 "rejected (slower)",
                 f"step 2 t cand (us): {every} 1749.50; the bundles give 2099.40",
                 f"step 2 times in its why: {every} 1749.50 us, 1749.77 us, 49.73 us; the bundles give 2099.40 us, "
                 "1749.77 us, 49.73 us",
                 f"beam 3 (after step 2): 290d97c0c4ae2c8d (us): {every} 1749.50; the bundles give 2099.40"):
        assert f"MISMATCH figure {want}" in lines, (want, err)
    # 1 verdict, 8 figures (the beam after step 3 changed too), each counted as what it is
    assert "offline re-decision: 1 verdict mismatch(es) against" in err and \
        "; 8 report figure(s) that the bundles do not reproduce" in err, err


def test_the_yardsticks_bundle_times_x1_2_are_flagged(campaign, tmp_path):
    scale_timings(campaign / "bundles" / "cublas.bundle", 1.2)  # cuBLAS alone and its side of the pairing
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 1, (out, err)
    lines = figure_lines(err)
    every = "the journal, report.json, report.md and report.html claim"
    for want in (f"figure fraction of the yardstick timed alone: {every} 96.9%; the bundles give 116.2%",
                 f"figure fraction of the yardstick, paired: {every} 97.7%; the bundles give 117.3%",
                 f"figure yardstick timed alone (us): {every} 1386.45; the bundles give 1663.74",
                 f"figure yardstick paired: the yardstick (us): {every} 1391.48; the bundles give 1669.78"):
        assert f"MISMATCH {want}" in lines, (want, err)
    # the TFLOP/s table: the shipped reports are of the format before it (they claim nothing of it); the journal's
    # times give it, 2 * 8192^3 FLOP over each
    for want in ("cuBLAS, alone (us): the journal claims 1386.45; the bundles give 1663.74",
                 "cuBLAS, alone (TFLOP/s): the journal claims 793.0; the bundles give 660.9",
                 "cuBLAS, paired with the final incumbent (us): the journal claims 1391.48; the bundles give 1669.78",
                 "cuBLAS, paired with the final incumbent (TFLOP/s): the journal claims 790.2; the bundles give 658.5"):
        assert f"MISMATCH figure throughput: {want}" in lines, (want, err)
    assert len(lines) == 8, err
    assert "verdict mismatch" not in err and "offline re-decision: 8 report figure(s) that the bundles do not " \
        "reproduce" in err, err
    # what the re-decided report says is the bundles' figure, not the recorded one
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert f"{rep['final']['fraction_of_yardstick']:.1%}" == "116.2%"


def test_the_reference_noise_in_the_journal_is_flagged(campaign, tmp_path):
    def noisier(e):
        if e["event"] == "reference":
            return {**e, "noise": {**e["noise"], "value_ns": e["noise"]["value_ns"] * 1.2}}
    edit_events(campaign / "journal.jsonl", noisier)
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 1, (out, err)
    assert "MISMATCH figure reference noise (us): the journal claims 59.67; the bundles give 49.73" in err, err


def test_the_reference_bundles_times_are_flagged(campaign, tmp_path):
    scale_timings(campaign / "bundles" / "reference.bundle", 1.2, sessions="candidate_blocks")
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 1, (out, err)
    every = "the journal, report.json, report.md and report.html claim"
    for want in (f"reference time (us): {every} 1447.42; the bundles give 1736.91",
                 f"reference noise (us): {every} 49.73; the bundles give 59.67",
                 "final noise (us): the journal and report.json claim 49.725243; the bundles give 59.670292"):
        assert f"MISMATCH figure {want}" in figure_lines(err), (want, err)


@pytest.mark.parametrize("name", ["report.md", "report.html"])
def test_a_shipped_reports_percentage_edited_is_flagged(campaign, tmp_path, name):
    path = campaign / name
    text = path.read_text()
    assert text.count("96.9% of cuBLAS timed alone") == 1
    path.write_text(text.replace("96.9% of cuBLAS timed alone", "116.5% of cuBLAS timed alone"))
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 1, (out, err)
    assert figure_lines(err) == [f"MISMATCH figure fraction of the yardstick timed alone: {name} claims 116.5%; "
                                 "the bundles give 96.9%"], err


def test_a_shipped_report_json_edited_is_flagged_even_below_the_printed_precision(campaign, tmp_path):
    path = campaign / "report.json"
    rep = json.loads(path.read_text())
    rep["final"]["fraction_of_yardstick"] = 1.165
    rep["edits"][2]["t_incumbent_ns"] += 1.0  # 1751.34 us as printed either way
    path.write_text(json.dumps(rep))
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 1, (out, err)
    lines = figure_lines(err)
    assert "MISMATCH figure fraction of the yardstick timed alone: report.json claims 116.5%; the bundles give " \
           "96.9%" in lines, err
    assert "MISMATCH figure step 2 t inc (us): report.json claims 1749.769000; the bundles give 1749.768000" \
        in lines, err
    assert len(lines) == 2, err


def test_a_shipped_report_that_is_not_a_report_is_flagged(campaign, tmp_path):
    (campaign / "report.json").write_text('{"format": "something else"}')
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 1, (out, err)
    assert "MISMATCH figures of report.json: not read (not a mosaic run report" in err, err


def test_the_stop_reason_of_a_shipped_report_is_flagged(campaign, tmp_path):
    path = campaign / "report.md"
    path.write_text(path.read_text().replace("Stopped: converged: the incumbent is within the reference's noise or "
                                             "faster.", "Stopped: converged: 3 steps early."))
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 1
    assert figure_lines(err) == ["MISMATCH figure stop reason: report.md claims converged: 3 steps early; the "
                                 "bundles give converged: the incumbent is within the reference's noise or faster"]


@pytest.mark.parametrize("role,name", [("reference", "reference-2.bundle"), ("yardstick", "yardstick.bundle")])
def test_a_second_bundle_claiming_a_role_is_refused(campaign, tmp_path, role, name):
    src = campaign / "bundles" / ("reference.bundle" if role == "reference" else "cublas.bundle")
    shutil.copytree(src, campaign / "bundles" / name)
    scale_timings(campaign / "bundles" / name, 0.8)
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 2, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: two bundles claim the {role}'s role (mosaic_run.role = '{role}'): "), err
    assert name in err and src.name in err
    assert not (tmp_path / "out" / "journal.jsonl").exists()


def test_a_second_bundle_recording_a_candidates_key_is_refused(campaign, tmp_path):
    shutil.copytree(campaign / "bundles" / CAND, campaign / "bundles" / "cand-zzzz.bundle")
    rc, out, err = offline(campaign, tmp_path / "out")
    assert rc == 2 and "Traceback" not in err, err
    assert err.startswith("error: two bundles record the kernel '290d97c0c4ae2c8d' (mosaic_run.key): "), err


# -- recorded fields of the wrong type: one line naming the field, exit 2, and the rerun after the fix runs ------------
def _rewrite_manifest(bundle: Path, capture_change=None, drop_role: str | None = None) -> None:
    b = load_bundle(bundle)
    files = {f.path: (f.role, b.member(f.path)) for f in b.files if f.role != drop_role}
    extra = extra_keys(b)
    if capture_change:
        extra["capture"] = capture_change(dict(extra["capture"]))
    save_bundle(b.root, kernel=b.kernel, language=b.language, files=files, gpu=b.gpu, toolchain=b.toolchain,
                extra=extra, overwrite=True)


def _one_error(rc, err, *needles):
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_capture_timeout_s_a_string_is_one_line_and_the_fixed_rerun_runs(campaign, tmp_path):
    bundle = campaign / "bundles" / CAND  # a gate the budget cut: its outputs never came
    _rewrite_manifest(bundle, lambda c: {**c, "status": "timeout", "timeout": {"budget": True, "s": "600"}})
    out = tmp_path / "out"
    rc, _, err = offline(campaign, out)
    _one_error(rc, err, "capture.timeout.s", '"600"', CAND)
    assert not (out / "journal.jsonl").exists()
    _rewrite_manifest(bundle, lambda c: {**c, "timeout": {"budget": True, "s": 600.0}})
    rc, stdout, err = offline(campaign, out)
    assert "Traceback" not in err and "a journal exists already" not in err, err
    assert rc == 1 and "budget: the gate was killed after 600 s" in (out / "report.md").read_text()


def test_a_timing_sessions_gpu_a_string_is_one_line_and_leaves_no_journal_behind(campaign, tmp_path):
    bundle = campaign / "bundles" / CAND
    b = load_bundle(bundle)
    good = b.read_json("timings")
    bad = json.loads(json.dumps(good))
    bad["sessions"][0]["gpu"] = "NVIDIA H200"
    add_files(bundle, {"timings.json": ("timings", json.dumps(bad))})
    out = tmp_path / "out"
    rc, _, err = offline(campaign, out)
    _one_error(rc, err, "timings.json sessions[0].gpu must be an object", '"NVIDIA H200"', CAND)
    assert not (out / "journal.jsonl").exists() and not (out / "report.json").exists()
    add_files(bundle, {"timings.json": ("timings", json.dumps(good))})  # fixed: the same --out runs again
    rc, stdout, err = offline(campaign, out)
    assert rc == 0, (stdout, err)
    assert "all 4 recorded verdicts and the stop reproduced" in stdout


def test_a_timing_sessions_power_sample_of_the_wrong_type_is_one_line(campaign, tmp_path):
    bundle = campaign / "bundles" / CAND
    t = load_bundle(bundle).read_json("timings")
    t["sessions"][0]["gpu"]["power_rounds"] = [{"state": "known", "sm_mhz": "fast"}]
    add_files(bundle, {"timings.json": ("timings", json.dumps(t))})
    rc, _, err = offline(campaign, tmp_path / "out")
    _one_error(rc, err, "timings.json sessions[0].gpu power_rounds[0]: sm_mhz must be a number or null")


def test_a_journals_timed_gpu_of_the_wrong_type_is_one_line(campaign, tmp_path):
    def string_gpu(e):
        if e["event"] == "timed" and "gpu" in e:
            return {**e, "gpu": "NVIDIA H200"}
    edit_events(campaign / "journal.jsonl", string_gpu)
    rc, _, err = offline(campaign, tmp_path / "out")
    _one_error(rc, err, "(timed event) has a malformed field 'gpu'")
    p = subprocess.run([*MOSAIC, "run", "--resume", str(campaign)], capture_output=True, text=True, timeout=120)
    _one_error(p.returncode, p.stderr, "(timed event) has a malformed field 'gpu'")


def test_a_malformed_power_sample_reads_as_unknown_naming_the_field():
    from mosaic.timing.throttle import PowerSample, capped_text

    s = PowerSample.from_json({"state": "known", "sm_mhz": "fast", "reasons": ["sw_power_cap"]})
    assert (s.state, s.reason) == ("unknown", "malformed sample: sm_mhz must be a number or null")
    assert capped_text([{"state": "known", "reasons": 3}]) == \
        "power state unknown in 1 round(s): malformed sample: reasons must be a list of strings"
    good = PowerSample.from_json({"state": "known", "sm_mhz": 1455.0, "reasons": ["sw_power_cap"]})
    assert good.state == "known" and good.power_capped is True
