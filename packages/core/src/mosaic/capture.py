"""Capture: build and run one kernel in its own process, with a timeout, and write a complete bundle.

``capture(spec, gpu, out, options)`` runs ``python -m mosaic.capture REQUEST.json`` as a child process (its
own process group). A compile error or a configuration that does not fit the GPU is *unbuildable*; a
crash (a signal), a hang (the timeout kills the whole group) or any other failure is recorded with its
status in the bundle's manifest (``capture.status``) and a log; nothing of it reaches the caller's
process. The bundle (DESIGN.md) holds PTX, SASS, cubin, ptxas log and source from lowering, and, unless
``lower_only``: the launch record from CUPTI, per-run device times in blocks (with clocks), the
reference's measured noise, the input seed, the outputs (arrays when small, SHA-256 when large) and the
oracle's verdict. A candidate that fails the oracle is never timed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from mosaic.errors import BadInput, MosaicError
from mosaic.families import make_inputs
from mosaic.fields import name_field
from mosaic.records import KernelSpec

STATUSES = ("ok", "lowered", "profiled", "unbuildable", "numerics-failed", "crashed", "timeout", "failed")


@attrs.frozen
class CaptureOptions:
    lower_only: bool = False
    timeout: float = 1800.0
    seed: int = 0
    values: str = attrs.field(default="normal", validator=name_field)  # a distribution (mosaic.families)
    warmup: int = 10
    runs: int = 50  # timed runs per block
    blocks: int = 20  # interleaved self-pairs (A A' A A' ... per block); noise from their differences
    timer: str = "cupti"
    flush: bool = True
    max_array_bytes: int = 8 * 2**20  # larger outputs/inputs are recorded by SHA-256
    # the profiled child of `capture --profile` (mosaic.profile): one warm launch, then one launch between
    # cuProfilerStart and cuProfilerStop for Nsight Compute; no check, no timing
    profile_run: bool = False


@attrs.frozen
class CaptureResult:
    status: str
    bundle: Path | None
    message: str = ""
    summary: dict = attrs.field(factory=dict)
    warnings: tuple = ()  # the child's ``warning:`` lines (a plugin, a damaged cache entry), relayed

    def to_json(self) -> dict:
        out = {"status": self.status, "bundle": str(self.bundle) if self.bundle else None,
               "message": self.message, "summary": self.summary}
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


MAX_WARNINGS = 20


def child_warnings(output: str | None) -> tuple[str, ...]:
    """The ``warning:`` lines a capture child printed (at most :data:`MAX_WARNINGS`, each once, in order)."""
    seen = dict.fromkeys(ln.strip() for ln in (output or "").splitlines()
                         if ln.lstrip().lower().startswith("warning:"))
    return tuple(seen)[:MAX_WARNINGS]


def parse_shape(family: str, text: str) -> dict[str, int]:
    """``4096x4096x4096`` (in the family's dimension order) or ``m=4096,n=4096,k=4096``: the family
    registry's parser (:func:`mosaic.families.parse_shape`)."""
    from mosaic.families import parse_shape as family_shape

    return family_shape(family, text, "--shape")


def parse_knobs(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise BadInput(f"knob '{item}' is not name=value", "--knob")
        k, v = item.split("=", 1)
        knobs[k.strip()] = v.strip()
    return knobs


def _sha(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _arrays_files(role: str, arrays: dict[str, np.ndarray], limit: int, extra: dict) -> dict:
    digest = {name: {"shape": list(a.shape), "dtype": str(a.dtype), "sha256": _sha(a)} for name, a in arrays.items()}
    files = {f"{role}-meta.json": ("other", json.dumps({**extra, "arrays": digest}, indent=1))}
    if sum(a.nbytes for a in arrays.values()) <= limit:
        files[f"{role}.npz"] = (role, _npz(arrays))
    return files


# -- run, check, time -----------------------------------------------------------------------------

def check_and_time(runnable, spec: KernelSpec, gpu, inputs: dict[str, np.ndarray], opts: CaptureOptions,
                   log: list[str], timer=None, reference_cache=None) -> tuple[str, dict, dict]:
    """Poison, run once, check with the oracle; if it passes, time in blocks. -> (status, files, summary).

    ``reference_cache`` (:class:`mosaic.oracle.cache.ReferenceCache`): the float64 reference is read from it
    when its verified key matches these inputs; the summary's ``oracle_reference`` says computed or read."""
    from mosaic.oracle import check
    from mosaic.timing.noise import measure_noise, summarize

    files: dict = {}
    runnable.poison()
    runnable.launch()
    outputs = runnable.output()
    t0 = time.monotonic()
    verdict = check(spec.family, inputs, outputs, spec.dtype, cache=reference_cache)
    ref = dict(reference_cache.last or {}) if reference_cache is not None else {"source": "computed", "why": "no cache"}
    log.append(f"oracle: {'pass' if verdict.passed else 'FAIL'} in {time.monotonic() - t0:.1f} s {verdict.reason}"
               f"{' ' if verdict.reason else ''}(float64 reference {ref['source']}"
               f"{', ' + ref['why'] if ref.get('why') else ''})")
    files["oracle.json"] = ("metrics", json.dumps(verdict.to_json(), indent=1))
    files.update(_arrays_files("outputs", outputs, opts.max_array_bytes, {"poisoned_before_run": True}))
    summary: dict = {"numerics_pass": verdict.passed, "oracle_reference": ref,
                     "oracle": {o.name: {"max_abs_error": o.max_abs_error, "mean_abs_error": o.mean_abs_error,
                                         "max_error_over_band": o.max_error_over_band,
                                         "worst_index": list(o.worst_index) if o.worst_index else None,
                                         "exact_checked": o.exact_checked, "failures": o.failures}
                                for o in verdict.outputs}}
    if not verdict.passed:
        return "numerics-failed", files, summary
    from mosaic.timing.device import L2Flush, Serialized
    from mosaic.timing.timer import make_timer

    timer = timer or make_timer(opts.timer)
    flush = L2Flush(gpu.l2_bytes) if opts.flush else None
    serial = Serialized(runnable)  # jax launches on its own stream: no flush or other run may overlap
    try:
        # the reference against itself, interleaved run by run: blocks (2i, 2i+1) = (A_i, A'_i)
        blocks = []
        for i in range(opts.blocks):
            blocks += timer.time_interleaved([serial, serial], opts.runs,
                                             warmup=opts.warmup if i == 0 else 2, flush=flush,
                                             flush_name=flush.description if flush else "none",
                                             clocks=i in (0, opts.blocks - 1))
    finally:
        if flush:
            flush.close()
    all_times = [t for b in blocks for t in b.times_ns]
    timings = {"source": timer.source, "fallback_reason": getattr(timer, "reason", ""),
               "unit": "ns", "interleaved": "blocks (2i, 2i+1) are the kernel against itself, run by run",
               "serialized": Serialized.description,
               "statistic": "median of a block's runs; noise = t(0.995, P-1) * sd(median(A_i) - median(A'_i))",
               "summary": summarize(all_times).to_json(), "blocks": [b.to_json() for b in blocks]}
    if len(blocks) >= 10:
        noise = measure_noise([b.times_ns for b in blocks])
        timings["noise"] = noise.to_json()
        timings["time_ns"] = noise.reference_time
    else:
        timings["time_ns"] = float(np.median([np.median(b.times_ns) for b in blocks]))
    files["timings.json"] = ("timings", json.dumps(timings, indent=1))
    if blocks[0].launch is not None:
        files["launch.json"] = ("launch", json.dumps(blocks[0].launch.to_json(), indent=1))
    # the output after all timed runs must be the same bits (a race or stale state shows here)
    runnable.poison()
    runnable.launch()
    again = runnable.output()
    same = all(np.array_equal(again[k], outputs[k], equal_nan=True) for k in outputs)
    log.append(f"timed {opts.blocks} interleaved self-pairs x {opts.runs} runs by {timer.source}: median {timings['time_ns'] / 1e3:.2f} us; "
               f"output after timing identical: {same}")
    summary.update({"time_ns": timings["time_ns"], "timer": timer.source,
                    "noise_ns": timings.get("noise", {}).get("value_ns"), "deterministic": same,
                    "launch": blocks[0].launch.to_json() if blocks[0].launch else None})
    return ("ok" if same else "numerics-failed"), files, summary


def capture_in_process(spec: KernelSpec, gpu_name: str, out: Path, opts: CaptureOptions,
                       runnable_factory=None, extra: dict | None = None, reference_cache=None,
                       backend=None, inputs: dict | None = None, inputs_note: dict | None = None) -> CaptureResult:
    """The child's work (also usable directly when the caller already is an isolated process).

    ``runnable_factory(spec, gpu, inputs)`` replaces the language backend (for a library reference such as
    cuBLAS that has no lowering); then the bundle holds no PTX/SASS. ``extra``: more top-level manifest
    keys (the convergence loop's ``mosaic_run``), written with the bundle. ``reference_cache``: the oracle's
    float64 reference cache (see :func:`check_and_time`). ``backend``: replaces the language's backend (a
    kernel file's, :mod:`mosaic.kernel_files`); one with ``planned_launch(spec, gpu)`` gets that launch
    record written as ``launch.json`` when lowering only. ``inputs``: the seeded inputs of ``opts.seed`` and
    ``opts.values`` when the caller holds them already (the live workbench's worker); made here otherwise.
    ``inputs_note``: what ``inputs-meta.json`` says of given inputs instead of ``opts.seed``/``opts.values`` (inputs
    the campaign's process made from a seed this process never saw: the parent records the seed).
    """
    from mosaic.backend import Unbuildable
    from mosaic.bundle import save_bundle
    from mosaic.plugins import host

    h = host()
    gpu = h.get("gpus", gpu_name)
    log: list[str] = [f"capture {spec.language} {spec.family} {spec.shape} {spec.dtype} knobs={spec.knobs} on {gpu.name}"]
    files: dict = {}
    toolchain: dict = {}
    summary: dict = {}
    status = "lowered"
    work = Path(tempfile.mkdtemp(prefix="mosaic-capture-"))
    try:
        try:
            if runnable_factory is None:
                if backend is None:
                    backend = h.get("languages", spec.language).backend
                if backend is None:
                    raise MosaicError(f"language '{spec.language}' has no backend yet", "--lang")
                t0 = time.monotonic()
                lowered = backend.lower(spec, gpu, work / "lower")
                log.append(f"lowered in {time.monotonic() - t0:.1f} s: {lowered.kernel_name}")
                log.extend(lowered.notes)
                toolchain = {k: str(v) for k, v in lowered.toolchain.items()}
                for role, name in (("ptx", "kernel.ptx"), ("sass", "kernel.sass"), ("cubin", "kernel.cubin"),
                                   ("ptxas_log", "ptxas.log")):
                    path = getattr(lowered, role)
                    if path is not None:
                        files[name] = (role, Path(path))
                if lowered.source is not None:
                    files[f"source/{Path(lowered.source).name}"] = ("source", Path(lowered.source))
                files["lowering.json"] = ("metrics", json.dumps({
                    "kernel_name": lowered.kernel_name, "notes": list(lowered.notes),
                    "resources": lowered.resources.to_json() if lowered.resources else None}, indent=1))
                summary["resources"] = lowered.resources.to_json() if lowered.resources else None
                if opts.lower_only and hasattr(backend, "planned_launch"):
                    files["launch.json"] = ("launch", json.dumps(backend.planned_launch(spec, gpu).to_json(), indent=1))
            if not opts.lower_only:
                if inputs is None:
                    inputs = make_inputs(spec, opts.seed, opts.values)
                note = inputs_note if inputs_note is not None else {"seed": opts.seed, "values": opts.values}
                files.update(_arrays_files("inputs", inputs, opts.max_array_bytes,
                                           {**note, "generator": "numpy.random.default_rng(seed); see "
                                                                 "mosaic.families.make_inputs"}))
                from mosaic.timing.timer import make_timer

                # before the kernel creates a CUDA context; none under Nsight Compute, which owns the profiler
                timer = None if opts.profile_run else make_timer(opts.timer)
                if runnable_factory is None:
                    runnable = backend.prepare(spec, gpu, work / "run", inputs)
                else:
                    runnable = runnable_factory(spec, gpu, inputs)
                try:
                    if opts.profile_run:
                        from mosaic.profiler_range import profiled_launch

                        status, more, s = "profiled", {}, profiled_launch(runnable, log)
                    else:
                        status, more, s = check_and_time(runnable, spec, gpu, inputs, opts, log, timer,
                                                         reference_cache)
                finally:
                    runnable.close()
                files.update(more)
                summary.update(s)
        except Unbuildable as exc:
            status = "unbuildable"
            log.append(f"unbuildable: {exc.line()}")
            summary["error"] = exc.line()
        except MosaicError as exc:
            status = "failed"
            log.append(f"failed: {exc.line()}")
            summary["error"] = exc.line()
            if isinstance(getattr(exc, "code", None), str):  # a kind of failure its error names (a library missing)
                summary["error_code"] = exc.code
        except Exception as exc:  # noqa: BLE001 - recorded in the bundle, never lost
            status = "failed"
            log.append("failed: " + "".join(traceback.format_exception(exc))[-4000:])
            summary["error"] = f"{type(exc).__name__}: {exc}"
        files["capture.log"] = ("log", "\n".join(log) + "\n")
        bundle = save_bundle(out, kernel=spec, language=spec.language, files=files, gpu=gpu.name,
                             toolchain=toolchain, overwrite=True,
                             extra={**(extra or {}),
                                    "capture": {"status": status, "lower_only": opts.lower_only,
                                                "options": attrs.asdict(opts), "summary": summary}})
        return CaptureResult(status, bundle.root, summary.get("error", ""), summary)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


# -- the parent: one child process per kernel -------------------------------------------------------

def capture(spec: KernelSpec, gpu_name: str, out: str | os.PathLike, opts: CaptureOptions | None = None,
            extra: dict | None = None, prefix: tuple[str, ...] | list[str] = (),
            oracle_cache: str | os.PathLike | None = None) -> CaptureResult:
    """Capture in a child process (``python -m mosaic.capture REQUEST.json``). ``extra``: more top-level
    manifest keys, written with the bundle (also when the child crashed or timed out). ``prefix``: a command
    the child runs under (``mosaic.profile``'s ``ncu ...``). ``oracle_cache``: a directory of
    :class:`mosaic.oracle.cache.ReferenceCache` the child's numerics check reads and writes (a campaign's)."""
    opts = opts or CaptureOptions()
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="mosaic-capture-req-") as tmp:
        req = Path(tmp) / "request.json"
        res = Path(tmp) / "result.json"
        req.write_text(json.dumps({"spec": spec.to_json(), "gpu": gpu_name, "out": str(out.resolve()),
                                   "options": attrs.asdict(opts), "result": str(res), "extra": extra,
                                   "oracle_cache": str(Path(oracle_cache).resolve()) if oracle_cache else None}))
        return run_child([*prefix, sys.executable, "-m", "mosaic.capture", str(req)], res, spec, gpu_name, out,
                         opts, extra)


def run_child(argv: list[str], res: Path, spec: KernelSpec, gpu_name: str, out: Path, opts: CaptureOptions,
              extra: dict | None) -> CaptureResult:
    """Run a capture child (its own process group, killed whole at ``opts.timeout``) and read its result
    file; a child that hung, crashed or wrote no result is recorded as such in a bundle at ``out``."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=opts.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return _record_failure(spec, gpu_name, out, opts, "timeout", f"killed after {opts.timeout:.0f} s",
                               output, extra)
    if res.is_file():
        data = json.loads(res.read_text())
        warnings = child_warnings(output)
        for w in warnings:  # a child's warning is the user's to see, not lost with its output
            print(w, file=sys.stderr, flush=True)
        return CaptureResult(data["status"], Path(data["bundle"]) if data["bundle"] else None,
                             data["message"], data["summary"], warnings)
    rc = proc.returncode
    what = f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc} and no result"
    return _record_failure(spec, gpu_name, out, opts, "crashed" if rc < 0 else "failed", what, output, extra)


def _record_failure(spec, gpu_name, out, opts, status, what, output, extra=None) -> CaptureResult:
    from mosaic.bundle import save_bundle

    log = f"capture {status}: {what}\n--- child output (last 8000 characters) ---\n{(output or '')[-8000:]}"
    bundle = save_bundle(out, kernel=spec, language=spec.language, files={"capture.log": ("log", log)},
                         gpu=gpu_name, overwrite=True,
                         extra={**(extra or {}), "capture": {"status": status, "lower_only": opts.lower_only,
                                            "options": attrs.asdict(opts), "summary": {"error": what}}})
    return CaptureResult(status, bundle.root, what, {"error": what})


def _child(request_path: str) -> int:
    req = json.loads(Path(request_path).read_text())
    spec = KernelSpec.from_json(req["spec"])
    opts = CaptureOptions(**req["options"])
    cache = None
    if req.get("oracle_cache"):
        from mosaic.oracle.cache import ReferenceCache

        cache = ReferenceCache(req["oracle_cache"])
    result = capture_in_process(spec, req["gpu"], Path(req["out"]), opts, extra=req.get("extra"),
                                reference_cache=cache)
    Path(req["result"]).write_text(json.dumps(result.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
