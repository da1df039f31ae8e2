"""The live workbench's persistent worker, with real child processes (``mosaic.run.live.worker`` itself, and
``worker_script.py``: the same worker with test modes): several requests served by one pid, a crash, a
timeout (whole process group killed), a protocol error and a failed request each recorded and followed by a
fresh worker; a failure in a reused worker confirmed in a fresh one; a kernel prepared once per worker; the
gate's record says which isolation ran it; ``isolation = "step"`` keeps one process per request."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle
from mosaic.records import KernelSpec
from mosaic.run.campaign import Campaign
from mosaic.run.live.parent import LiveWorkbench
from mosaic.run.live.worker import Workers, WorkerState
from mosaic.run.offline import OfflineWorkbench
from mosaic.run.workbench import REFERENCE, Kernel, candidate_key, save_kernel_bundle

HERE = Path(__file__).resolve().parent
SCRIPT = [sys.executable, str(HERE / "worker_script.py")]
SMALL = KernelSpec("gemm", {"m": 64, "n": 32, "k": 48}, "bf16", "numpy", {})


def campaign(**more) -> Campaign:
    return Campaign.from_json({"source": "pallas", "target": "cutlass", "family": "gemm",
                               "shape": "4096x4096x4096", "dtype": "bf16", "budget_min": 4, **more})


def _gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")  # gone, or a zombie not yet reaped
    return not status.exists() or "\tZ" in next(ln for ln in status.read_text().splitlines()
                                                if ln.startswith("State:"))


@pytest.fixture
def workers(tmp_path):
    w = Workers(tmp_path / "w", argv=SCRIPT)
    yield w
    w.close()


def test_one_worker_serves_several_requests(tmp_path):
    w = Workers(tmp_path / "w")  # the real module: python -m mosaic.run.live.worker
    try:
        got = [w.serve({"mode": "ping"}, 120) for _ in range(3)]
        assert [r.status for r in got] == ["ok"] * 3
        pids = {r.isolation["pid"] for r in got}
        assert len(pids) == 1 and got[0].data["pid"] in pids and w.started == 1
        assert [r.isolation["request"] for r in got] == [1, 2, 3]
        assert all(r.isolation["mode"] == "worker" for r in got)
        bad = w.serve({"mode": "warp-drive"}, 120)  # a failed request: recorded, the worker replaced
        assert bad.status == "failed" and "unknown mode 'warp-drive'" in bad.message and w.current is None
        again = w.serve({"mode": "ping"}, 120)
        assert again.status == "ok" and again.isolation["pid"] not in pids and again.isolation["request"] == 1
    finally:
        w.close()
    assert _gone(again.isolation["pid"]) and w.retired[-1]["why"] == "closed"


def test_a_crash_mid_request_is_recorded_and_the_next_request_gets_a_new_worker(workers):
    first = workers.serve({"mode": "ping"}, 120)
    crashed = workers.serve({"mode": "crash"}, 120)
    assert crashed.status == "crashed" and crashed.message == "killed by signal 9"
    assert crashed.isolation["pid"] == first.isolation["pid"] and crashed.isolation["request"] == 2
    assert workers.retired[-1]["pid"] == first.isolation["pid"] and "crashed" in workers.retired[-1]["why"]
    nxt = workers.serve({"mode": "ping"}, 120)
    assert nxt.status == "ok" and nxt.isolation["pid"] != first.isolation["pid"] and nxt.isolation["request"] == 1


def test_a_timeout_kills_the_whole_group_and_is_recorded(workers, tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    workers.serve({"mode": "ping"}, 120)  # started and warm: the timeout is the request's own
    t0 = time.monotonic()
    r = workers.serve({"mode": "hang", "pidfile": str(pidfile)}, 3)
    assert r.status == "timeout" and r.message.startswith("killed after 3 s") and time.monotonic() - t0 < 30
    time.sleep(0.2)
    assert _gone(int(pidfile.read_text())) and _gone(r.isolation["pid"])  # the grandchild died with its group
    nxt = workers.serve({"mode": "ping"}, 120)
    assert nxt.status == "ok" and nxt.isolation["pid"] != r.isolation["pid"]


def test_a_protocol_error_replaces_the_worker(workers):
    r = workers.serve({"mode": "garble"}, 120)
    assert r.status == "failed" and r.message.startswith("protocol: an answer line is not JSON")
    assert workers.current is None and _gone(r.isolation["pid"])
    assert workers.serve({"mode": "ping"}, 120).isolation["pid"] != r.isolation["pid"]


def test_kernel_prepared_once_per_worker_and_reference_computed_once(workers, tmp_path):
    """The real capture path in the worker: a (failing) CPU kernel gated twice by the float64 oracle."""
    cache = tmp_path / "oracle"
    req = {"mode": "numpy_gate", "spec": SMALL.to_json(), "oracle_cache": str(cache)}
    a = workers.serve({**req, "out": str(tmp_path / "a.bundle")}, 120)
    b = workers.serve({**req, "out": str(tmp_path / "b.bundle")}, 120)
    assert a.isolation["pid"] == b.isolation["pid"]
    assert list(a.isolation["prepared"].values()) == ["compiled"] and list(b.isolation["prepared"].values()) == ["cached"]
    ra, rb = (r.data["capture"]["summary"]["oracle_reference"] for r in (a, b))
    assert (ra["source"], rb["source"]) == ("computed", "cache-memory") and ra["key_sha256"] == rb["key_sha256"]
    assert a.data["capture"]["status"] == b.data["capture"]["status"] == "numerics-failed"
    assert load_bundle(tmp_path / "a.bundle").read_json("metrics") == load_bundle(tmp_path / "b.bundle").read_json("metrics")
    assert "float64 reference cache-memory" in load_bundle(tmp_path / "b.bundle").read_text("log")
    workers.close()  # a fresh worker reads the reference from the campaign's cache directory
    c = workers.serve({**req, "out": str(tmp_path / "c.bundle")}, 120)
    assert c.data["capture"]["summary"]["oracle_reference"]["source"] == "cache-file"
    assert list(c.isolation["prepared"].values()) == ["compiled"]


def test_worker_state_caches_runnables_by_spec_and_inputs_and_closes_the_oldest():
    import numpy as np

    made, closed = [], []

    class R:
        def __init__(self, spec):
            self.spec = spec
            made.append(spec.knobs.get("t"))

        def close(self):
            closed.append(self.spec.knobs.get("t"))

    class Gpu:
        name = "h200"

    st = WorkerState(capacity=2)
    try:
        inputs = {"a": np.ones((2, 2), np.float32)}
        prep = lambda s, g, w, i: R(s)  # noqa: E731
        spec = lambda t: KernelSpec("gemm", {"m": 2, "n": 2, "k": 2}, "bf16", "x", {"t": t})  # noqa: E731
        st.runnable(spec(1), Gpu(), inputs, prepare=prep)
        r, _ = st.runnable(spec(1), Gpu(), inputs, prepare=prep)
        r.close()  # a request's close leaves it to the cache
        assert made == [1] and closed == []
        st.runnable(spec(1), Gpu(), {"a": np.zeros((2, 2), np.float32)}, prepare=prep)  # other inputs: other key
        st.runnable(spec(2), Gpu(), inputs, prepare=prep)
        assert made == [1, 1, 2] and closed == [1] and len(st.runnables) == 2
    finally:
        st.close()
    assert sorted(closed) == [1, 1, 2]


# -- the workbench ----------------------------------------------------------------------------------------------
def test_failure_in_a_reused_worker_is_confirmed_in_a_fresh_one(tmp_path):
    lines: list[str] = []
    bench = LiveWorkbench(campaign(), tmp_path, progress=lines.append, worker_argv=SCRIPT)
    try:
        def problem(r):
            return "" if r.status == "ok" else f"{r.status}: {r.message}"

        first = bench._serve({"mode": "ping"}, 120, problem, "ping")
        r = bench._serve({"mode": "flaky"}, 120, problem, "flaky")
        assert r.status == "ok" and r.isolation["pid"] != first.isolation["pid"] and r.isolation["request"] == 1
        fa = r.isolation["first_attempt"]
        assert fa["status"] == "failed" and "illegal memory access" in fa["problem"]
        assert fa["pid"] == first.isolation["pid"] and fa["request"] == 2 and r.wall_s > fa["wall_s"]
        assert any("in a reused worker" in line for line in lines)
        pidfile = tmp_path / "g.pid"  # a timeout is not asked again (it would cost the timeout twice)
        t = bench._serve({"mode": "hang", "pidfile": str(pidfile)}, 2, problem, "hang")
        assert t.status == "timeout" and "first_attempt" not in t.isolation and t.isolation["request"] == 2
    finally:
        bench.close()


def test_a_gate_failed_in_a_reused_worker_is_never_turned_into_a_pass_by_the_retry(tmp_path):
    lines: list[str] = []
    bench = LiveWorkbench(campaign(), tmp_path, progress=lines.append, worker_argv=SCRIPT)
    try:
        spec = KernelSpec("gemm", {"m": 64, "n": 64, "k": 64}, "bf16", "cublas", {})
        k = Kernel(candidate_key(spec), spec)
        save_kernel_bundle(bench.dest(k.key), spec=spec, key=k.key, role="candidate", cost_s=1.0, gpu="h200")
        bench._serve({"mode": "ping"}, 120, lambda r: "", "ping")  # the worker has served a request before
        real = bench._serve  # the gate's request goes to the script's flaky stand-in for child_check

        def as_flaky(request, *a, **kw):
            return real({**request, "mode": "flaky_check"} if request.get("mode") == "check" else request, *a, **kw)

        bench._serve = as_flaky
        checked = bench._gate(k, bench.dest(k.key))
    finally:
        bench.close()
    assert not checked.passed
    assert "failed the gate in a reused worker" in checked.reason and "passed in a fresh one" in checked.reason
    cap = load_bundle(bench.dest(k.key)).manifest["capture"]
    assert cap["summary"]["numerics_pass"] is False and cap["isolation"]["first_attempt"]["request"] == 2
    assert any("in a reused worker" in line for line in lines)


@pytest.mark.parametrize("isolation", ["worker", "step"])
def test_gate_records_its_isolation_and_a_failed_gate_gets_a_new_worker(tmp_path, isolation, monkeypatch):
    """No GPU here: the gate fails for real (torch has no CUDA); recorded, and offline reads the verdict. The gate's
    scratch is in the user cache, removed at close: the campaign directory keeps bundles and worker logs only."""
    cache = tmp_path.parent / f"{tmp_path.name}-cache"
    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(cache))
    bench = LiveWorkbench(campaign(isolation=isolation), tmp_path, progress=lambda line: None)
    pids = []
    try:
        for n in (64, 128):
            spec = KernelSpec("gemm", {"m": n, "n": n, "k": n}, "bf16", "cublas", {})
            k = Kernel(candidate_key(spec), spec)
            save_kernel_bundle(bench.dest(k.key), spec=spec, key=k.key, role="candidate", cost_s=1.0, gpu="h200")
            checked = bench._gate(k, bench.dest(k.key))
            assert not checked.passed and "at run time" in checked.reason
            cap = load_bundle(bench.dest(k.key)).manifest["capture"]
            iso = cap["isolation"]
            assert iso["mode"] == isolation and iso["request"] == 1 and cap["summary"]["numerics_pass"] is False
            pids.append(iso["pid"])
            assert bench._gate_note.startswith(f"{cap['wall_s']:.1f} s, ")
            assert bench.work.parent == cache / "scratch"
    finally:
        bench.close()
    assert pids[0] != pids[1] and all(_gone(p) for p in pids)
    assert list((cache / "scratch").iterdir()) == []  # the scratch went with the workbench
    assert sorted(p.name for p in tmp_path.iterdir()) == (["bundles", "logs"] if isolation == "worker" else ["bundles"])
    if isolation == "worker":
        logs = {p.name for p in (tmp_path / "logs").iterdir()}  # (a replacement worker starts before it is asked)
        assert {"worker-1.log", "worker-2.log"} <= logs and all(n.startswith("worker-") for n in logs)
        assert [r["pid"] for r in bench.workers.retired[:2]] == pids
        assert all("the gate ended 'failed'" in r["why"] for r in bench.workers.retired[:2])
    from mosaic.bundle import save_bundle

    save_bundle(tmp_path / "bundles" / "reference.bundle", kernel=KernelSpec("gemm", {"m": 64, "n": 64, "k": 64},
                "bf16", "pallas", {}), language="pallas", files={}, gpu="h200",
                extra={"mosaic_run": {"key": REFERENCE, "role": "reference", "build": {"ok": True}, "cost_s": 1.0}})
    off = OfflineWorkbench(tmp_path, "gemm", "bf16")
    assert not off.check(k, off.build(k), Kernel(REFERENCE, spec)).passed


def test_isolation_setting_flag_toml_and_campaign_json(tmp_path):
    assert campaign().isolation == "worker" and campaign(isolation="step").to_json()["isolation"] == "step"
    mosaic = str(Path(sys.executable).parent / "mosaic")
    done = subprocess.run([mosaic, "run", "--source", "pallas", "--target", "cute", "--family", "gemm", "--shape",
                           "64x64x64", "--dtype", "bf16", "--isolation", "thread"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "isolation='thread' is invalid" in done.stderr and "worker, step" in done.stderr
    toml = tmp_path / "c.toml"
    toml.write_text('source = "pallas"\ntarget = "cute"\nfamily = "gemm"\nshape = "64x64x64"\ndtype = "bf16"\n'
                    'isolation = "sandbox"\n')
    done = subprocess.run([mosaic, "run", str(toml)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "isolation='sandbox' is invalid" in done.stderr
    c = Campaign.from_json(json.loads(json.dumps(campaign(isolation="step").to_json())))
    assert c.isolation == "step"
