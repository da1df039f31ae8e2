"""The final incumbent is timed against the yardstick in interleaved rounds: the report's fraction of cuBLAS then
compares two kernels in one thermal/power state (a power-capped GPU moves a kernel's time by several percent
between moments), beside the standalone capture's figure. A recording without the pairing never gets one
invented from the two standalone captures."""

import json
from types import SimpleNamespace

import numpy as np
from mosaic.plugins import host
from mosaic.records import KernelSpec
from mosaic.run.campaign import Campaign
from mosaic.run.journal import Journal, read_campaign_journal
from mosaic.run.loop import Loop
from mosaic.run.replay import Recorded, ReplayBench
from mosaic.run.report import build_report, to_markdown
from mosaic.run.workbench import (
    YARDSTICK,
    Built,
    Checked,
    Kernel,
    ReferenceCapture,
    Timed,
    save_kernel_bundle,
)

#: device time in us; "hot" is what the two kernels measure when the GPU runs at its power cap (both slower)
US = {"ref": 200.0, "naive": 199.0, "cublas": 180.0}
HOT = {"naive": 210.0, "cublas": 205.0}


def name(kernel):
    return kernel.spec.knobs.get("name", "ref")


def blocks(us):
    return [[us * 1e3 * (1 + 1e-4 * i)] * 5 for i in range(10)]


class Bench:
    kind = "offline"

    def __init__(self, pairs=True):
        self.paired = []
        if not pairs:
            self.pair_yardstick = None

    def capture_reference(self, spec):
        return ReferenceCapture(Kernel("reference", spec, bundle="ref"), blocks(US["ref"]))

    def build(self, kernel):
        return Built(kernel.key, True, bundle=name(kernel))

    def check(self, kernel, built, reference):
        return Checked(kernel.key, True)

    def time(self, incumbent, kernel, rounds):
        return Timed(kernel.key, incumbent.key, blocks(US.get(name(incumbent), US["ref"])), blocks(US[name(kernel)]),
                     cost_s=1.0)

    def yardstick(self, spec, rounds):
        return blocks(US["cublas"])  # captured alone, at the start: the cool GPU

    def pair_yardstick(self, kernel, rounds):
        self.paired.append(kernel.key)
        return Timed(YARDSTICK, kernel.key, blocks(HOT[name(kernel)]), blocks(HOT["cublas"]), cost_s=2.5)


class Nothing:
    name = "nothing"

    def propose(self, request):
        return []


def campaign():
    return Campaign(source="pallas", target="cute", family="gemm", shape={"m": 4096, "n": 4096, "k": 4096},
                    dtype="bf16", gpu="h200", start_knobs={"name": "naive"})


def run(tmp_path, bench):
    loop = Loop(campaign(), bench, Nothing(), Journal(tmp_path / "journal.jsonl"), host().get("gpus", "h200"),
                lift=lambda bundle: bundle, diff=lambda ref, fp: SimpleNamespace(layers=(("all", 1.0),), rows=()))
    return loop, loop.run()


def test_the_final_incumbent_is_paired_with_the_yardstick_and_the_report_prints_both_fractions(tmp_path):
    bench = Bench()
    loop, out = run(tmp_path, bench)
    assert out.stop == "converged"
    inc = loop.incumbent.kernel.key
    assert bench.paired == [inc]  # once, the final incumbent
    events, _ = read_campaign_journal(tmp_path / "journal.jsonl")  # the schema accepts the new field
    stop = next(e for e in events if e["event"] == "stop")
    assert stop["yardstick_paired"]["t_yardstick_ns"] == Timed(YARDSTICK, inc, [], blocks(205.0)).t_candidate
    assert stop["yardstick_paired"]["t_incumbent_ns"] == Timed(YARDSTICK, inc, blocks(210.0), []).t_incumbent
    pair_timed = [e for e in events if e["event"] == "timed" and e["key"] == YARDSTICK]
    assert [e["against"] for e in pair_timed] == [inc]
    assert abs(stop["cost_s"] - loop.cost_s) < 1e-9 and loop.cost_s >= 2.5  # its device time is counted
    rep = build_report(events)
    f = rep["final"]
    assert abs(f["fraction_of_yardstick"] - 180.0 / 199.0) < 1e-3  # standalone capture vs the incumbent's pairing
    assert abs(f["yardstick_paired"]["fraction"] - 205.0 / 210.0) < 1e-3
    md = to_markdown(rep)
    assert "timed alone" in md and "97.6% paired" in md
    assert "Yardstick paired with the final incumbent (interleaved rounds)" in md
    # the verdict row of the incumbent still shows its own comparison (not the yardstick pairing)
    naive = next(e for e in rep["edits"] if e["key"] == inc)
    assert abs(naive["t_candidate_ns"] - Timed(inc, "r", [], blocks(199.0)).t_candidate) < 1


def test_a_workbench_that_cannot_pair_leaves_the_stop_without_it(tmp_path):
    loop, _ = run(tmp_path, Bench(pairs=False))
    stop = next(e for e in loop.events if e["event"] == "stop")
    assert "yardstick_paired" not in stop
    rep = build_report(loop.events)
    assert "yardstick_paired" not in rep["final"] and "paired" not in to_markdown(rep).split("## Edits")[0]


def test_resume_replays_the_pairing_from_the_journal(tmp_path):
    bench = Bench()
    loop, _ = run(tmp_path, bench)
    events = loop.events
    inc = loop.incumbent.kernel
    replay = ReplayBench(Bench(pairs=False), Recorded(events))
    got = replay.pair_yardstick(inc, 10)
    assert got is not None and (got.key, got.against) == (YARDSTICK, inc.key) and got.t_incumbent == Timed(
        YARDSTICK, inc.key, blocks(210.0), []).t_incumbent
    fresh = ReplayBench(Bench(pairs=False), Recorded([]))  # nothing recorded, an inner that cannot pair
    assert fresh.pair_yardstick(inc, 10) is None


def test_the_offline_workbench_reads_only_a_recorded_pairing(tmp_path):
    from mosaic.run.offline import OfflineWorkbench

    spec = KernelSpec(family="gemm", shape={"m": 64, "n": 64, "k": 64}, dtype="bf16", language="cute", knobs={})
    ref_spec = KernelSpec(family="gemm", shape={"m": 64, "n": 64, "k": 64}, dtype="bf16", language="pallas",
                          knobs={})
    yard_spec = KernelSpec(family="gemm", shape={"m": 64, "n": 64, "k": 64}, dtype="bf16", language="cublas",
                           knobs={})
    z = np.zeros((2, 2), np.float32)
    root = tmp_path / "bundles"
    save_kernel_bundle(root / "reference.bundle", spec=ref_spec, key="reference", role="reference",
                       blocks=blocks(200.0), inputs={"a": z}, outputs={"c": z})
    session = {"against": "paired", "order": "ABAB", "incumbent_blocks": blocks(210.0),
               "candidate_blocks": blocks(205.0), "wall_s": 2.5}
    save_kernel_bundle(root / "cublas.bundle", spec=yard_spec, key=YARDSTICK, role="yardstick", blocks=blocks(180.0),
                       sessions=[session])
    save_kernel_bundle(root / "paired.bundle", spec=spec, key="paired", role="candidate", blocks=blocks(199.0),
                       sessions=[{**session, "against": "reference"}], outputs={"c": z})
    save_kernel_bundle(root / "alone.bundle", spec=spec, key="alone", role="candidate", blocks=blocks(199.0),
                       sessions=[{**session, "against": "reference"}], outputs={"c": z})
    wb = OfflineWorkbench(tmp_path, "gemm", "bf16")
    got = wb.pair_yardstick(Kernel("paired", spec), 10)
    assert got is not None and got.source == "same-session" and (got.key, got.against) == (YARDSTICK, "paired")
    assert got.t_candidate == Timed("x", "y", [], blocks(205.0)).t_candidate
    assert got.cost_s == 2.5  # in no candidate bundle's cost: the re-decision's device minutes count it here
    # both kernels have standalone blocks, but no session between them: no pairing is made up from them
    assert wb.pair_yardstick(Kernel("alone", spec), 10) is None
    assert json.loads((root / "paired.bundle" / "manifest.json").read_text())["mosaic_run"]["key"] == "paired"
