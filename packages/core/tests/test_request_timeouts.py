"""Per-request limits of the live workbench, with real child processes (``worker_script.py``: the live worker
with test modes): a gate's limit is scaled from the gates measured in this campaign, a gate that runs past it
is killed (its whole process group), recorded as a failed gate 'hang: killed after N s' and the worker
replaced; a gate that would outlive the device-minute budget is cut at the budget."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle
from mosaic.records import KernelSpec
from mosaic.run.campaign import Campaign
from mosaic.run.live.parent import LiveError, LiveWorkbench, Timeouts
from mosaic.run.workbench import Kernel, candidate_key, save_kernel_bundle

HERE = Path(__file__).resolve().parent
SCRIPT = [sys.executable, str(HERE / "worker_script.py")]


def campaign(**more) -> Campaign:
    return Campaign.from_json({"source": "pallas", "target": "cutlass", "family": "gemm",
                               "shape": "4096x4096x4096", "dtype": "bf16", "budget_min": 4, **more})


def _gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "\tZ" in next(ln for ln in status.read_text().splitlines()
                                                if ln.startswith("State:"))


def test_scaled_limits():
    t = Timeouts()
    assert t.scaled("check", {}) == (300.0, "the cap (nothing measured yet)")
    assert t.scaled("check", {"reference": [40.0]})[0] == 200.0  # 5 x the reference before any gate
    limit, why = t.scaled("check", {"reference": [40.0], "check": [20.2, 19.4, 20.0]})
    assert limit == pytest.approx(101.0) and "slowest gate" in why and "20.2" in why
    assert t.scaled("check", {"check": [3.0]}) == (60.0, "the floor (60 s; 5 x the slowest gate so far (3.0 s) "
                                                         "is 15.0 s)")
    assert t.scaled("check", {"check": [100.0]}) == (300.0, "the cap (300 s)")
    assert t.scaled("time", {"check": [20.0], "time": [2.3]})[0] == 60.0  # timing scales from timing only
    assert Timeouts(check=30.0).scaled("check", {"reference": [40.0]})[0] == 30.0


def _candidate(bench, n, cost_s=1.0):
    spec = KernelSpec("gemm", {"m": n, "n": n, "k": n}, "bf16", "cublas", {})
    k = Kernel(candidate_key(spec), spec)
    save_kernel_bundle(bench.dest(k.key), spec=spec, key=k.key, role="candidate", cost_s=cost_s, gpu="h200")
    return k


def _route(bench, mode, **more):
    """Send the gate's check request to one of worker_script's stand-ins (the child_check needs a GPU), and its
    other cases to the stand-in gemm computed on the CPU."""
    real = bench._serve

    def routed(request, *a, **kw):
        if request.get("mode") == "cases":
            return real({**request, "mode": "numpy_cases"}, *a, **kw)
        return real({**request, "mode": mode, **more} if request.get("mode") == "check" else request, *a, **kw)

    bench._serve = routed


def test_a_hanging_gate_is_killed_at_the_scaled_limit_recorded_and_the_worker_replaced(tmp_path):
    lines: list[str] = []
    bench = LiveWorkbench(campaign(), tmp_path, progress=lines.append, worker_argv=SCRIPT,
                          timeouts=Timeouts(floor=2.0, factor=5.0))
    try:
        good = _candidate(bench, 64)
        _route(bench, "flaky_check")  # passes in a worker's first request
        assert bench._gate(good, bench.dest(good.key)).passed
        assert len(bench.seen["check"]) == 1 and bench.seen["check"][0] < 60
        expected = max(2.0, 5.0 * bench.seen["check"][0])
        bad = _candidate(bench, 128)
        pidfile = tmp_path / "hang.pid"
        bench._serve = LiveWorkbench._serve.__get__(bench)
        _route(bench, "hang", pidfile=str(pidfile))
        t0 = time.monotonic()
        checked = bench._gate(bad, bench.dest(bad.key))
        took = time.monotonic() - t0
        assert not checked.passed
        assert checked.reason.startswith(f"hang: killed after {expected:.0f} s (")
        assert "5 x the slowest gate so far" in checked.reason  # as the limit or under the 2 s floor
        assert expected - 0.5 <= took < expected + 30  # killed at the limit, not at the 300 s cap nor 60 s sleep
        assert _gone(int(pidfile.read_text()))  # the hanging request's own child went with the process group
        cap = load_bundle(bench.dest(bad.key)).manifest["capture"]
        assert cap["status"] == "timeout" and cap["summary"]["numerics_pass"] is False
        assert cap["timeout"]["s"] == pytest.approx(expected, abs=1e-3) and cap["timeout"]["budget"] is False
        assert bench.seen["check"] == bench.seen["check"][:1]  # a killed request does not raise the limit
        hung_pid = cap["isolation"]["pid"]
        assert bench.workers.retired[-1]["pid"] == hung_pid
        # the campaign goes on: the next gate runs in a fresh worker
        bench._serve = LiveWorkbench._serve.__get__(bench)
        _route(bench, "flaky_check")
        nxt = _candidate(bench, 32)
        assert bench._gate(nxt, bench.dest(nxt.key)).passed
        iso = load_bundle(bench.dest(nxt.key)).manifest["capture"]["isolation"]
        assert iso["pid"] != hung_pid and iso["request"] == 1
    finally:
        bench.close()


def test_a_gate_is_cut_at_the_device_budget(tmp_path):
    # 0.1 device minutes = 6 s; the candidate's bundle has spent 2 s of them: the gate gets 4 s, not 60
    bench = LiveWorkbench(campaign(budget_min=0.1), tmp_path, progress=lambda line: None, worker_argv=SCRIPT)
    try:
        k = _candidate(bench, 64, cost_s=2.0)
        assert bench.spent_s() == pytest.approx(2.0)
        _route(bench, "hang", pidfile=str(tmp_path / "h.pid"))
        t0 = time.monotonic()
        checked = bench._gate(k, bench.dest(k.key))
        took = time.monotonic() - t0
        # the yardstick's pairing at the stop is not cut by the budget: its own timeout, not what is left
        timing_cut, pairing = bench._limit("time"), bench._limit("time", budgeted=False)
    finally:
        bench.close()
    assert not checked.passed and checked.reason.startswith("budget: killed after 4 s, what is left of the 0.1 "
                                                            "device-minute budget")
    assert checked.judged is False  # no verdict on the kernel: the loop records it 'unjudged', not 'numerics'
    assert timing_cut[2] is True and pairing[2] is False and pairing[0] > timing_cut[0]
    assert 3.5 <= took < 30
    meta = load_bundle(bench.dest(k.key)).manifest
    assert meta["capture"]["timeout"]["budget"] is True
    # the gate's seconds are in the bundle: the loop, adding them, is at the budget and stops on it
    assert meta["mosaic_run"]["cost_s"] >= 0.1 * 60 - 0.5


def test_the_gates_other_cases_cut_at_the_device_budget_are_unjudged_live_and_offline(tmp_path):
    # 0.1 device minutes = 6 s; the gate's capture passes (a stand-in), then its other cases hang past the budget
    bench = LiveWorkbench(campaign(budget_min=0.1), tmp_path, progress=lambda line: None, worker_argv=SCRIPT)
    try:
        k = _candidate(bench, 64, cost_s=2.0)
        real = bench._serve

        def routed(request, *a, **kw):
            mode = {"check": "flaky_check", "cases": "hang"}.get(request.get("mode"), request.get("mode"))
            return real({**request, "mode": mode, "pidfile": str(tmp_path / "h.pid")}, *a, **kw)

        bench._serve = routed
        checked = bench._gate(k, bench.dest(k.key))
    finally:
        bench.close()
    assert not checked.passed and checked.judged is False
    assert checked.reason.startswith("budget: killed after ") and "other cases in flight" in checked.reason
    cap = load_bundle(bench.dest(k.key)).manifest["capture"]
    assert cap["status"] == "timeout" and cap["timeout"]["budget"] is True
    assert cap["summary"]["gate_cases"]["passed"] is None
    from mosaic.bundle import save_bundle
    from mosaic.run.offline import OfflineWorkbench
    from mosaic.run.workbench import REFERENCE

    save_bundle(tmp_path / "bundles" / "reference.bundle", kernel=k.spec, language="cublas", files={}, gpu="h200",
                extra={"mosaic_run": {"key": REFERENCE, "role": "reference", "build": {"ok": True}, "cost_s": 1.0}})
    off = OfflineWorkbench(tmp_path, "gemm", "bf16")
    again = off.check(k, off.build(k), Kernel(REFERENCE, k.spec))
    assert not again.passed and again.judged is False


def test_a_hanging_timing_session_is_killed_at_its_limit(tmp_path):
    bench = LiveWorkbench(campaign(), tmp_path, progress=lambda line: None, worker_argv=SCRIPT,
                          timeouts=Timeouts(floor=2.0, time=2.0))
    try:
        real = bench._serve
        bench._serve = lambda request, *a, **kw: real({"mode": "hang", "pidfile": str(tmp_path / "t.pid")},
                                                      *a, **kw)
        ref = _candidate(bench, 64)
        cand = _candidate(bench, 128)
        with pytest.raises(LiveError, match=r"hang: timing .* killed after 2 s \(the cap"):
            bench.time(ref, cand, 5)
    finally:
        bench.close()


def test_a_resumed_campaign_scales_from_the_gates_its_bundles_recorded(tmp_path):
    from mosaic.run.workbench import update_bundle

    first = LiveWorkbench(campaign(), tmp_path, progress=lambda line: None, worker_argv=SCRIPT)
    try:
        done = _candidate(first, 64)
        update_bundle(first.dest(done.key), extra={"capture": {"gate": True, "status": "ok", "wall_s": 31.0}})
        hung = _candidate(first, 128)  # a killed gate says nothing about how long a gate takes
        update_bundle(first.dest(hung.key), extra={"capture": {"gate": True, "status": "timeout", "wall_s": 300.0}})
        lowered = _candidate(first, 32)  # lowered, never gated
        update_bundle(first.dest(lowered.key), extra={"capture": {"gate": False, "status": "lowered", "wall_s": 9.0}})
    finally:
        first.close()
    again = LiveWorkbench(campaign(), tmp_path, progress=lambda line: None, worker_argv=SCRIPT)
    try:
        limit, why, by_budget = again._limit("check")
    finally:
        again.close()
    assert again.seen == {"check": [31.0]}
    assert (limit, by_budget) == (155.0, False) and why == "5 x the slowest gate so far (31.0 s)"


def budget_campaign(tmp_path, **live_options):
    """The recorded campaign (run_fixture's bundles: reference 30 s, each candidate 6 s) at a 0.75 device-minute
    budget, and a workbench over its bundles whose gates after the naive step are asked of a real LiveWorkbench
    with a hanging worker: (campaign, workbench, the live workbench to close)."""
    import shutil
    import tomllib

    import attrs
    sys.path.insert(0, str(HERE))
    import run_fixture as rf
    from mosaic.run.offline import OfflineWorkbench
    from mosaic.run.workbench import REFERENCE

    toml = rf.CAMPAIGN_TOML.replace("budget_min = 10.0", "budget_min = 0.75")
    src = rf.build_campaign(tmp_path / "recorded", toml=toml)
    c = Campaign.from_json(dict(tomllib.loads(toml)))
    live = LiveWorkbench(c, tmp_path / "live", **{"progress": lambda line: None, "worker_argv": SCRIPT,
                                                  **live_options})
    _route(live, "hang", pidfile=str(tmp_path / "g.pid"))

    class GateInAWorker(OfflineWorkbench):
        naive = None

        def capture_reference(self, spec):
            r = super().capture_reference(spec)
            shutil.copytree(r.kernel.bundle, live.dest(REFERENCE))  # what the live bench counts as spent
            return r

        def build(self, kernel):
            b = super().build(kernel)
            self.naive = self.naive or kernel.key
            if b.bundle:
                shutil.copytree(b.bundle, live.dest(kernel.key))
            return b

        def check(self, kernel, built, reference):
            if kernel.key == self.naive:
                return super().check(kernel, built, reference)
            before = live.cost(kernel.key)
            checked = live._gate(kernel, live.dest(kernel.key))
            return attrs.evolve(checked, cost_s=live.cost(kernel.key) - before)

    return c, GateInAWorker(src, "gemm", "bf16"), live


def test_the_loop_stops_on_budget_when_a_gate_in_flight_is_cut_by_it(tmp_path):
    """The convergence loop over budget_campaign: at step 1's gate 42 s of the 45 s are spent, so the gate gets
    3 s, is killed, and the loop stops on 'budget' with step 1 recorded as a failed gate that says why."""
    import json

    from mosaic.run.journal import Journal
    from mosaic.run.loop import run_campaign

    c, bench, live = budget_campaign(tmp_path)

    try:
        outcome = run_campaign(c, bench, Journal.create(tmp_path / "out"), quiet=True)
    finally:
        live.close()
    events = [json.loads(line) for line in (tmp_path / "out" / "journal.jsonl").read_text().splitlines()]
    stop = next(e for e in events if e["event"] == "stop")
    assert outcome.stop == "budget" and stop["stop"] == "budget" and stop["cost_s"] >= 45.0
    verdicts = [e for e in events if e["event"] == "verdict"]
    assert [v["step"] for v in verdicts] == [0, 1]
    # no verdict on the kernel's numerics: not judged, and not a numerics failure (test_budget_cut.py)
    assert verdicts[1]["decision"] == "unjudged" and verdicts[1]["reason_code"] == "budget"
    assert "budget: killed after 3 s, what is left of the 0.75 device-minute budget" in verdicts[1]["reason"]
