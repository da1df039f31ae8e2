"""The live workbench's CPU-testable parts: the child protocol (real child processes: failures, crashes,
timeouts with the whole process group killed), the bundle bookkeeping read back by the offline workbench,
PTX assembled into SASS for lifting, unbuildable candidates (rules, prefetched and not), a gate that fails at
run time (no GPU here) recorded so the offline re-decision reads the same verdict, the loop's prefetch hook.
Nothing here runs a kernel: GPU runs are in benchmarks/gemm_campaign.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mosaic.records import KernelSpec
from mosaic.run.campaign import Campaign
from mosaic.run.live.parent import LiveWorkbench, run_child, sass_from_ptx
from mosaic.run.offline import OfflineWorkbench
from mosaic.run.workbench import (
    REFERENCE,
    Kernel,
    add_session,
    candidate_key,
    run_meta,
    save_kernel_bundle,
    update_bundle,
)

CORPUS = Path(__file__).resolve().parent / "lift" / "corpus" / "artifacts"
SHAPE = {"m": 4096, "n": 4096, "k": 4096}
PY = [sys.executable, "-c"]


def campaign(**more) -> Campaign:
    return Campaign.from_json({"source": "pallas", "target": "cutlass", "family": "gemm",
                               "shape": "4096x4096x4096", "dtype": "bf16", "budget_min": 4, **more})


# -- the child protocol ---------------------------------------------------------------------------------------
def test_child_unknown_mode_is_a_recorded_failure():
    r = run_child({"mode": "warp-drive"}, 60)
    assert r.status == "failed" and "unknown mode 'warp-drive'" in r.message and "check, time" in r.message


def test_child_time_refuses_bad_sessions_and_fails_without_a_gpu_in_one_recorded_line():
    spec = KernelSpec("gemm", {"m": 64, "n": 64, "k": 64}, "bf16", "cublas", {})
    r = run_child({"mode": "time", "gpu": "h200", "specs": [spec.to_json()], "rounds": 1, "runs": 3}, 120)
    assert r.status == "failed"
    assert r.message == "a timing session takes exactly two kernels (incumbent, candidate) (specs)"
    r = run_child({"mode": "time", "gpu": "h200", "specs": [spec.to_json()] * 2, "rounds": 1, "runs": 3}, 120)
    assert r.status == "failed" and r.message and "\n" not in r.message  # no device here: recorded, one line
    other = KernelSpec("gemm", {"m": 64, "n": 64, "k": 32}, "bf16", "cublas", {})
    r = run_child({"mode": "time", "gpu": "h200", "specs": [spec.to_json(), other.to_json()], "rounds": 1,
                   "runs": 3}, 120)
    assert r.status == "failed" and "same problem" in r.message


def test_child_crash_and_timeout_kill_the_whole_group(tmp_path):
    r = run_child({"mode": "x"}, 60, argv=[*PY, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert r.status == "crashed" and r.message == "killed by signal 9"
    r = run_child({"mode": "x"}, 60, argv=[*PY, "import sys; sys.exit(3)"])
    assert r.status == "failed" and r.message == "exited with status 3 and no result"
    pidfile = tmp_path / "grandchild.pid"
    script = (f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
              f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    t0 = time.monotonic()
    r = run_child({"mode": "x"}, 3, argv=[*PY, script])
    assert r.status == "timeout" and r.message == "killed after 3 s" and time.monotonic() - t0 < 30
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    status = Path(f"/proc/{pid}/status")  # the grandchild died with its group (gone, or a zombie not yet reaped)
    assert not status.exists() or "\tZ" in next(ln for ln in status.read_text().splitlines()
                                                 if ln.startswith("State:"))


def test_child_result_must_be_a_status_object(tmp_path):
    script = "import json, sys; r = json.load(open(sys.argv[1]))['result']; open(r, 'w').write('[1, 2]')"
    r = run_child({"mode": "x"}, 60, argv=[*PY, script])
    assert r.status == "failed" and "no status" in r.message


def test_child_refuses_a_request_that_is_not_one(tmp_path):
    bad = tmp_path / "req.json"
    bad.write_text(json.dumps({"mode": "check"}))
    done = subprocess.run([sys.executable, "-m", "mosaic.run.live.child", str(bad)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a mosaic-live-request" in done.stderr


# -- bookkeeping the offline workbench reads --------------------------------------------------------------------
def _reference(root: Path, blocks) -> Path:
    """A reference bundle shaped as capture writes it: timings blocks as TimedRuns objects."""
    spec = KernelSpec("gemm", SHAPE, "bf16", "pallas", {})
    from mosaic.bundle import save_bundle

    timings = {"unit": "ns", "blocks": [{"times_ns": b, "source": "cupti"} for b in blocks]}
    save_bundle(root / "bundles" / "reference.bundle", kernel=spec, language="pallas",
                files={"kernel.sass": ("sass", CORPUS / "tma.sass"), "timings.json": ("timings", json.dumps(timings))},
                gpu="h200", extra={**run_meta(REFERENCE, "reference", cost_s=41.5),
                                   "capture": {"status": "ok", "summary": {"numerics_pass": True}}})
    return root / "bundles" / "reference.bundle"


def test_sessions_and_costs_read_back_by_the_offline_workbench(tmp_path):
    ref_blocks = [[172800 + 10 * i + j for j in range(5)] for i in range(10)]
    _reference(tmp_path, ref_blocks)
    spec = KernelSpec("gemm", SHAPE, "bf16", "cutlass", {"tile_n": 256})
    key = candidate_key(spec)
    dest = tmp_path / "bundles" / f"cand-{key}.bundle"
    save_kernel_bundle(dest, spec=spec, key=key, role="candidate", files={"kernel.sass": ("sass", CORPUS / "tma.sass")},
                       cost_s=12.0, gpu="h200")
    update_bundle(dest, extra={"capture": {"status": "ok", "summary": {"numerics_pass": True}}})
    s1 = {"against": REFERENCE, "order": "ABAB", "incumbent_blocks": [[173000, 173100]] * 3,
          "candidate_blocks": [[170000, 170500]] * 3}
    add_session(dest, s1, 7.25)
    s2 = {**s1, "against": "abc", "candidate_blocks": [[169000, 169100]] * 3}
    add_session(dest, s2, 6.0)
    add_session(dest, {**s2, "candidate_blocks": [[168000, 168100]] * 3}, 5.0)  # replaces the session vs abc

    bench = OfflineWorkbench(tmp_path, "gemm", "bf16")
    ref = bench.capture_reference(spec)
    assert [list(b) for b in ref.noise_blocks] == ref_blocks and ref.cost_s == 41.5
    built = bench.build(Kernel(key, spec))
    assert built.ok and built.cost_s == pytest.approx(12.0 + 7.25 + 6.0 + 5.0)
    checked = bench.check(Kernel(key, spec, bundle=built.bundle), built, Kernel(REFERENCE, spec))
    assert checked.passed and "recorded verdict" in checked.reason
    t = bench.time(Kernel(REFERENCE, spec), Kernel(key, spec), 5)
    assert t.source == "same-session" and t.t_candidate == 170250.0 and t.t_incumbent == 173050.0
    t = bench.time(Kernel("abc", spec), Kernel(key, spec), 5)
    assert t.t_candidate == 168050.0
    from mosaic.bundle import load_bundle

    timings = load_bundle(dest).read_json("timings")
    assert [s["against"] for s in timings["sessions"]] == [REFERENCE, "abc"]


def test_update_bundle_keeps_every_file_and_extra(tmp_path):
    root = _reference(tmp_path, [[1, 2, 3]] * 10)
    update_bundle(root, files={"note.txt": ("log", "hello")}, extra={"more": {"x": 1}})
    from mosaic.bundle import load_bundle

    b = load_bundle(root)  # verifies every SHA-256
    assert sorted(f.path for f in b.files) == ["kernel.sass", "note.txt", "timings.json"]
    assert b.manifest["mosaic_run"]["cost_s"] == 41.5 and b.manifest["more"] == {"x": 1}
    assert b.manifest["capture"]["status"] == "ok"
    update_bundle(root, drop=["note.txt"])
    assert "note.txt" not in {f.path for f in load_bundle(root).files}


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit) on PATH")
def test_reference_with_ptx_only_gets_assembled_sass_that_lifts(tmp_path):
    from mosaic.bundle import load_bundle, save_bundle
    from mosaic.lift.inputs import lift_bundle

    root = tmp_path / "ref.bundle"
    save_bundle(root, kernel=KernelSpec("gemm", SHAPE, "bf16", "pallas", {}), language="pallas",
                files={"kernel.ptx": ("ptx", CORPUS / "tma.ptx")}, gpu="h200")
    with pytest.raises(Exception, match="no SASS"):
        lift_bundle(root)
    note = sass_from_ptx(root, "sm_90a")
    assert note.startswith("SASS assembled from the captured PTX by")
    b = load_bundle(root)
    assert b.one("cubin") is not None and "UTMALDG" in b.read_text("sass")
    assert b.manifest["sass_from_ptx"]["arch"] == "sm_90a"
    fp = lift_bundle(root)
    assert fp is not None
    assert sass_from_ptx(root, "sm_90a") is None  # nothing left to do


# -- builds on this machine -------------------------------------------------------------------------------------
def _cutlass(knobs: dict) -> Kernel:
    from mosaic.plugins import host

    cls = host().get("languages", "cutlass").backend.knobs("gemm")
    import attrs

    full = attrs.asdict(cls(**knobs))
    spec = KernelSpec("gemm", SHAPE, "bf16", "cutlass", full)
    return Kernel(candidate_key(spec), spec)


def test_unbuildable_candidate_is_recorded_and_read_back_offline(tmp_path):
    lines: list[str] = []
    bench = LiveWorkbench(campaign(), tmp_path, progress=lines.append)
    k = _cutlass({"kernel_schedule": "cooperative", "tile_m": 64})  # rule CUTLASS-COOP-TILE, before nvcc
    built = bench.build(k)
    assert not built.ok and built.reason_code == "unbuildable" and "CUTLASS-COOP-TILE" in built.reason
    assert built.cost_s > 0 and any(line.startswith(f"build {k.key}") for line in lines)
    _reference(tmp_path, [[1, 2, 3]] * 10)
    off = OfflineWorkbench(tmp_path, "gemm", "bf16").build(k)
    assert (off.ok, off.reason_code, off.reason) == (False, "unbuildable", built.reason)
    assert off.cost_s == built.cost_s  # one figure, the bundle's, for live and offline


def test_prefetched_lowering_is_waited_for_and_moved_into_place(tmp_path, monkeypatch):
    """The lowering runs in the user cache's scratch and its bundle is moved into the campaign directory, which
    keeps no scratch; the scratch goes when the workbench closes."""
    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "campaign"
    bench = LiveWorkbench(campaign(), out, progress=lambda line: None)
    bad = _cutlass({"kernel_schedule": "pingpong", "epilogue_schedule": "tma-cooperative"})  # CUTLASS-EPILOGUE
    bench.prefetch([bad, Kernel("src", bad.spec, source="// edited")])  # a source edit is never prefetched
    assert list(bench.prefetching) == [bad.key]
    scratch = bench.work
    assert scratch.parent == tmp_path / "cache" / "scratch" and (scratch / "prefetch" / bad.key).is_dir()
    built = bench.build(bad)
    assert not built.ok and "CUTLASS-EPILOGUE" in built.reason and not bench.prefetching
    assert not (scratch / "prefetch" / bad.key).exists() and Path(built.bundle).is_dir()
    assert Path(built.bundle).parent == out / "bundles"
    assert sorted(p.name for p in out.iterdir()) == ["bundles"]  # no .work/, no scratch, no cache
    bench.close()
    assert not scratch.exists() and list((tmp_path / "cache" / "scratch").iterdir()) == []


def test_close_ends_background_lowerings(tmp_path):
    bench = LiveWorkbench(campaign(), tmp_path, progress=lambda line: None, parallel=1)
    a, b = _cutlass({"tile_n": 64}), _cutlass({"tile_n": 192})
    bench.prefetch([a, b])
    assert list(bench.prefetching) == [a.key]  # one at a time with parallel=1
    proc = bench.prefetching[a.key][0]
    bench.close()
    assert proc.poll() is not None and not bench.prefetching


def test_source_edit_is_recorded_unbuildable(tmp_path):
    bench = LiveWorkbench(campaign(), tmp_path)
    spec = _cutlass({}).spec
    k = Kernel(candidate_key(spec, "// new kernel"), spec, "// new kernel")
    built = bench.build(k)  # built by the kernel-file backend: a text without the file contract is unbuildable
    assert not built.ok and "no '// mosaic:entry" in built.reason
    _reference(tmp_path, [[1, 2, 3]] * 10)
    assert not OfflineWorkbench(tmp_path, "gemm", "bf16").build(k).ok


def test_gate_failing_at_run_time_is_never_passed_and_offline_agrees(tmp_path):
    """No GPU here: the gate's child fails for real (no CUDA device for torch); the verdict is recorded."""
    bench = LiveWorkbench(campaign(), tmp_path, progress=lambda line: None)
    spec = KernelSpec("gemm", {"m": 64, "n": 64, "k": 64}, "bf16", "cublas", {})
    k = Kernel(candidate_key(spec), spec)
    dest = bench.dest(k.key)
    save_kernel_bundle(dest, spec=spec, key=k.key, role="candidate", cost_s=1.0, gpu="h200")
    checked = bench._gate(k, dest)
    assert not checked.passed and "at run time" in checked.reason
    from mosaic.bundle import load_bundle

    b = load_bundle(dest)
    assert b.manifest["capture"]["summary"]["numerics_pass"] is False and b.one("log") is not None
    assert b.manifest["mosaic_run"]["cost_s"] > 1.0
    _reference(tmp_path, [[1, 2, 3]] * 10)
    off = OfflineWorkbench(tmp_path, "gemm", "bf16")
    assert not off.check(k, off.build(k), Kernel(REFERENCE, spec)).passed


# -- the loop hands what it will build next to the workbench ------------------------------------------------------
def test_loop_prefetches_the_naive_translation_and_upcoming_proposals(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    import run_fixture as rf
    from mosaic.run.journal import Journal
    from mosaic.run.loop import run_campaign

    src = rf.build_campaign(tmp_path / "c")

    class Recording(OfflineWorkbench):
        asked: list = []

        def prefetch(self, kernels):
            self.asked.append([k.key for k in kernels])

    bench = Recording(src, "gemm", "bf16")
    outcome = run_campaign(Campaign.from_json(dict(__import__("tomllib").loads(rf.CAMPAIGN_TOML))), bench,
                           Journal.create(tmp_path / "o"), quiet=True)
    events = [json.loads(line) for line in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()]
    naive = next(e["key"] for e in events if e["event"] == "proposal" and e["step"] == 0)
    assert bench.asked[0] == [naive]
    built = [e["key"] for e in events if e["event"] == "proposal" and e.get("ok") and e["step"] > 0]
    flat = {key for batch in bench.asked[1:] for key in batch}
    assert built and built[0] in flat and outcome.steps >= 1
    assert all(len(batch) <= 6 for batch in bench.asked)


def test_a_failed_reference_capture_stops_the_campaign_with_its_bundle_kept(tmp_path):
    """The reference capture (its own process, through mosaic.capture) fails for real; the bundle
    it leaves carries the loop's mosaic_run entry passed through capture's manifest extras."""
    from mosaic.bundle import load_bundle
    from mosaic.run.live.parent import LiveError

    lines: list[str] = []
    bench = LiveWorkbench(campaign(yardstick=False), tmp_path, progress=lines.append)
    spec = KernelSpec("gemm", {"m": 256, "n": 256, "k": 128}, "bf16", "cutlass", {"tile_m": 64})  # a rule rejects
    with pytest.raises(LiveError, match="the reference capture ended 'unbuildable': .*CUTLASS-COOP-TILE") as info:
        bench.capture_reference(spec)
    assert "\n" not in info.value.line() and lines[0].startswith("reference cutlass (tile_m=64): capture")
    b = load_bundle(tmp_path / "bundles" / "reference.bundle")
    assert b.manifest["mosaic_run"]["role"] == "reference" and b.manifest["capture"]["status"] == "unbuildable"


def test_campaign_benchmark_parses_and_its_summary_reads_a_journal(tmp_path):
    import tarfile

    sys.path.insert(0, str(Path(__file__).parent))
    import run_fixture as rf

    script = Path(__file__).resolve().parents[3] / "benchmarks" / "gemm_campaign.py"
    assert subprocess.run([sys.executable, str(script), "--help"], capture_output=True).returncode == 0
    import gemm_campaign as gc  # benchmarks/ is on pytest's pythonpath

    a = gc.parse_args([])
    assert a.target == "cute" and a.shape == "4096x4096x4096"
    cmd = " ".join(gc.campaign_command(a.target, a.shape, 3, 5, "worker", tmp_path / "d"))
    assert "--source pallas --target cute" in cmd and "--shape 4096x4096x4096" in cmd
    assert "--offline" in gc.offline_command(tmp_path / "d")
    (tmp_path / "d" / ".work").mkdir(parents=True)
    (tmp_path / "d" / ".work" / "scratch").write_text("x")
    (tmp_path / "d" / "report.md").write_text("r")
    assert gc.tar_campaign(tmp_path / "d", tmp_path / "d.tar.xz") == ""
    with tarfile.open(tmp_path / "d.tar.xz") as tar:
        assert tar.getnames() == ["d", "d/report.md"]  # an older campaign's .work/ scratch is excluded
    src = rf.build_campaign(tmp_path / "c")
    mosaic = str(Path(sys.executable).parent / "mosaic")
    subprocess.run([mosaic, "run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet"], check=True,
                   capture_output=True, timeout=300)
    done = "\n".join(gc.summary_lines(tmp_path / "o"))
    assert "stop: converged" in done and "cuBLAS (same run, alone): 168." in done


def test_campaign_benchmark_summary_names_every_part_of_a_compound_edit():
    import gemm_campaign as gc  # benchmarks/ is on pytest's pythonpath

    recorded = Path(__file__).resolve().parents[3] / "examples" / "h200-pallas-to-cutlass-gemm-8192"
    steps = [line for line in gc.summary_lines(recorded) if line.startswith("step 1 ")]
    # the H200's step 1 is ONE compound edit: the wider tile and its 2x1 multicast cluster partner
    assert len(steps) == 1 and "tile_n=256 + " in steps[0] and "cluster_m=2" in steps[0], steps


def test_campaign_benchmark_caps_the_whole_call_and_copies_the_journal_as_it_goes(tmp_path, monkeypatch):
    import gemm_campaign as gc  # benchmarks/ is on pytest's pythonpath

    # --total: the campaign's wall leaves room for the SIGINT grace, the offline cap and the tarball
    assert gc.campaign_wall(500, None, 3, 90) == 500
    assert gc.campaign_wall(500, 480, 10, 90) == 480 - 10 - gc.SIGINT_GRACE_S - 90 - gc.TAIL_S
    assert gc.campaign_wall(500, 100, 10, 90) == 0
    a = gc.parse_args(["--shape", "8192x8192x8192", "--total", "470", "--offline-timeout", "60"])
    assert (a.total, a.offline_timeout) == (470, 60)
    # a campaign that appends to its journal; the copy in $OUT follows it while it runs, and a SIGINT ends it
    d, out = tmp_path / "d", tmp_path / "out"
    d.mkdir()
    out.mkdir()
    child = ("import signal, sys, time, pathlib\n"
             "p = pathlib.Path(sys.argv[1]) / 'journal.jsonl'\n"
             "signal.signal(signal.SIGINT, lambda *a: (p.open('a').write('{\"event\": \"stop\"}\\n'), sys.exit(3)))\n"
             "for i in range(200):\n"
             "    p.open('a').write('{\"event\": \"step\", \"i\": %d}\\n' % i); time.sleep(0.05)\n")
    seen = []

    def every():
        gc.copy_journal(d, out / "journal.jsonl")
        seen.append(len((out / "journal.jsonl").read_text().splitlines()))

    monkeypatch.setattr(gc, "SNAPSHOT_EVERY_S", 0.2)
    rc = gc.run_capped([sys.executable, "-c", child, str(d)], 1.5, dict(os.environ), tmp_path / "o", tmp_path / "e",
                       every=every)
    assert rc == 124
    assert len(seen) >= 4 and seen == sorted(seen) and seen[0] < seen[-1]  # copied while it ran, growing
    final = (out / "journal.jsonl").read_text().splitlines()
    assert final == (d / "journal.jsonl").read_text().splitlines() and final[-1] == '{"event": "stop"}'
    assert not (out / "journal.jsonl.tmp").exists()
