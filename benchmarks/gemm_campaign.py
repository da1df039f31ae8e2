#!/usr/bin/env python3
"""ONE live convergence campaign on the H200, Pallas -> CuTe (--target cutlass for CUTLASS), bf16 GEMM (--shape,
default 4096x4096x4096), with the command users type (`mosaic run ...`), then `mosaic run --offline` on its directory,
which must reproduce every verdict from the bundles alone. Prints the journal's summary (reference, cuBLAS, every
build and verdict, the stop, each candidate's cost and isolation record) and writes it with the exit codes to --json.

From the repository root, after ../shared/device/stage-gpu-wheels.sh (cupti-python + CUTLASS headers; a PYTHONPATH in
/tmp/site/.pythonpath is used) and `pip install --no-deps --no-build-isolation -e packages/core -e packages/gpu-hopper
-e packages/target-pallas -e packages/target-cutlass -e packages/target-cute`:

    python3 benchmarks/gemm_campaign.py [--target cute] [--wall 270] [--budget-min 3] [--max-candidates 5]
                                        [--isolation worker|step] [--json PATH]

--isolation step runs the one-process-per-request workbench instead of the persistent worker (for comparison).
Wall time: about 4-5 minutes (campaign capped by --wall, default 270 s: SIGINT, then a kill 30 s later; budget 3
device minutes, 5 timed candidates; offline re-decision ~15 s). Writes next to the JSON (in $OUT by default):
  campaign.tar.gz  the campaign directory: report.md/.html/.json, journal.jsonl, campaign.json,
                   bundles/*.bundle (4096^3 outputs kept by SHA-256), offline/ (the re-decision); without PTX when
                   it would exceed 16 MB
  report.md, report.json, offline-report.json, run.log (progress lines), run.stdout, offline.txt, summary.txt
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
from pathlib import Path

from _device import add_json, json_path, nvidia_smi, write_json

MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
TAR_LIMIT = 16_000_000


def campaign_command(target: str, shape: str, budget_min: float, max_candidates: int, isolation: str,
                     out: Path) -> list[str]:
    return [*MOSAIC, "run", "--source", "pallas", "--target", target, "--family", "gemm", "--shape", shape,
            "--dtype", "bf16", "--gpu", "h200", "--budget-min", str(budget_min), "--max-candidates",
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


def run_capped(cmd: list[str], wall: float, env: dict, stdout: Path, stderr: Path) -> int:
    """Run ``cmd`` with a wall cap: SIGINT at ``wall`` seconds (the campaign stops and writes its report), a kill 30 s
    later."""
    with stdout.open("w") as out, stderr.open("w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        try:
            return p.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            return 124


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
            lines.append(f"cuBLAS (same run): {us(e['time_ns'])} us")
        elif e["event"] == "build":
            lines.append(f"  build {e['key']} step {e['step']}: "
                         f"{'ok' if e['ok'] else e['reason_code'] + ': ' + e['reason'][:160]} ({e['cost_s']:.0f} s)")
        elif e["event"] == "verdict":
            edit = e.get("edit") or {}
            what = f"{edit.get('knob')}={edit.get('value')}" if edit.get("kind") == "knob" else edit.get("kind", "naive")
            lines.append(f"step {e['step']} {e['key']} {what}: {e['decision']} ({e['reason_code']}) "
                         f"{us(e.get('t_candidate'))} vs {us(e.get('t_incumbent'))} us")
        elif e["event"] == "stop":
            lines.append(f"stop: {e['reason']}; incumbent {e['incumbent']} {us(e['t_incumbent_ns'])} us vs reference "
                         f"{us(e['t_reference_ns'])} us; {e['timed']} timed; {e['cost_s'] / 60:.2f} device minutes "
                         "counted")
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
    """The campaign directory as a tarball without its .work/ scratch; without PTX (SASS, cubin and logs stay) when it
    would exceed ``limit`` bytes. Returns a note ('' or what was dropped)."""
    def write(drop_ptx: bool) -> None:
        def keep(info):
            parts = Path(info.name).parts
            return None if ".work" in parts or (drop_ptx and info.name.endswith(".ptx")) else info

        with tarfile.open(dest, "w:gz") as tar:
            tar.add(d, arcname=d.name, filter=keep)

    write(False)
    size = dest.stat().st_size
    if size > limit:
        write(True)
        return f"campaign.tar.gz without PTX (was {size} bytes)"
    return ""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", choices=("cute", "cutlass"), default="cute")
    p.add_argument("--shape", default="4096x4096x4096")
    p.add_argument("--budget-min", type=float, default=3)
    p.add_argument("--max-candidates", type=int, default=5)
    p.add_argument("--wall", type=float, default=270, help="wall cap of the live campaign, seconds")
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
    print(f"== live campaign: mosaic run --source pallas --target {a.target} ... (wall cap {a.wall:.0f} s) ==",
          flush=True)
    cmd = campaign_command(a.target, a.shape, a.budget_min, a.max_candidates, a.isolation, a.dir)
    report["rc"] = run_capped(cmd, a.wall, env, out / "run.stdout", out / "run.log")
    print((out / "run.log").read_text() + (out / "run.stdout").read_text())
    print(f"live campaign: exit {report['rc']} after {time.time() - t0:.0f} s")
    print("== offline re-decision from the bundles ==", flush=True)
    off = subprocess.run(offline_command(a.dir), capture_output=True, text=True, env=env)
    (out / "offline.txt").write_text(off.stdout + off.stderr)
    report["offline_rc"] = off.returncode
    print(off.stdout + off.stderr + f"offline: exit {off.returncode}")
    if (a.dir / "journal.jsonl").is_file() and not (a.dir / "report.md").is_file():  # stopped by the wall cap
        from mosaic.run.report import write_report

        write_report(a.dir)
    for src, name in (("report.md", "report.md"), ("report.json", "report.json"),
                      ("offline/report.json", "offline-report.json")):
        if (a.dir / src).is_file():
            shutil.copyfile(a.dir / src, out / name)
    report["summary"] = summary_lines(a.dir)
    (out / "summary.txt").write_text("\n".join(report["summary"]) + "\n")
    print("\n".join(report["summary"]))
    note = tar_campaign(a.dir, out / "campaign.tar.gz")
    if note:
        print(note)
    report["seconds"] = round(time.time() - t0, 1)
    write_json(path, report, indent=1)
    print(f"wrote {out / 'campaign.tar.gz'} ({(out / 'campaign.tar.gz').stat().st_size} bytes) and {path}; "
          f"total {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
