#!/usr/bin/env python3
"""ONE live convergence campaign on the lent Hopper GPU, Pallas -> CuTe (--target cutlass for CUTLASS), bf16 GEMM (--shape,
default 4096x4096x4096; --family attention --dtype f16 for another family), with the command users type (`mosaic run ...`), then `mosaic run --offline` on its directory,
which must reproduce every verdict from the bundles alone. Prints the journal's summary (reference, cuBLAS, every
build and verdict, the stop, each candidate's cost and isolation record) and writes it with the exit codes to --json.

From the repository root, after ../shared/device/stage-gpu-wheels.sh (cupti-python + CUTLASS headers; a PYTHONPATH in
/tmp/site/.pythonpath is used) and `pip install --no-deps --no-build-isolation -e packages/core -e packages/gpu-hopper
-e packages/target-pallas -e packages/target-cutlass -e packages/target-cute`:

    python3 benchmarks/gemm_campaign.py [--target cute] [--shape MxNxK] [--wall 270] [--total S]
                                        [--budget-min 3] [--max-candidates 5] [--offline-timeout 90]
                                        [--isolation worker|step] [--json PATH]

--isolation step runs the one-process-per-request workbench instead of the persistent worker (for comparison).
Wall time: the campaign is capped by --wall (default 270 s: SIGINT, the campaign writes its report, a kill 30 s
later), then the offline re-decision (capped by --offline-timeout) and the tarball. --total S caps the whole script
at S seconds from its start: the campaign's wall becomes at most S - 30 (SIGINT grace) - --offline-timeout - 20
(tar, summary), so a device call of S + setup seconds ends with everything written. An 8192^3 campaign on the H200
(session 8): reference capture + cuBLAS ~95 s, the naive translation ~35 s, then ~22 s per timed candidate (gate
~20 s, timing ~2.3 s); nvcc/CuTe lowerings run ahead in the background.

Writes next to the JSON (in $OUT by default), at most 7 files (the device tool returns 8):
  run.log, run.stdout  progress lines and the campaign's stdout, written as the campaign runs
  journal.jsonl        the campaign's journal, copied every 10 s while it runs (what is left if the call is cut)
  campaign.tar.xz      the campaign directory: report.md/.html/.json, journal.jsonl, campaign.json, offline.txt,
                       bundles/*.bundle (4096^3 outputs kept by SHA-256), offline/ (the re-decision); without PTX
                       when it would exceed 16 MB
  report.md, summary.txt, gemm_campaign.json (args, exit codes, the summary, seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from _device import add_json, json_path, nvidia_smi, write_json

MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
TAR_LIMIT = 16_000_000


def campaign_command(target: str, shape: str, budget_min: float, max_candidates: int, isolation: str,
                     out: Path, family: str = "gemm", dtype: str = "bf16") -> list[str]:
    return [*MOSAIC, "run", "--source", "pallas", "--target", target, "--family", family, "--shape", shape,
            "--dtype", dtype, "--budget-min", str(budget_min), "--max-candidates",  # the detected GPU's record
            str(max_candidates), "--isolation", isolation, "--out", str(out)]


def offline_command(directory: Path) -> list[str]:
    return [*MOSAIC, "run", "--offline", str(directory), "--out", str(directory / "offline"), "--quiet"]


def environment(target: str) -> dict:
    """The staging's PYTHONPATH and the campaign's environment defaults (the caller's settings win)."""
    env = dict(os.environ)
    site = Path("/tmp/site/.pythonpath")
    if site.is_file():
        env["PYTHONPATH"] = site.read_text().strip() + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
    env.setdefault("MOSAIC_CUTLASS_INCLUDE", "/tmp/site/cutlass_library/source/include")
    env.setdefault("MOSAIC_CACHE_DIR", "/tmp/mosaic-cache")
    env.setdefault("MOSAIC_LOAD_PLUGINS", f"hopper,pallas,{target}")
    env.setdefault("MOSAIC_NVCC_TIMEOUT", "240")
    return env


SIGINT_GRACE_S = 30  # after SIGINT the campaign writes its report; then it is killed
TAIL_S = 20  # tarball and summary after the offline re-decision
SNAPSHOT_EVERY_S = 10


def run_capped(cmd: list[str], wall: float, env: dict, stdout: Path, stderr: Path,
               every: Callable[[], None] | None = None) -> int:
    """Run ``cmd`` with a wall cap: SIGINT at ``wall`` seconds (the campaign stops and writes its report), a kill
    30 s later. ``every`` is called every 10 s while it runs (and once at the end)."""
    deadline = time.monotonic() + wall
    with stdout.open("w") as out, stderr.open("w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        try:
            while True:
                try:
                    return p.wait(timeout=max(0.0, min(SNAPSHOT_EVERY_S, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    if every is not None:
                        every()
                    if time.monotonic() >= deadline:
                        break
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=SIGINT_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            return 124
        finally:
            if every is not None:
                every()


def copy_journal(d: Path, dest: Path) -> None:
    """The campaign's journal as it stands (a copy through a temporary name: never half a file in ``dest``)."""
    src = d / "journal.jsonl"
    if src.is_file():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)


def campaign_wall(wall: float, total: float | None, elapsed: float, offline_timeout: float) -> float:
    """The campaign's wall cap: ``wall``, or less so that the whole script ends within ``total`` seconds."""
    if total is None:
        return wall
    return max(0.0, min(wall, total - elapsed - SIGINT_GRACE_S - offline_timeout - TAIL_S))


def summary_lines(d: Path) -> list[str]:
    """The campaign's journal read back: reference, cuBLAS, builds, verdicts, stop; per candidate bundle what its
    cost was spent on and which process ran its gate and timings (isolation records)."""
    try:
        events = [json.loads(x) for x in (d / "journal.jsonl").read_text().splitlines() if x.strip()]
    except OSError as exc:
        return [f"no journal: {exc}"]

    def us(v):
        return f"{v / 1e3:.2f}" if isinstance(v, int | float) else "-"

    lines = []
    for e in events:
        if e["event"] == "reference":
            lines.append(f"reference: {us(e['time_ns'])} us, noise {us(e['noise']['value_ns'])} us; floor "
                         f"{us(e['floor_ns'])} us; cost {e['cost_s']:.0f} s")
        elif e["event"] == "yardstick":
            lines.append(f"{e.get('name') or 'cuBLAS'} (same run, alone): {us(e['time_ns'])} us")
        elif e["event"] == "build":
            lines.append(f"  build {e['key']} step {e['step']}: "
                         f"{'ok' if e['ok'] else e['reason_code'] + ': ' + e['reason'][:160]} ({e['cost_s']:.0f} s)")
        elif e["event"] == "verdict":
            edit = e.get("edit") or {}
            if edit.get("compound"):  # one edit aimed at one row, its parts listed
                what = " + ".join(f"{p['knob']}={p['value']}" for p in edit["parts"])
            elif edit.get("kind") == "knob":
                what = f"{edit.get('knob')}={edit.get('value')}"
            else:
                what = edit.get("kind", "naive")
            lines.append(f"step {e['step']} {e['key']} {what}: {e['decision']} ({e['reason_code']}) "
                         f"{us(e.get('t_candidate'))} vs {us(e.get('t_incumbent'))} us")
        elif e["event"] == "stop":
            lines.append(f"stop: {e['reason']}; incumbent {e['incumbent']} {us(e['t_incumbent_ns'])} us vs reference "
                         f"{us(e['t_reference_ns'])} us; {e['timed']} timed; {e['cost_s'] / 60:.2f} device minutes "
                         "counted")
            pair = e.get("yardstick_paired")
            if pair:  # the final incumbent and cuBLAS interleaved: one thermal/power state
                lines.append(f"  cuBLAS paired with the incumbent (interleaved): {us(pair['t_yardstick_ns'])} vs "
                             f"{us(pair['t_incumbent_ns'])} us = "
                             f"{pair['t_yardstick_ns'] / pair['t_incumbent_ns']:.1%} of cuBLAS")
            lines.append(f"  knobs: {e['incumbent_knobs']}")
            lines.append(f"  remaining differences: {', '.join(r['key'] for r in e['remaining'])}")
    for b in sorted((d / "bundles").glob("cand-*.bundle")) if (d / "bundles").is_dir() else []:
        m = json.loads((b / "manifest.json").read_text())
        cap, run = m.get("capture") or {}, m.get("mosaic_run") or {}
        iso = cap.get("isolation") or {}
        ref = ((cap.get("summary") or {}).get("oracle_reference") or {}).get("source", "-")
        t = json.loads((b / "timings.json").read_text()) if (b / "timings.json").is_file() else {}
        sess = [f"{s.get('wall_s', 0):.1f} s ({(s.get('isolation') or {}).get('mode', '-')} pid "
                f"{(s.get('isolation') or {}).get('pid', '-')} req {(s.get('isolation') or {}).get('request', '-')})"
                for s in t.get("sessions") or []]
        lines.append(f"  cost {b.name[5:-7]}: total {run.get('cost_s', 0):.1f} s; gate {cap.get('wall_s', 0):.1f} s "
                     f"({iso.get('mode', '-')} pid {iso.get('pid', '-')} req {iso.get('request', '-')}, "
                     f"reference {ref}{', RETRIED' if iso.get('first_attempt') else ''}); timings {', '.join(sess) or '-'}")
    return lines


def tar_campaign(d: Path, dest: Path, limit: int = TAR_LIMIT) -> str:
    """The campaign directory as a tarball without an older campaign's .work/ scratch (campaigns now keep it in
    the user cache); without PTX (SASS, cubin and logs stay) when it would exceed ``limit`` bytes. Returns a note
    ('' or what was dropped)."""
    def write(drop_ptx: bool) -> None:
        def keep(info):
            parts = Path(info.name).parts
            return None if ".work" in parts or (drop_ptx and info.name.endswith(".ptx")) else info

        with tarfile.open(dest, "w:xz") as tar:
            tar.add(d, arcname=d.name, filter=keep)

    write(False)
    size = dest.stat().st_size
    if size > limit:
        write(True)
        return f"campaign.tar.xz without PTX (was {size} bytes)"
    return ""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", choices=("cute", "cutlass"), default="cute")
    p.add_argument("--family", default="gemm", help="kernel family (gemm, attention, ...)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--shape", default="4096x4096x4096")
    p.add_argument("--budget-min", type=float, default=3)
    p.add_argument("--max-candidates", type=int, default=5)
    p.add_argument("--wall", type=float, default=270, help="wall cap of the live campaign, seconds")
    p.add_argument("--total", type=float, default=None,
                   help="cap of the whole script, seconds from its start (the campaign's wall shrinks to fit)")
    p.add_argument("--offline-timeout", type=float, default=90, help="cap of the offline re-decision, seconds")
    p.add_argument("--isolation", choices=("worker", "step"), default="worker",
                   help="worker: one persistent process for gates and timings; step: one per request")
    p.add_argument("--dir", type=Path, default=Path("/tmp/gemm-campaign"), help="the campaign directory (replaced)")
    add_json(p, "gemm_campaign")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    t0 = time.time()
    path = json_path(a)
    out = path.parent
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    env = environment(a.target)
    if not (Path(env["MOSAIC_CUTLASS_INCLUDE"]) / "cutlass" / "cutlass.h").is_file():
        print(f"warning: no CUTLASS headers at {env['MOSAIC_CUTLASS_INCLUDE']} (run the staging)")
    if subprocess.run([sys.executable, "-c", "import cupti"], env=env, capture_output=True).returncode:
        print("warning: cupti-python is not importable: timings fall back to CUDA events (each bundle says so)")
    report: dict = {"args": {k: str(v) for k, v in vars(a).items()}, "nvidia_smi": nvidia_smi(
        "name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu")}
    print(report["nvidia_smi"])
    cmd = campaign_command(a.target, a.shape, a.budget_min, a.max_candidates, a.isolation, a.dir, a.family, a.dtype)
    wall = campaign_wall(a.wall, a.total, time.time() - t0, a.offline_timeout)
    report["wall_s"] = round(wall, 1)
    print(f"== live campaign: mosaic run --source pallas --target {a.target} --family {a.family} --shape {a.shape} "
          f"--dtype {a.dtype} ... (wall cap "
          f"{wall:.0f} s) ==", flush=True)
    report["rc"] = run_capped(cmd, wall, env, out / "run.stdout", out / "run.log",
                              every=lambda: copy_journal(a.dir, out / "journal.jsonl"))
    print((out / "run.log").read_text() + (out / "run.stdout").read_text())
    print(f"live campaign: exit {report['rc']} after {time.time() - t0:.0f} s")
    if (a.dir / "journal.jsonl").is_file() and not (a.dir / "report.md").is_file():  # killed past the wall cap
        from mosaic.run.report import write_report

        write_report(a.dir)
    if (a.dir / "report.md").is_file():
        shutil.copyfile(a.dir / "report.md", out / "report.md")
    left = a.offline_timeout if a.total is None else min(a.offline_timeout, a.total - (time.time() - t0) - TAIL_S)
    print(f"== offline re-decision from the bundles (cap {left:.0f} s) ==", flush=True)
    try:
        off = subprocess.run(offline_command(a.dir), capture_output=True, text=True, env=env, timeout=max(1, left))
        text, report["offline_rc"] = off.stdout + off.stderr, off.returncode
    except subprocess.TimeoutExpired as exc:
        said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (exc.stdout, exc.stderr) if x)
        text = f"{said}offline re-decision cut at its cap of {left:.0f} s\n"
        report["offline_rc"] = 124
    if a.dir.is_dir():
        (a.dir / "offline.txt").write_text(text)
    print(text + f"offline: exit {report['offline_rc']}")
    report["summary"] = summary_lines(a.dir)
    (out / "summary.txt").write_text("\n".join(report["summary"]) + "\n")
    print("\n".join(report["summary"]))
    note = tar_campaign(a.dir, out / "campaign.tar.xz")
    if note:
        print(note)
    report["seconds"] = round(time.time() - t0, 1)
    write_json(path, report, indent=1)
    print(f"wrote {out / 'campaign.tar.xz'} ({(out / 'campaign.tar.xz').stat().st_size} bytes) and {path}; "
          f"total {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
