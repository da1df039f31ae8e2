"""A campaign captures every yardstick of its family, alone at the start, and pairs each one measured with the final
incumbent at the stop; a yardstick that cannot run is recorded with its reason, never dropped. The report gives
the microseconds and TFLOP/s of the reference, the final incumbent and every yardstick (alone and paired), and
``mosaic run --offline`` recomputes each of them from the bundles.

An attention campaign (pallas -> cute, 1 x 4096 x 32 x 128 bf16) is recorded through the loop by a workbench that
writes the live workbench's bundle layout (the reference with real sm_90a SASS from the lift corpus and outputs the
float64 oracle passes, the naive candidate, one bundle per yardstick: torch SDPA, flash SDPA and cuDNN SDPA
measured, flash-attn-4's saying its library does not import), then re-decided offline from those bundles. The
live workbench's own captures run in real child processes on this CPU: each yardstick fails there (no CUDA), one
for its library (flash-attn-4 hidden from the child), and every failure is a recorded reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from mosaic.bundle import add_files, load_bundle
from mosaic.families import get
from mosaic.oracle.formats import FORMATS
from mosaic.records import KernelSpec, LaunchRecord
from mosaic.run.campaign import Campaign
from mosaic.run.journal import Journal, read_campaign_journal
from mosaic.run.live.protocol import ChildResult
from mosaic.run.loop import Loop, campaign_tools
from mosaic.run.offline import OfflineWorkbench, redecide
from mosaic.run.replay import Recorded, ReplayBench
from mosaic.run.report import (
    build_report,
    markdown_figures,
    markdown_of_html,
    report_figures,
    to_html,
    to_markdown,
)
from mosaic.run.workbench import (
    REFERENCE,
    Built,
    Checked,
    Kernel,
    ReferenceCapture,
    Timed,
    YardstickRun,
    add_session,
    save_kernel_bundle,
    time_of,
    update_bundle,
    yardstick_key,
    yardstick_meta,
)

CORPUS = Path(__file__).resolve().parent / "lift" / "corpus" / "artifacts"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "h200-pallas-to-cute-gemm-8192"
SHAPE = {"batch": 1, "seq": 4096, "heads": 32, "head_dim": 128}
FLOPS = 4.0 * 1 * 32 * 4096 * 4096 * 128  # QK^T and PV: 2 x 2 b h s^2 d
US = {"reference": 1000.0, "naive": 990.0}  # the naive candidate is faster: the campaign converges at step 0
ALONE = {"torch-sdpa": 700.0, "sdpa-flash": 720.0, "cudnn": 650.0}
PAIRED = {"torch-sdpa": (705.0, 995.0), "sdpa-flash": (722.0, 996.0), "cudnn": (655.0, 994.0)}  # (yardstick, inc.)
MISSING = ("flash-attn-4", "unavailable", "the flash-attn-4 yardstick needs flash-attn-4, which does not import "
           "here (ModuleNotFoundError: No module named 'flash_attn') (yardstick)")


def blocks(us: float, n: int = 10, runs: int = 5) -> list[list[float]]:
    """Per-run times (ns) spread around ``us`` symmetrically, so that the median of the block medians is ``us``."""
    return [[us * 1e3 * (1 + 1e-5 * (i % 5 - 2)) * (1 + 1e-4 * (j % 5 - 2)) for j in range(runs)] for i in range(n)]


def t(us: float) -> float:
    return time_of(blocks(us))


def campaign() -> Campaign:
    return Campaign(source="pallas", target="cute", family="attention", shape=dict(SHAPE), dtype="bf16", gpu="h200")


def small_attention(seed: int = 0):
    """q, k, v of a small head and the float64 attention rounded once to bf16 (what the oracle passes)."""
    rng = np.random.default_rng(seed)
    q, k, v = (FORMATS["bf16"].round(rng.normal(size=(1, 2, 16, 8))).astype(np.float32) for _ in range(3))
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / np.sqrt(8)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    return {"q": q, "k": k, "v": v}, {"o": FORMATS["bf16"].round(o).astype(np.float32)}


def sass(variant: str) -> dict:
    launch = LaunchRecord(kernel_name="attention", grid=(132,), block=384, cluster=1, dynamic_smem=180_000,
                          registers_per_thread=168).to_json()
    return {"kernel.sass": ("sass", CORPUS / f"{variant}.sass"), "launch.json": ("launch", json.dumps(launch))}


class RecordingBench:
    """Answers the loop as the live workbench does and writes what it answers in the live workbench's bundle
    layout (the candidates' sessions in their bundles, each yardstick's capture and pairing in its own)."""

    kind = "recording"

    def __init__(self, bundles: Path, missing=MISSING):
        self.bundles, self.missing = bundles, missing
        self.inputs, self.outputs = small_attention()
        self.paired: list[str] = []

    def dest(self, key: str) -> Path:
        if key == REFERENCE:
            return self.bundles / "reference.bundle"
        return self.bundles / (f"{key}.bundle" if key.startswith("yardstick") else f"cand-{key}.bundle")

    def capture_reference(self, spec):
        save_kernel_bundle(self.dest(REFERENCE), spec=spec, key=REFERENCE, role="reference", files=sass("tma"),
                           blocks=blocks(US["reference"], 20, 20), inputs=self.inputs, outputs=self.outputs,
                           gpu="h200", cost_s=30.0)
        return ReferenceCapture(Kernel(REFERENCE, spec, None, str(self.dest(REFERENCE))),
                                blocks(US["reference"], 20, 20), 30.0)

    def yardsticks(self, spec, rounds):
        runs = []
        for i, yard in enumerate(get("attention").yardsticks):
            key = yardstick_key(yard.name, first=i == 0)
            yspec = KernelSpec(spec.family, dict(spec.shape), spec.dtype, yard.name, {}, name=yard.call)
            if yard.name == self.missing[0]:
                save_kernel_bundle(self.dest(key), spec=yspec, key=key, role="yardstick", gpu="h200",
                                   files={"capture.log": ("log", self.missing[2])})
                update_bundle(self.dest(key), extra=yardstick_meta(key, yard.name, 3.0, self.missing[1:]))
                runs.append(YardstickRun(key, yard.name, yard.title, None, *self.missing[1:]))
                continue
            save_kernel_bundle(self.dest(key), spec=yspec, key=key, role="yardstick", gpu="h200",
                               blocks=blocks(ALONE[yard.name]))
            update_bundle(self.dest(key), extra=yardstick_meta(key, yard.name, 4.0))
            runs.append(YardstickRun(key, yard.name, yard.title, blocks(ALONE[yard.name])))
        return runs

    def yardstick(self, spec, rounds):
        raise AssertionError("the loop asks yardsticks() of a workbench that has it")

    def build(self, kernel):
        save_kernel_bundle(self.dest(kernel.key), spec=kernel.spec, key=kernel.key, role="candidate",
                           files=sass("ld32"), outputs=self.outputs, gpu="h200", cost_s=6.0)
        return Built(kernel.key, True, bundle=str(self.dest(kernel.key)), cost_s=6.0)

    def check(self, kernel, built, reference):
        return Checked(kernel.key, True, "passed the float64 oracle")

    def time(self, incumbent, kernel, rounds):
        a, b = blocks(US["reference" if incumbent.key == REFERENCE else "naive"]), blocks(US["naive"])
        add_session(self.dest(kernel.key), {"against": incumbent.key, "order": "ABAB", "incumbent_blocks": a,
                                            "candidate_blocks": b, "wall_s": 1.0}, 1.0)
        return Timed(kernel.key, incumbent.key, a, b, cost_s=1.0)

    def pair_yardstick(self, kernel, rounds, key="yardstick"):
        name = load_bundle(self.dest(key)).language
        yard_us, inc_us = PAIRED[name]
        a, b = blocks(inc_us), blocks(yard_us)
        add_session(self.dest(key), {"against": kernel.key, "order": "ABAB", "incumbent_blocks": a,
                                     "candidate_blocks": b, "wall_s": 2.5}, 2.5)
        self.paired.append(key)
        return Timed(key, kernel.key, a, b, cost_s=2.5)

    def bundle_path(self, key):
        return str(self.dest(key)) if self.dest(key).is_dir() else None


class Nothing:
    name = "nothing"

    def propose(self, request):
        return []


def record(root: Path, bench_cls=RecordingBench) -> tuple[Path, list[str], RecordingBench]:
    """The recorded campaign in ``root``: its journal, its bundles and its report (as a live run leaves them)."""
    from mosaic.run.report import write_report

    c = campaign()
    gpu, knob_cls, _ = campaign_tools(c)
    bench = bench_cls(root / "bundles")
    lines: list[str] = []
    journal = Journal.create(root)
    out = Loop(c, bench, Nothing(), journal, gpu, knob_cls, progress=lines.append).run()
    journal.close()
    assert out.stop == "converged"
    write_report(root)
    return root, lines, bench


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return record(tmp_path_factory.mktemp("recorded") / "campaign")


def events_of(root: Path) -> list[dict]:
    return read_campaign_journal(root / "journal.jsonl")[0]


# -- the loop: every yardstick captured, the missing one recorded, each measured one paired ---------------------------
def test_every_yardstick_is_captured_and_the_one_that_cannot_run_is_recorded_with_its_reason(recorded):
    root, lines, _ = recorded
    events = events_of(root)
    measured = [e for e in events if e["event"] == "yardstick"]
    assert [(e["key"], e["yardstick"], e["name"]) for e in measured] == [
        ("yardstick", "torch-sdpa", "torch SDPA"), ("yardstick-sdpa-flash", "sdpa-flash", "flash SDPA"),
        ("yardstick-cudnn", "cudnn", "cuDNN SDPA")]
    assert [e["time_ns"] for e in measured] == [t(700.0), t(720.0), t(650.0)]
    [missing] = [e for e in events if e["event"] == "yardstick-unmeasured"]
    assert (missing["key"], missing["yardstick"], missing["name"], missing["reason_code"], missing["reason"]) == (
        "yardstick-flash-attn-4", "flash-attn-4", "FlashAttention-4", "unavailable", MISSING[2])
    assert f"yardstick FlashAttention-4 (flash-attn-4) not measured (unavailable): {MISSING[2]}" in lines
    assert "yardstick cuDNN SDPA (cudnn): 650.00 us, timed alone" in lines
    # the captures come right after the reference, before the naive translation's first step
    kinds = [e["event"] for e in events]
    assert kinds[:7] == ["campaign", "reference", "yardstick", "yardstick", "yardstick", "yardstick-unmeasured",
                         "proposal"]


def test_each_measured_yardstick_is_paired_with_the_final_incumbent(recorded):
    root, lines, bench = recorded
    events = events_of(root)
    stop = next(e for e in events if e["event"] == "stop")
    inc = stop["incumbent"]
    assert bench.paired == ["yardstick", "yardstick-sdpa-flash", "yardstick-cudnn"]  # not the missing one
    assert stop["yardsticks_paired"] == [
        {"key": "yardstick", "yardstick": "torch-sdpa", "name": "torch SDPA", "t_yardstick_ns": t(705.0),
         "t_incumbent_ns": t(995.0)},
        {"key": "yardstick-sdpa-flash", "yardstick": "sdpa-flash", "name": "flash SDPA", "t_yardstick_ns": t(722.0),
         "t_incumbent_ns": t(996.0)},
        {"key": "yardstick-cudnn", "yardstick": "cudnn", "name": "cuDNN SDPA", "t_yardstick_ns": t(655.0),
         "t_incumbent_ns": t(994.0)}]
    # the first keeps the field campaigns have always recorded
    assert stop["yardstick_paired"] == {"t_yardstick_ns": t(705.0), "t_incumbent_ns": t(995.0)}
    timed = [(e["key"], e["against"]) for e in events if e["event"] == "timed" and e["key"].startswith("yardstick")]
    assert timed == [("yardstick", inc), ("yardstick-sdpa-flash", inc), ("yardstick-cudnn", inc)]
    assert abs(stop["cost_s"] - (30.0 + 6.0 + 1.0 + 3 * 2.5)) < 1e-9  # each pairing's device time is counted
    assert "yardstick cuDNN SDPA paired with the incumbent " + inc + ": 655.00 us vs 994.00 us (65.9%), " \
           "interleaved" in lines


def test_the_report_gives_the_time_and_tflops_of_every_kernel(recorded):
    root, _, _ = recorded
    rep = json.loads((root / "report.json").read_text())
    assert rep["version"] == 2 and rep["throughput"]["flops"] == FLOPS
    rows = {(r["kernel"], r["timing"]): r for r in rep["throughput"]["rows"]}
    want = {("reference", "alone (its noise blocks)"): time_of(blocks(1000.0, 20, 20)),
            ("final incumbent", "interleaved with the reference"): t(990.0),
            ("reference", "interleaved with the final incumbent"): t(1000.0),
            ("torch SDPA", "alone"): t(700.0), ("torch SDPA", "paired with the final incumbent"): t(705.0),
            ("final incumbent", "paired with torch SDPA"): t(995.0),
            ("flash SDPA", "alone"): t(720.0), ("flash SDPA", "paired with the final incumbent"): t(722.0),
            ("final incumbent", "paired with flash SDPA"): t(996.0),
            ("cuDNN SDPA", "alone"): t(650.0), ("cuDNN SDPA", "paired with the final incumbent"): t(655.0),
            ("final incumbent", "paired with cuDNN SDPA"): t(994.0),
            ("FlashAttention-4", f"not measured (unavailable): {MISSING[2]}"): None}
    assert set(rows) == set(want)
    for k, ns in want.items():
        assert rows[k]["time_ns"] == ns
        assert rows[k]["tflops"] == (None if ns is None else FLOPS / ns / 1e3), k  # work / time
    assert round(rows[("cuDNN SDPA", "alone")]["tflops"], 1) == round(FLOPS / 650e3 / 1e3, 1) == 422.9
    md = (root / "report.md").read_text()
    assert "| cuDNN SDPA | alone | 650.00 | 422.9 |" in md
    assert f"| FlashAttention-4 | not measured (unavailable): {MISSING[2]} | - | - |" in md
    assert "Work: 2.74878e+11 FLOP (the family's work)" in md
    yards = {y["key"]: y for y in rep["yardsticks"]}
    assert yards["yardstick-cudnn"]["paired"]["fraction"] == t(655.0) / t(994.0)
    assert yards["yardstick-flash-attn-4"]["measured"] is False
    assert yards["yardstick-flash-attn-4"]["reason_code"] == "unavailable"


def test_every_new_figure_reads_back_from_the_markdown_and_the_html(recorded):
    root, _, _ = recorded
    rep = build_report(events_of(root))
    printed = {k: v[1] for k, v in report_figures(rep).items() if v[1] is not None}
    tp = {k: v for k, v in printed.items() if k.startswith("throughput: ")}
    assert len(tp) == 1 + 12 * 2 + 1  # the work, 12 timed rows (us and TFLOP/s), the yardstick not measured
    assert tp["throughput: cuDNN SDPA, paired with the final incumbent (TFLOP/s)"] == "419.7"
    assert markdown_figures(to_markdown(rep)) == printed
    assert markdown_figures(markdown_of_html(to_html(rep))) == printed
    assert markdown_figures((root / "report.md").read_text()) == printed
    html = (root / "report.html").read_text()
    assert "<th>kernel</th><th>timing</th><th>us</th><th>TFLOP/s</th>" in html


# -- offline: the bundles give every figure back -------------------------------------------------------------------
def test_the_offline_re_decision_reproduces_every_yardstick_and_figure(recorded, tmp_path):
    root, _, _ = recorded
    src = tmp_path / "campaign"
    shutil.copytree(root, src)
    r = redecide(src, tmp_path / "out", quiet=True)
    assert r.problems == () and r.recorded_verdicts == 1
    again = read_campaign_journal(tmp_path / "out" / "journal.jsonl")[0]
    rec = events_of(root)
    for kind in ("yardstick", "yardstick-unmeasured"):
        keep = ("key", "yardstick", "name", "blocks", "time_ns", "reason_code", "reason")
        assert [{k: e.get(k) for k in keep} for e in again if e["event"] == kind] == \
               [{k: e.get(k) for k in keep} for e in rec if e["event"] == kind]
    stop = next(e for e in again if e["event"] == "stop")
    assert stop["yardsticks_paired"] == next(e for e in rec if e["event"] == "stop")["yardsticks_paired"]
    assert r.report["throughput"] == json.loads((root / "report.json").read_text())["throughput"]


def _scale(bundle: Path, factor: float) -> None:
    b = load_bundle(bundle)
    timings = b.read_json("timings")
    timings["blocks"] = [[x * factor for x in blk] for blk in timings["blocks"]]
    for s in timings.get("sessions") or []:
        s["candidate_blocks"] = [[x * factor for x in blk] for blk in s["candidate_blocks"]]
    add_files(bundle, {"timings.json": ("timings", json.dumps(timings))})


def test_an_extra_yardsticks_bundle_times_are_flagged_in_every_source(recorded, tmp_path):
    root, _, _ = recorded
    src = tmp_path / "campaign"
    shutil.copytree(root, src)
    _scale(src / "bundles" / "yardstick-cudnn.bundle", 1.2)
    r = redecide(src, tmp_path / "out", quiet=True)
    every = "the journal, report.json, report.md and report.html claim"
    assert set(r.problems) == {
        f"figure throughput: cuDNN SDPA, alone (us): {every} 650.00; the bundles give 780.00",
        f"figure throughput: cuDNN SDPA, alone (TFLOP/s): {every} 422.9; the bundles give 352.4",
        f"figure throughput: cuDNN SDPA, paired with the final incumbent (us): {every} 655.00; the bundles give 786.00",
        f"figure throughput: cuDNN SDPA, paired with the final incumbent (TFLOP/s): {every} 419.7; the bundles give "
        "349.7"}, r.problems
    assert r.figure_problems == 4  # the verdicts stand: a yardstick decides nothing


def test_a_yardstick_that_could_not_run_is_checked_too(recorded, tmp_path):
    root, _, _ = recorded
    src = tmp_path / "campaign"
    shutil.copytree(root, src)
    shutil.rmtree(src / "bundles" / "yardstick-flash-attn-4.bundle")  # its record gone: the bundles give nothing
    r = redecide(src, tmp_path / "out", quiet=True)
    every = "the journal, report.json, report.md and report.html claim"
    assert r.problems == (f"figure throughput: FlashAttention-4, not measured: {every} not measured (unavailable): "
                          f"{MISSING[2]}; the bundles give nothing",), r.problems


def test_a_shipped_reports_tflops_edited_is_flagged(recorded, tmp_path):
    root, _, _ = recorded
    src = tmp_path / "campaign"
    shutil.copytree(root, src)
    md = src / "report.md"
    md.write_text(md.read_text().replace("| cuDNN SDPA | alone | 650.00 | 422.9 |", "| cuDNN SDPA | alone | 650.00 | "
                                                                                   "522.9 |"))
    rep = json.loads((src / "report.json").read_text())
    del rep["throughput"]  # report.json declares format 2: the table is asked of it
    (src / "report.json").write_text(json.dumps(rep))
    r = redecide(src, tmp_path / "out", quiet=True)
    assert "figure throughput: cuDNN SDPA, alone (TFLOP/s): report.json claims nothing; report.md claims 522.9; the " \
           "bundles give 422.9" in r.problems, r.problems
    assert sum("report.json claims nothing" in p for p in r.problems) == 1 + 12 * 2 + 1, r.problems


def test_two_bundles_claiming_one_extra_yardstick_are_refused_in_one_line(recorded, tmp_path):
    from mosaic.errors import BundleError

    root, _, _ = recorded
    src = tmp_path / "campaign"
    shutil.copytree(root, src)
    shutil.copytree(src / "bundles" / "yardstick-cudnn.bundle", src / "bundles" / "yardstick-cudnn-2.bundle")
    with pytest.raises(BundleError) as err:
        OfflineWorkbench(src, "attention", "bf16")
    assert err.value.what == ("two bundles claim the yardstick 'yardstick-cudnn' (mosaic_run.key): "
                              "yardstick-cudnn-2.bundle and yardstick-cudnn.bundle; a campaign records one")


def test_resume_replays_every_yardstick_and_pairing_from_the_journal(recorded):
    root, _, _ = recorded
    events = events_of(root)
    replay = ReplayBench(RecordingBench(root / "unused"), Recorded(events))
    spec = KernelSpec("attention", SHAPE, "bf16", "pallas", {})
    runs = replay.yardsticks(spec, 5)
    assert [(y.key, y.measured, y.reason_code) for y in runs] == [
        ("yardstick", True, ""), ("yardstick-sdpa-flash", True, ""), ("yardstick-cudnn", True, ""),
        ("yardstick-flash-attn-4", False, "unavailable")]
    inc = Kernel(next(e for e in events if e["event"] == "stop")["incumbent"], spec)
    got = replay.pair_yardstick(inc, 5, "yardstick-sdpa-flash")
    assert (got.key, got.against, got.t_candidate) == ("yardstick-sdpa-flash", inc.key, t(722.0))
    assert not (root / "unused").exists()  # nothing was asked of the workbench


# -- an old, single-yardstick campaign ---------------------------------------------------------------------------------
def test_an_old_single_yardstick_campaign_re_decides_and_gains_its_tflops(tmp_path):
    r = redecide(EXAMPLE, tmp_path / "out", quiet=True)
    assert r.problems == ()  # its shipped reports are of the format before the table: they claim nothing of it
    again = read_campaign_journal(tmp_path / "out" / "journal.jsonl")[0]
    rec = events_of(EXAMPLE)
    old = next(e for e in rec if e["event"] == "stop")
    assert "yardsticks_paired" not in old
    stop = next(e for e in again if e["event"] == "stop")
    assert stop["yardstick_paired"] == old["yardstick_paired"]
    assert stop["yardsticks_paired"] == [{"key": "yardstick", "yardstick": "cublas", "name": "cuBLAS",
                                          **old["yardstick_paired"]}]
    # the old journal's report has the same table as the re-decided one
    rows = {(x["kernel"], x["timing"]): x["tflops"] for x in build_report(rec)["throughput"]["rows"]}
    assert rows == {(x["kernel"], x["timing"]): x["tflops"] for x in r.report["throughput"]["rows"]}
    assert rows[("cuBLAS", "paired with the final incumbent")] == 2.0 * 8192**3 / old["yardstick_paired"][
        "t_yardstick_ns"] / 1e3
    # a resumed old journal answers with its one recorded yardstick (its old key), capturing nothing more
    replay = ReplayBench(RecordingBench(tmp_path / "unused"), Recorded(rec))
    assert [(y.key, y.title) for y in replay.yardsticks(KernelSpec("gemm", {"m": 8, "n": 8, "k": 8}, "bf16",
                                                                     "pallas", {}), 5)] == [("cublas", "cuBLAS")]


# -- the live workbench: real children on this CPU ---------------------------------------------------------------------
def test_the_live_workbench_records_why_each_yardstick_could_not_run(tmp_path, monkeypatch):
    """Each yardstick in its own child process: on this machine torch has no CUDA, so torch's three fail at run
    time; flash-attn-4 is hidden from the children (a package on PYTHONPATH whose import fails), so it is
    'unavailable'. None is a crash, none is dropped, and the offline workbench reads the same back."""
    from mosaic.run.live.parent import LiveWorkbench

    hide = tmp_path / "hide" / "flash_attn"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text('raise ImportError("hidden from this process by the test")\n')
    monkeypatch.setenv("PYTHONPATH", str(hide.parent))
    c = Campaign(source="pallas", target="cute", family="attention", shape={"batch": 1, "seq": 64, "heads": 2,
                                                                            "head_dim": 32}, dtype="bf16", gpu="h200")
    lines: list[str] = []
    bench = LiveWorkbench(c, tmp_path / "campaign", progress=lines.append)
    try:
        bench._capture_yardsticks(KernelSpec("attention", dict(c.shape), "bf16", "pallas", {}))
        runs = bench.yardsticks(None, 5)
        assert bench.pair_yardstick(Kernel("abc", KernelSpec("attention", dict(c.shape), "bf16", "cute", {})), 5,
                                    "yardstick-flash-attn-4") is None  # nothing measured: nothing to pair
    finally:
        bench.close()
    assert [(y.key, y.name, y.reason_code) for y in runs] == [
        ("yardstick", "torch-sdpa", "failed"), ("yardstick-sdpa-flash", "sdpa-flash", "failed"),
        ("yardstick-cudnn", "cudnn", "failed"), ("yardstick-flash-attn-4", "flash-attn-4", "unavailable")]
    assert all("Torch not compiled with CUDA" in y.reason for y in runs[:3]), [y.reason for y in runs]
    assert runs[3].reason == ("the flash-attn-4 yardstick needs flash-attn-4, which does not import here "
                              "(ImportError: hidden from this process by the test) (yardstick)")
    assert all("\n" not in y.reason for y in runs)
    assert sum("capture in its own process" in line for line in lines) == 4
    names = sorted(p.name for p in (tmp_path / "campaign" / "bundles").iterdir())
    assert names == ["yardstick-cudnn.bundle", "yardstick-flash-attn-4.bundle", "yardstick-sdpa-flash.bundle",
                     "yardstick.bundle"]
    meta = load_bundle(tmp_path / "campaign" / "bundles" / "yardstick-flash-attn-4.bundle").manifest["mosaic_run"]
    assert meta["role"] == "yardstick" and meta["yardstick"] == "flash-attn-4"
    assert meta["unmeasured"] == {"reason_code": "unavailable", "reason": runs[3].reason}
    # the offline workbench reads the same records back (with a reference beside them, as a campaign has)
    inputs, outputs = small_attention()
    save_kernel_bundle(tmp_path / "campaign" / "bundles" / "reference.bundle",
                       spec=KernelSpec("attention", dict(c.shape), "bf16", "pallas", {}), key=REFERENCE,
                       role="reference", blocks=blocks(10.0), inputs=inputs, outputs=outputs)
    back = OfflineWorkbench(tmp_path / "campaign", "attention", "bf16").yardsticks(None, 5)
    assert back == runs


def test_a_format_a_yardstick_does_not_take_starts_no_process(tmp_path):
    from mosaic.run.live.parent import LiveWorkbench

    c = Campaign(source="pallas", target="cute", family="attention", shape={"batch": 1, "seq": 64, "heads": 2,
                                                                            "head_dim": 32}, dtype="f32", gpu="h200")
    bench = LiveWorkbench(c, tmp_path, progress=lambda line: None, python="/nonexistent/python")  # never started
    try:
        run, wall = bench._capture_yardstick(KernelSpec("attention", dict(c.shape), "f32", "pallas", {}),
                                             get("attention").yardstick("cudnn"), "yardstick-cudnn")
    finally:
        bench.close()
    assert (run.measured, run.reason_code, run.reason, wall) == (
        False, "dtype", "the cudnn yardstick takes bf16, f16, not f32", 0.0)
    meta = load_bundle(tmp_path / "bundles" / "yardstick-cudnn.bundle").manifest["mosaic_run"]
    assert meta["unmeasured"]["reason_code"] == "dtype"


@pytest.mark.parametrize("result, want", [
    (ChildResult("ok", {"capture": {"status": "ok", "summary": {"numerics_pass": True}}}, "", "", 1.0), None),
    (ChildResult("ok", {"capture": {"status": "failed", "message": "the x yardstick needs x",
                                    "summary": {"error": "the x yardstick needs x", "error_code": "unavailable"}}},
                 "", "", 1.0), ("unavailable", "the x yardstick needs x")),
    (ChildResult("ok", {"capture": {"status": "numerics-failed", "message": "max error 3.1 x the band",
                                    "summary": {"numerics_pass": False}}}, "", "", 1.0),
     ("numerics", "failed the float64 oracle: max error 3.1 x the band")),
    (ChildResult("timeout", {}, "killed after 300 s", "", 300.0), ("timeout", "killed after 300 s")),
    (ChildResult("crashed", {}, "killed by signal 11", "", 2.0), ("failed", "killed by signal 11")),
    (ChildResult("ok", {"capture": {"status": "failed", "message": "RuntimeError: no\n  device",
                                    "summary": {"error": "RuntimeError: no device"}}}, "", "", 1.0),
     ("failed", "RuntimeError: no device")),
])
def test_why_a_yardstick_capture_measured_nothing_is_a_rule_table(result, want):
    from mosaic.run.live.parent import unmeasured_reason

    assert unmeasured_reason(result) == want


@pytest.mark.gpu
def test_every_attention_yardstick_is_captured_and_paired_on_the_gpu(tmp_path):
    """On a CUDA device: each attention yardstick captured alone in its own process (flash-attn-4 too where it is
    installed, else recorded 'unavailable'), each measured one timed against an incumbent in interleaved rounds in
    the worker, and the offline workbench reading every capture and pairing back from the bundles. The stand-in
    incumbent is torch SDPA itself under a candidate's key (the child prepares a yardstick's spec like a kernel)."""
    import importlib.util

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")
    from mosaic.gpus import detect
    from mosaic.plugins import host
    from mosaic.run.live.parent import LiveWorkbench

    found = [d.target.name for d in detect(host().items("gpus").values()).devices if d.target is not None]
    if not found:
        pytest.skip("no GPU record matches this device")
    shape = {"batch": 1, "seq": 2048, "heads": 16, "head_dim": 128}
    flops = 4.0 * 16 * 2048 * 2048 * 128
    c = Campaign(source="pallas", target="cute", family="attention", shape=dict(shape), dtype="bf16", gpu=found[0],
                 rounds=5, runs_per_block=10)
    bench = LiveWorkbench(c, tmp_path / "campaign", progress=print)
    ref_spec = KernelSpec("attention", dict(shape), "bf16", "pallas", {})
    incumbent = Kernel("0123456789abcdef", KernelSpec("attention", dict(shape), "bf16", "torch-sdpa", {},
                                                      name="torch.nn.functional.scaled_dot_product_attention"))
    try:
        bench._capture_yardsticks(ref_spec)
        runs = bench.yardsticks(None, 5)
        paired = {y.key: bench.pair_yardstick(incumbent, 5, y.key) for y in runs if y.measured}
    finally:
        bench.close()
    for y in runs:
        alone = f"{time_of(y.blocks) / 1e3:.2f} us, {flops / time_of(y.blocks) / 1e3:.1f} TFLOP/s" if y.measured \
            else f"not measured ({y.reason_code}): {y.reason}"
        p = paired.get(y.key)
        pair = f"; paired {p.t_candidate / 1e3:.2f} us vs incumbent {p.t_incumbent / 1e3:.2f} us" if p else ""
        print(f"{y.key} ({y.title}): {alone}{pair}")
    fa4 = importlib.util.find_spec("flash_attn") is not None
    want = {"yardstick", "yardstick-sdpa-flash", "yardstick-cudnn"} | ({"yardstick-flash-attn-4"} if fa4 else set())
    assert {y.key for y in runs if y.measured} == want, [(y.key, y.reason) for y in runs]
    if not fa4:
        assert next(y for y in runs if y.key == "yardstick-flash-attn-4").reason_code == "unavailable"
    assert set(paired) == want and all(p is not None and p.against == incumbent.key for p in paired.values())
    for p in paired.values():  # the incumbent is torch SDPA: no yardstick is an order of magnitude off it
        assert 0.2 < p.t_candidate / p.t_incumbent < 5
    inputs, outputs = small_attention()
    save_kernel_bundle(tmp_path / "campaign" / "bundles" / "reference.bundle", spec=ref_spec, key=REFERENCE,
                       role="reference", blocks=blocks(10.0), inputs=inputs, outputs=outputs)
    off = OfflineWorkbench(tmp_path / "campaign", "attention", "bf16")
    assert [(y.key, y.blocks) for y in off.yardsticks(None, 5)] == [(y.key, y.blocks) for y in runs]
    for key, p in paired.items():
        back = off.pair_yardstick(incumbent, 5, key)
        assert (back.t_candidate, back.t_incumbent) == (p.t_candidate, p.t_incumbent)
