"""Nsight Compute metrics of a captured kernel (``mosaic capture --profile``): the fingerprint's machine layer.

The kernel is built again in a capture child (:mod:`mosaic.capture`, ``profile_run``; its launches:
:mod:`mosaic.profiler_range`) that runs under ``ncu``
with profiling off from the start: the child launches the kernel once to warm it (jit, module load), then
launches it once more between ``cuProfilerStart`` and ``cuProfilerStop``, so Nsight Compute replays exactly
that launch (and whatever the language's runtime launched with it) and nothing of input generation, poisoning
or L2 flushing. Clocks are left alone (``--clock-control none``: the GPU's settings are never changed).

The report is imported back with ``ncu --import --csv --page raw``; the kernel is the profiled launch whose
mangled name is the lowered kernel's (else the longest one, and the file says so). The bundle gains
``profile.json`` (``{"tool", "version", "command", "kernel", "picked_by", "kernels", "metrics"}``), the raw
CSV (``profile.csv``) and, when small enough, the report itself, all with role ``profile``. Lifting reads
``profile.json`` on any machine; ncu is needed only to capture.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import attrs

from mosaic.errors import BadInput, MosaicError

#: Nsight Compute's "full" set: every section (speed of light, occupancy, memory and compute workload,
#: warp state and scheduler statistics, source counters); a few dozen replays of the one launch.
SECTION_SET = "full"
#: metrics asked for by name besides the set, where this ncu offers them for the GPU (``--query-metrics``)
EXTRA_METRICS = ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                 "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                 "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
                 "lts__t_sector_hit_rate.pct", "sm__warps_active.avg.pct_of_peak_sustained_active",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum")
MAX_REPORT_BYTES = 16 * 2**20  # a larger .ncu-rep is left out of the bundle (its CSV stays)
NAME_COLUMN, DURATION_COLUMN = "Kernel Name", "gpu__time_duration.sum"


def find_ncu() -> str:
    """The ``ncu`` to run: ``$MOSAIC_NCU``, else ``ncu`` on PATH, else the newest under /opt/nvidia and the CUDA
    toolkits; none is one line (exit 2)."""
    env = os.environ.get("MOSAIC_NCU")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise BadInput("MOSAIC_NCU does not name an executable file", env)
        return env
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/bin/ncu",
                    "/usr/local/cuda*/nsight-compute*/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    raise BadInput("--profile needs Nsight Compute (ncu): none on PATH, under /opt/nvidia/nsight-compute or "
                   "/usr/local/cuda*; install it or set MOSAIC_NCU", "--profile")


# -- the parent ---------------------------------------------------------------------------------------

@attrs.frozen
class Profile:
    kernel: str
    picked_by: str  # "name" (the lowered kernel's) or "duration" (no launch had that name: the longest)
    kernels: list  # [{"name", "duration_ns"}] every launch the report holds
    metrics: dict  # metric name -> number (base units)

    def to_json(self, **more) -> dict:
        return {**more, "kernel": self.kernel, "picked_by": self.picked_by, "kernels": self.kernels,
                "metrics": self.metrics}


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "") if re.fullmatch(r"-?[\d,]+(\.\d+)?([eE][-+]?\d+)?", text.strip()) else text.strip()
    try:
        x = float(t)
    except ValueError:
        return None
    return x if math.isfinite(x) else None  # ncu prints "nan"/"inf" for metrics it could not derive


def parse_raw_csv(text: str, kernel_name: str | None) -> Profile:
    """``ncu --import R --csv --page raw --print-units base`` -> the picked launch's numeric metrics."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise MosaicError("Nsight Compute's CSV has no header row (no kernel was profiled?)")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], [r for r in rows[1:] if r and r[0].strip() and len(r) == len(rows[0])]
    if NAME_COLUMN not in header:
        raise MosaicError(f"Nsight Compute's CSV has no '{NAME_COLUMN}' column")
    if not body:
        raise MosaicError("Nsight Compute profiled no kernel in the range (was the launch outside it?)")
    ni = header.index(NAME_COLUMN)
    di = header.index(DURATION_COLUMN) if DURATION_COLUMN in header else None
    kernels = [{"name": r[ni], "duration_ns": _number(r[di]) if di is not None else None} for r in body]
    named = [r for r in body if kernel_name and r[ni] == kernel_name]
    if named:
        row, how = named[0], "name"
    else:
        row, how = max(body, key=lambda r: (_number(r[di]) or 0.0) if di is not None else 0.0), "duration"
    first_metric = next((i for i, h in enumerate(header) if "__" in h), len(header))
    metrics = {}
    for h, v in zip(header[first_metric:], row[first_metric:], strict=True):
        x = _number(v)
        if x is not None:
            metrics[h] = x
    return Profile(row[ni], how, kernels, metrics)


def offered_metrics(ncu: str, wanted: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The names in ``wanted`` whose base metric this ncu offers for the GPU here -> (offered, not offered).
    Asking ncu for a metric it lacks fails the whole profile, so each is checked first."""
    try:
        out = subprocess.run([ncu, "--query-metrics", "--csv"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return [], list(wanted)
    bases = {row[0].strip() for row in csv.reader(io.StringIO(out)) if row}
    yes = [m for m in wanted if m.split(".")[0] in bases]
    return yes, [m for m in wanted if m not in yes]


def ncu_version(ncu: str) -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


def profile_bundle(bundle: str | os.PathLike, gpu_name: str, opts, *, kernel_file=None, progress=None) -> dict:
    """Profile the kernel of a captured bundle under Nsight Compute and add ``profile.json`` (+ CSV, report)
    to it. ``kernel_file``: the :class:`mosaic.kernel_files.KernelFile` the bundle was captured from (else the
    language's own kernel). -> the profile record written. A failed profile raises :class:`MosaicError` with
    the child's log kept in a sibling ``.profile.log``."""
    from mosaic.bundle import add_files, load_bundle

    say = progress or (lambda line: None)
    ncu = find_ncu()
    b = load_bundle(bundle)
    spec = b.kernel
    kernel_name = _lowering(b).get("kernel_name")
    extra, missing = offered_metrics(ncu, EXTRA_METRICS)
    version = ncu_version(ncu)
    with tempfile.TemporaryDirectory(prefix="mosaic-profile-") as tmp:
        rep = Path(tmp) / "profile"
        cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
               "--set", SECTION_SET, "--import-source", "no", "--export", str(rep), "--force-overwrite"]
        if extra:
            cmd += ["--metrics", ",".join(extra)]
        run_opts = attrs.evolve(opts, profile_run=True, lower_only=False)
        say(f"profiling {b.kernel.language} {spec.family} under {version} (one launch, set '{SECTION_SET}')")
        out = Path(tmp) / "profiled.bundle"
        if kernel_file is not None:
            from mosaic.kernel_files import capture_file

            result = capture_file(kernel_file, spec, gpu_name, out, run_opts, prefix=cmd)
        else:
            from mosaic.capture import capture

            result = capture(spec, gpu_name, out, run_opts, prefix=cmd)
        child_log = _child_log(out)
        if result.status != "profiled" or not rep.with_suffix(".ncu-rep").is_file():
            kept = Path(str(bundle).rstrip("/") + ".profile.log")
            kept.write_text(child_log)
            raise MosaicError(f"the profiled run ended '{result.status}'"
                              f"{': ' + result.message if result.message else ''}; its log: {kept}")
        report = rep.with_suffix(".ncu-rep")
        try:
            text = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base",
                                   "--print-kernel-base", "mangled"], capture_output=True, text=True,
                                  timeout=600).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MosaicError(f"reading the Nsight Compute report back failed: {exc}") from None
        prof = parse_raw_csv(text, kernel_name)
        record = prof.to_json(tool="ncu", version=version, command=[Path(cmd[0]).name, *cmd[1:cmd.index("--export")]],
                              lowered_kernel=kernel_name, metrics_not_offered=missing)
        files = {"profile.json": ("profile", json.dumps(record, indent=1, sort_keys=True)),
                 "profile.csv": ("profile", text)}
        if report.stat().st_size <= MAX_REPORT_BYTES:
            files["profile.ncu-rep"] = ("profile", report)
        add_files(bundle, files)
    say(f"profiled {prof.kernel[:80]} ({prof.picked_by}): {len(prof.metrics)} metrics")
    return record


def _lowering(b) -> dict:
    from mosaic import limits

    for path in b.find("metrics"):
        if path.name == "lowering.json":
            return limits.read_json(path)
    return {}


def _child_log(out: Path) -> str:
    log = out / "capture.log"
    return log.read_text() if log.is_file() else "(the profiled child wrote no log)\n"
