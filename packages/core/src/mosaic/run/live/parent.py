"""The live workbench's parent side: :class:`LiveWorkbench`, run in the loop's own process (see
:mod:`mosaic.run.live` for what each step does), and :func:`run_child`, which starts a one-request child."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from mosaic import user_cache
from mosaic.errors import BadInput, MosaicError
from mosaic.families import first_yardstick  # a library call, no lowering
from mosaic.kernel_files import captured_file_source
from mosaic.records import KernelSpec
from mosaic.run.live.protocol import REQUEST_FORMAT, ChildResult, knob_label, result_problem, tail
from mosaic.run.live.worker import Workers
from mosaic.run.workbench import (
    REFERENCE,
    YARDSTICK,
    Built,
    Checked,
    Kernel,
    ReferenceCapture,
    Timed,
    YardstickRun,
    add_session,
    blocks_of,
    is_yardstick,
    run_meta,
    update_bundle,
    yardstick_key,
    yardstick_meta,
)

CHILD_MODULE = "mosaic.run.live.child"  # python -m CHILD_MODULE REQUEST.json: one request, one process
PREFETCH_LANGUAGES = frozenset({"cutlass", "cute"})  # their lower() compiles for an arch with no GPU


def yardstick_spec(spec: KernelSpec, yard=None):
    """The yardstick ``yard`` (default: the family's first: cuBLAS, torch.matmul, for gemm) and its KernelSpec
    for ``spec``'s problem."""
    yard = yard if yard is not None else first_yardstick(spec.family)
    return yard, KernelSpec(family=spec.family, shape=dict(spec.shape), dtype=spec.dtype, language=yard.name,
                            knobs={}, name=yard.call)


def _summary(cap: Mapping) -> Mapping:
    return cap.get("summary") if isinstance(cap.get("summary"), Mapping) else {}


#: a yardstick capture that gave no figure -> why, as a reason code: the first rule that holds for (the capture's
#: status, or the child's when it gave no capture; the capture record)
UNMEASURED_RULES: tuple = (
    ("unavailable", lambda status, cap: _summary(cap).get("error_code") == "unavailable"),
    ("numerics", lambda status, cap: status == "numerics-failed"
     or (status == "ok" and not _summary(cap).get("numerics_pass"))),
    ("timeout", lambda status, cap: status == "timeout"),
    ("failed", lambda status, cap: True),
)


def unmeasured_reason(r: ChildResult) -> tuple[str, str] | None:
    """(reason code, reason) of a yardstick capture that measured nothing (:data:`UNMEASURED_RULES`); None when
    it passed the oracle (its bundle then holds its timings)."""
    cap = r.data.get("capture") if r.status == "ok" and isinstance(r.data.get("capture"), Mapping) else {}
    status = cap.get("status", r.status) if r.status == "ok" else r.status
    if status == "ok" and _summary(cap).get("numerics_pass"):
        return None
    code = next(code for code, holds in UNMEASURED_RULES if holds(status, cap))
    why = cap.get("message") or _summary(cap).get("error") or r.message or tail(r.output) or status
    if code == "numerics":
        why = f"failed the float64 oracle: {why}" if why != status else "failed the float64 oracle"
    return code, " ".join(str(why).split())  # one line


class LiveError(MosaicError):
    """A live measurement the loop cannot go on without (the reference capture, a timing session) failed."""

    exit_code = 1


@attrs.frozen
class Timeouts:
    """Seconds one request may take. ``check`` (a gate) and ``time`` (a timing session) are caps: the limit a
    request gets is scaled from what the same kind of request cost in this campaign (:meth:`scaled`), and a
    request never outlives the device-minute budget (:meth:`LiveWorkbench._limit`)."""

    reference: float = 900.0
    yardstick: float = 300.0
    lower: float = 900.0
    check: float = 300.0
    time: float = 300.0
    floor: float = 60.0   # no scaled limit is shorter
    factor: float = 5.0   # x the slowest request of the same kind so far

    def scaled(self, kind: str, seen: Mapping[str, list[float]]) -> tuple[float, str]:
        """(limit, why) for a ``kind`` request ("check" or "time"): ``max(floor, factor x the slowest of that
        kind so far)``, before the first one ``factor x`` the reference capture's seconds, at most the cap."""
        cap = float(getattr(self, kind))
        if seen.get(kind):
            base, what = max(seen[kind]), f"the slowest {'gate' if kind == 'check' else 'timing session'} so far"
        elif seen.get("reference"):
            base, what = max(seen["reference"]), "the reference capture"
        else:
            return cap, "the cap (nothing measured yet)"
        limit = min(cap, max(self.floor, self.factor * base))
        scaled = f"{self.factor:g} x {what} ({base:.1f} s)"
        why = (scaled if limit == self.factor * base
               else f"the floor ({self.floor:g} s; {scaled} is {self.factor * base:.1f} s)"
               if limit == self.floor else f"the cap ({cap:g} s)")
        return limit, why


class NoGpu(MosaicError):
    """No CUDA device here: ``mosaic run`` runs the preview instead (``reason`` says why)."""

    exit_code = 2


# -- one-request children -------------------------------------------------------------------------------------
def run_child(request: Mapping[str, Any], timeout: float, *, argv: list[str] | None = None,
              env: Mapping[str, str] | None = None) -> ChildResult:
    """Run ``python -m mosaic.run.live.child REQUEST.json`` (or ``argv + [REQUEST.json]``) in its own process group.

    The child writes its answer to ``request["result"]`` (set here). Timeout: the whole group is killed.
    """
    with tempfile.TemporaryDirectory(prefix="mosaic-live-") as tmp:
        req_path, res_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req_path.write_text(json.dumps({"format": REQUEST_FORMAT, **dict(request), "result": str(res_path)}))
        cmd = [*(argv or [sys.executable, "-m", CHILD_MODULE]), str(req_path)]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env={**os.environ, **dict(env or {})})
        iso = {"mode": "step", "pid": proc.pid, "request": 1}
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            output, _ = proc.communicate()
            return ChildResult("timeout", {}, f"killed after {timeout:.0f} s", output or "",
                               time.monotonic() - t0, iso)
        wall = time.monotonic() - t0
        if res_path.is_file():
            try:
                data = json.loads(res_path.read_text())
            except json.JSONDecodeError:
                return ChildResult("failed", {}, "the child's result is not JSON", output or "", wall, iso)
            problem = result_problem(data)
            if problem:
                return ChildResult("failed", {}, problem, output or "", wall, iso)
            return ChildResult(data["status"], data, str(data.get("error", "")), output or "", wall, iso)
        rc = proc.returncode
        what = f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc} and no result"
        return ChildResult("crashed" if rc < 0 else "failed", {}, what, output or "", wall, iso)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# -- the reference bundle's SASS -----------------------------------------------------------------------------
def sass_from_ptx(root: str | os.PathLike, arch: str) -> str | None:
    """Give a bundle that holds PTX but neither SASS nor a cubin both, assembled by ``ptxas -arch=arch``.

    Returns a note for the progress line (None when nothing was needed)."""
    from mosaic.bundle import load_bundle
    from mosaic.toolchain import ptxas
    from mosaic.toolchain.nvdisasm import disassemble
    from mosaic.toolchain.tools import find_tool, version_line

    b = load_bundle(root)
    ptx = b.one("ptx")
    if b.one("sass") is not None or b.one("cubin") is not None or ptx is None:
        return None
    if find_tool("ptxas") is None:
        raise LiveError("the reference bundle has PTX but no SASS or cubin, and ptxas is not on PATH to "
                        "assemble it (the loop lifts SASS)", str(root))
    with tempfile.TemporaryDirectory(prefix="mosaic-ptxas-") as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        done = ptxas.assemble(ptx, arch, cubin)
        if not done.ok:
            raise LiveError(f"ptxas could not assemble the reference's PTX: {tail(done.stderr) or done.message()}",
                            str(ptx))
        sass = disassemble(cubin)
        note = {"ptxas": version_line(done.exe), "arch": arch,
                "why": "the capture dumped PTX but no SASS/cubin; assembled here so the loop can lift it "
                       "(the compiler that built the timed kernel may have used other ptxas flags)"}
        update_bundle(root, files={"kernel.cubin": ("cubin", cubin), "kernel.sass": ("sass", sass),
                                   "ptxas-from-ptx.log": ("log", done.stdout + done.stderr)},
                      extra={"sass_from_ptx": note})
    return f"SASS assembled from the captured PTX by {note['ptxas']}"


# -- the workbench --------------------------------------------------------------------------------------------
class LiveWorkbench:
    """Answers the loop on the GPU (see :mod:`mosaic.run.live`). ``out`` is the campaign directory."""

    kind = "live"

    def __init__(self, campaign, out: str | os.PathLike, *, progress: Callable[[str], None] | None = None,
                 timeouts: Timeouts | None = None, parallel: int | None = None, python: str | None = None,
                 worker_argv: list[str] | None = None, slot: int = 0, wait_options: Mapping[str, Any] | None = None,
                 gate_seeds: Sequence[int] | None = None):
        from mosaic import gate

        self.c = campaign
        # the gate's seeds: drawn from the OS's random source when the campaign starts (or as its journal header
        # recorded them: --resume); the inputs are made here from them, and no request to a kernel's process holds one
        self.gate_seeds = gate.campaign_seeds(gate_seeds)
        self._input_files: dict[str, str] = {}
        self.dir = Path(out)
        self.bundles = self.dir / "bundles"
        # slot: which GPU of a several-GPU campaign (the Ray executor); 0 is the primary. Another slot keeps its
        # own scratch, worker logs and reference bundle (reference-gpu<slot>.bundle) and captures no yardstick
        self.slot = int(slot)
        # scratch (lowerings in flight, gate bundles) lives in the user cache, never in the campaign directory
        # (one reverse campaign left 1.6 GB of it there): made on first use, removed by close()
        self._scratch: Path | None = None
        user_cache.cache_cap()  # a bad MOSAIC_CACHE_MAX: one line before the campaign starts
        self.progress = progress or (lambda line: None)
        # the long waits (lowerings, gates, timing sessions) shown on stderr while they last (mosaic.progress.Wait;
        # wait_options: its display options); off with --quiet (no progress), and in a Ray actor (the driver shows them)
        self.show_waits = progress is not None
        self.wait_options = dict(wait_options or {})
        if self.show_waits:
            from mosaic.progress import choose_backend

            choose_backend(self.wait_options.get("stream") or sys.stderr,
                           requested=self.wait_options.get("backend"))  # a bad MOSAIC_PROGRESS: one line, now
        self.timeouts = timeouts or Timeouts()
        self.parallel = parallel if parallel is not None else max(1, min(6, (os.cpu_count() or 2) // 2))
        self.python = python or sys.executable
        self.isolation = getattr(campaign, "isolation", "worker")
        # the float64 reference, computed once per problem: under the cache root, not the campaign directory (a
        # 16384 x 8192 one is 2 GiB); its key is verified on every read, so campaigns and --resume share it
        self.oracle_cache = user_cache.cache_root() / "oracle"
        # the worker's output, the one thing of the run a user may want to read afterwards: DIR/logs/worker-N.log
        self.workers = Workers(self.dir / "logs" / (f"gpu-{self.slot}" if self.slot else ""), self.python,
                               argv=worker_argv)
        self.checked: dict[str, Checked] = {}
        self.yard_runs: list[YardstickRun] = []  # the family's yardsticks, as captured at the start
        self.prefetching: dict[str, tuple[subprocess.Popen, Path, Path, float]] = {}
        self.adopted: dict[str, Any] = {}  # key -> mosaic.run.executor.Lowered (lowered elsewhere: the Ray stage)
        self._gpu = None
        self._gate_note = ""
        self.seen: dict[str, list[float]] = {}  # seconds per request kind in this campaign ("reference", "check", "time")
        atexit.register(self.close)

    # -- helpers --------------------------------------------------------------------------------------------
    @property
    def work(self) -> Path:
        """This workbench's scratch directory under the user cache (:func:`mosaic.user_cache.make_scratch`)."""
        if self._scratch is None or not self._scratch.is_dir():
            self._scratch = user_cache.make_scratch(self.dir, f"gpu{self.slot}")
        return self._scratch

    @property
    def gpu(self):
        if self._gpu is None:
            from mosaic.plugins import host

            self._gpu = host().get("gpus", self.c.gpu)
        return self._gpu

    def dest(self, key: str) -> Path:
        if key == REFERENCE:
            return self.bundles / (f"reference-gpu{self.slot}.bundle" if self.slot else "reference.bundle")
        if is_yardstick(key):  # _capture_yardstick's bundle (a candidate key is a hex digest: never this name)
            return self.bundles / f"{key}.bundle"
        return self.bundles / f"cand-{key}.bundle"

    def _reference_meta(self, **more) -> dict:
        from mosaic.run.executor import gpu_identity

        if not self.slot:  # the GPU is named so that a several-GPU campaign's offline re-decision finds its noise
            return run_meta(REFERENCE, "reference", gpu=gpu_identity(), **more)
        return run_meta(f"{REFERENCE}-gpu{self.slot}", "reference-gpu", gpu=gpu_identity(), **more)

    def bundle_path(self, key: str) -> str | None:
        p = self.dest(key)
        return str(p) if p.is_dir() else None

    def cost(self, key: str) -> float:
        """The cost recorded in the kernel's bundle (what the offline re-decision will count)."""
        from mosaic.bundle import read_manifest

        return float(read_manifest(self.dest(key))["mosaic_run"].get("cost_s", 0.0))

    def spent_s(self) -> float:
        """Device seconds this campaign has spent: the costs its bundles record (the figures the loop adds up;
        the yardstick's are inside the reference's)."""
        from mosaic.bundle import read_manifest

        total = 0.0
        for b in sorted(self.bundles.glob("*.bundle")) if self.bundles.is_dir() else ():
            if is_yardstick(b.name.removesuffix(".bundle")):
                continue
            try:
                total += float((read_manifest(b).get("mosaic_run") or {}).get("cost_s", 0.0))
            except (MosaicError, OSError, ValueError, TypeError):
                continue
        return total

    def _seed_seen(self) -> None:
        """A resumed campaign's earlier requests (replayed, never asked here) from its bundles: the reference
        capture's seconds and every gate that was not killed."""
        from mosaic.bundle import read_manifest

        self._seeded = True
        for b in sorted(self.bundles.glob("*.bundle")) if self.bundles.is_dir() else ():
            try:
                m = read_manifest(b)
            except (MosaicError, OSError, ValueError, TypeError):
                continue
            run = m.get("mosaic_run") or {}
            cap = m.get("capture") or {}
            part = (run.get("cost_parts") or {}).get("reference_capture_s")
            if run.get("role") == "reference" and isinstance(part, (int, float)) and "reference" not in self.seen:
                self.seen["reference"] = [float(part)]
            elif cap.get("gate") and cap.get("status") != "timeout" and isinstance(cap.get("wall_s"), (int, float)):
                self.seen.setdefault("check", []).append(float(cap["wall_s"]))

    def _limit(self, kind: str, budgeted: bool = True) -> tuple[float, str, bool]:
        """(seconds, why, by_budget) for the next ``kind`` request: the scaled timeout, cut to what is left of
        the device-minute budget when that is less and ``budgeted`` (then a request still running at the limit is
        killed and the loop, adding its seconds, stops on 'budget')."""
        if not getattr(self, "_seeded", False):
            self._seed_seen()
        limit, why = self.timeouts.scaled(kind, self.seen)
        left = self.c.budget_min * 60 - self.spent_s()
        if budgeted and left < limit:
            return max(1.0, left), f"what is left of the {self.c.budget_min:g} device-minute budget", True
        return limit, why, False

    def _observe(self, kind: str, r: ChildResult) -> None:
        if r.status != "timeout":
            self.seen.setdefault(kind, []).append(float(r.wall_s))

    def close(self) -> None:
        for proc, *_ in self.prefetching.values():
            if proc.poll() is None:
                _kill_group(proc)
                proc.wait()
        self.prefetching.clear()
        self.workers.close()
        scratch, self._scratch = self._scratch, None
        user_cache.remove_scratch(scratch)

    def _waiting(self, desc: str, limit_s: float | None = None, why: str = "", note: str = "",
                 since: float | None = None):
        """The display of one wait (a context manager), quiet when this workbench shows none."""
        from mosaic.progress import Wait

        return Wait(desc, limit_s=limit_s, why=why, note=note, since=since, quiet=not self.show_waits,
                    **self.wait_options)

    # -- one request: a fresh child (isolation "step") or the persistent worker ------------------------------
    def _serve(self, request: Mapping[str, Any], timeout: float, problem: Callable[[ChildResult], str],
               what: str, before_retry: Callable[[], Any] | None = None, limit_why: str = "",
               desc: str | None = None) -> ChildResult:
        """Answer ``request`` in the campaign's isolation mode. Worker: any answer with a ``problem`` (a
        failure, a gate that did not pass: the text says which) retires the worker; when that worker had served earlier
        requests and the failure is not a timeout, the request is asked once more of a fresh worker and
        that answer is the record, with the first attempt kept in ``isolation.first_attempt`` (both attempts'
        seconds are its cost). ``desc`` (default ``what``) and ``limit_why`` name the wait while it is shown
        (:meth:`_waiting`). For a timing session the fresh answer stands (the kernel is not blamed for what
        an earlier one left behind); a gate that failed first is never turned into a pass by the retry
        (``_gate``): a kernel whose verdict depends on what ran before it is rejected, the retry is evidence."""
        desc = desc or what
        if self.isolation == "step":
            with self._waiting(desc, timeout, limit_why, "its own process"):
                return run_child(request, timeout, argv=[self.python, "-m", CHILD_MODULE])
        with self._waiting(desc, timeout, limit_why, "the worker"):
            r = self.workers.serve(request, timeout)
        why = problem(r)
        if not why:
            return r
        self.workers.retire(f"{what}: {why}")  # no-op when serve already did
        if r.status == "timeout" or r.isolation.get("request", 1) <= 1:
            self.workers.start()  # the next one boots while the loop records this and moves on
            return r
        self.progress(f"{what}: {why} in a reused worker (pid {r.isolation.get('pid')}, request "
                      f"{r.isolation.get('request')}); asking a fresh worker before recording it")
        if before_retry is not None:  # nothing of the first attempt's files stays with the record
            before_retry()
        with self._waiting(desc, timeout, limit_why, "asked again of a fresh worker"):
            again = self.workers.serve(request, timeout)
        if problem(again):
            self.workers.retire(f"{what}: {problem(again)}")
            self.workers.start()
        first = {"status": r.status, "problem": why, "pid": r.isolation.get("pid"),
                 "request": r.isolation.get("request"), "wall_s": round(r.wall_s, 3)}
        return attrs.evolve(again, wall_s=r.wall_s + again.wall_s,
                            isolation={**again.isolation, "first_attempt": first})

    def _iso_text(self, r: ChildResult) -> str:
        i = r.isolation
        if i.get("mode") != "worker":
            return f"own process {i.get('pid')}"
        made = ", ".join(f"{v}" for v in (i.get("prepared") or {}).values())
        return f"worker pid {i.get('pid')} request {i.get('request')}" + (f"; kernels {made}" if made else "")

    # -- reference and yardstick ----------------------------------------------------------------------------
    def capture_reference(self, spec: KernelSpec) -> ReferenceCapture:
        from mosaic.bundle import load_bundle
        from mosaic.capture import CaptureOptions, capture

        dest = self.dest(REFERENCE)
        pairs = self.c.noise_blocks // 2
        self.progress(f"reference {spec.language} ({knob_label(spec)}): capture in its own process "
                      f"({pairs} interleaved self-pairs x {self.c.runs_per_block} runs)")
        if self.isolation == "worker":  # it imports while the reference is captured; it touches no GPU yet
            self.workers.start()
        t0 = time.monotonic()
        opts = CaptureOptions(blocks=pairs, runs=self.c.runs_per_block, timeout=self.timeouts.reference)
        if getattr(self.c, "reference", None):  # the reference is a kernel file (--reference FILE)
            from mosaic.kernel_files import capture_file, check_campaign_file

            kfile = check_campaign_file(self.c.reference, spec.language, spec.family, "reference")
            spec = attrs.evolve(spec, knobs=kfile.knob_values(spec.knobs), name=kfile.name)
            with self._waiting(f"the reference capture ({kfile.name})", opts.timeout, "the reference capture's cap",
                               "its own process"):
                res = capture_file(kfile, spec, self.c.gpu, dest, opts, extra=self._reference_meta())
        else:
            with self._waiting(f"the reference capture ({spec.language}: {knob_label(spec)})", opts.timeout,
                               "the reference capture's cap", "its own process"):
                res = capture(spec, self.c.gpu, dest, opts, extra=self._reference_meta(),
                              oracle_cache=self.oracle_cache)  # the yardstick reads it back
        cost = time.monotonic() - t0
        self.seen.setdefault("reference", []).append(cost)  # what the first gate's and timing's limits scale from
        if res.status != "ok":
            raise LiveError(f"the reference capture ended '{res.status}': {res.message or 'see capture.log'}",
                            str(res.bundle or dest))
        note = sass_from_ptx(dest, self.gpu.arch)
        if note:
            self.progress(f"reference: {note}")
        parts = {"reference_capture_s": round(cost, 3)}
        if self.c.yardstick and not self.slot:
            parts["yardstick_s"] = round(self._capture_yardsticks(spec), 3)
        total = sum(parts.values())
        update_bundle(dest, extra=self._reference_meta(cost_s=total, cost_parts=parts))
        b = load_bundle(dest)
        blocks = blocks_of((b.read_json("timings") or {}).get("blocks"))
        return ReferenceCapture(Kernel(REFERENCE, b.kernel, None, str(dest)), blocks, round(total, 3))

    def _capture_yardsticks(self, ref_spec: KernelSpec) -> float:
        """Every yardstick of the family, each in its own process (:meth:`_capture_yardstick`); their seconds
        (the reference's cost holds them)."""
        from mosaic.families import get

        fam = get(ref_spec.family)
        total = 0.0
        self.yard_runs = []
        for i, yard in enumerate(fam.yardsticks if fam is not None else ()):
            run, wall = self._capture_yardstick(ref_spec, yard, yardstick_key(yard.name, first=i == 0))
            self.yard_runs.append(run)
            total += wall
        return total

    def _capture_yardstick(self, ref_spec: KernelSpec, yard, key: str) -> tuple[YardstickRun, float]:
        """One yardstick, captured alone in its own process into ``bundles/<key>.bundle``: (its run, seconds).
        One that cannot run (a format it does not take: no process is started; its library does not import; the
        oracle fails it; it crashes or hangs) keeps a bundle that says why (``mosaic_run.unmeasured``), which the
        offline re-decision reads back."""
        from mosaic.bundle import load_bundle, save_bundle
        from mosaic.capture import CaptureOptions
        from mosaic.families import yardstick_problem

        yard, spec = yardstick_spec(ref_spec, yard)
        title = yard.title or yard.name
        dest = self.dest(key)
        shutil.rmtree(dest, ignore_errors=True)
        problem = yardstick_problem(yard, spec.dtype)
        if problem is not None:
            save_bundle(dest, kernel=spec, language=spec.language, files={"yardstick.log": ("log", problem + "\n")},
                        gpu=self.c.gpu, overwrite=True)
            update_bundle(dest, extra=yardstick_meta(key, yard.name, 0.0, ("dtype", problem)))
            return YardstickRun(key, yard.name, title, None, "dtype", problem), 0.0
        opts = CaptureOptions(blocks=max(5, self.c.rounds), runs=self.c.runs_per_block,
                              timeout=self.timeouts.yardstick)
        self.progress(f"yardstick {title} ({yard.call}): capture in its own process")
        with self._waiting(f"the yardstick {title}", opts.timeout, "the yardstick's cap", "its own process"):
            r = run_child({"mode": "check", "spec": spec.to_json(), "gpu": self.c.gpu, "out": str(dest.resolve()),
                           "options": attrs.asdict(opts), "extra": yardstick_meta(key, yard.name),
                           "oracle_cache": str(self.oracle_cache.resolve())},
                          opts.timeout, argv=[self.python, "-m", CHILD_MODULE])
        missing = unmeasured_reason(r)
        blocks = None
        if missing is None and dest.is_dir():
            blocks = blocks_of((load_bundle(dest).read_json("timings") or {}).get("blocks")) or None
            if blocks is None:
                missing = ("failed", "the capture recorded no timings")
        elif missing is None:
            missing = ("failed", "the capture wrote no bundle")
        if not dest.is_dir():  # the child died before its capture wrote one: a bundle that says why
            save_bundle(dest, kernel=spec, language=spec.language, overwrite=True, gpu=self.c.gpu,
                        files={"yardstick.log": ("log", f"{missing[1]}\n--- child output ---\n{r.output[-8000:]}")})
        update_bundle(dest, extra=yardstick_meta(key, yard.name, r.wall_s, missing))
        return YardstickRun(key, yard.name, title, blocks, *(missing or ("", ""))), r.wall_s

    def yardsticks(self, spec: KernelSpec, rounds: int) -> list[YardstickRun]:
        """What :meth:`capture_reference` captured of the family's yardsticks (none when it did not run here)."""
        return list(self.yard_runs)

    def yardstick(self, spec: KernelSpec, rounds: int):
        first = next((y for y in self.yard_runs if y.key == YARDSTICK), None)
        return first.blocks if first is not None and first.measured else None

    def _yardstick_run(self, key: str) -> YardstickRun | None:
        """The measured yardstick ``key``: captured here, or (a resumed campaign, whose captures ran before) read
        back from its bundle."""
        run = next((y for y in self.yard_runs if y.key == key), None)
        if run is not None or not self.dest(key).is_dir():
            return run if run is not None and run.measured else None
        from mosaic.bundle import load_bundle

        try:
            b = load_bundle(self.dest(key))
            meta = b.manifest.get("mosaic_run") or {}
            blocks = blocks_of((b.read_json("timings") or {}).get("blocks"))
        except (MosaicError, OSError, ValueError, TypeError, KeyError):
            return None
        if meta.get("role") != "yardstick" or meta.get("unmeasured") is not None or not blocks:
            return None
        return YardstickRun(key, b.language, b.language, blocks)

    def pair_yardstick(self, kernel: Kernel, rounds: int, key: str = YARDSTICK) -> Timed | None:
        """The yardstick ``key`` timed against ``kernel`` in interleaved rounds (``kernel`` first, A B A B, in the
        worker, where ``kernel`` is already compiled); the yardstick's bundle keeps the session, against
        ``kernel``'s key, so no candidate bundle's cost grows after its step (the offline re-decision counts a
        bundle's whole cost at its build). None when that yardstick was not measured."""
        from mosaic.families import get

        run = self._yardstick_run(key)
        fam = get(kernel.spec.family)
        yard = fam.yardstick(run.name) if run is not None and fam is not None else None
        if yard is None:
            return None
        _, spec = yardstick_spec(kernel.spec, yard)
        try:
            return self.time(kernel, Kernel(key, spec, None), rounds)
        except MosaicError as exc:  # the campaign's verdicts stand; the report then prints the standalone figure
            self.progress(f"the pairing of {kernel.key} with the yardstick {yard.title or yard.name} was not "
                          f"measured: {exc.line()}")
            return None

    # -- prefetch ---------------------------------------------------------------------------------------------
    def prefetch(self, kernels: Iterable[Kernel]) -> None:
        """Start lowering these kernels in the background (GPU hidden), up to ``parallel`` at once."""
        for k in kernels:
            active = sum(1 for p, *_ in self.prefetching.values() if p.poll() is None)
            if active >= self.parallel:
                return
            if (k.source is not None or k.spec.language not in PREFETCH_LANGUAGES or k.key in self.prefetching
                    or self.dest(k.key).is_dir()):
                continue
            self._start_lower(k)

    def _start_lower(self, k: Kernel) -> None:
        from mosaic.capture import CaptureOptions

        tmp = self.work / "prefetch" / k.key
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        out, res = tmp / "lowered.bundle", tmp / "result.json"
        req = tmp / "request.json"
        req.write_text(json.dumps({"spec": k.spec.to_json(), "gpu": self.c.gpu, "out": str(out.resolve()),
                                   "options": attrs.asdict(CaptureOptions(lower_only=True,
                                                                          timeout=self.timeouts.lower)),
                                   "result": str(res.resolve()), "extra": None}))
        proc = subprocess.Popen([self.python, "-m", "mosaic.capture", str(req)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        self.prefetching[k.key] = (proc, out, res, time.monotonic())
        self.progress(f"prefetch: lowering {k.key} ({knob_label(k.spec)}) in the background")

    def adopt(self, key: str, lowered) -> None:
        """A lowering done elsewhere (:class:`mosaic.run.executor.Lowered`, the Ray executor's lowering stage):
        ``build`` takes it instead of lowering again."""
        self.adopted[key] = lowered

    def _lower(self, k: Kernel) -> tuple[str, str, dict]:
        """Lower ``k`` into its bundle; (status, message, capture record)."""
        from mosaic.bundle import load_bundle
        from mosaic.capture import CaptureOptions, capture

        dest = self.dest(k.key)
        lowered = self.adopted.pop(k.key, None)
        if lowered is not None and lowered.payload is not None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            lowered.unpack(dest)
            return lowered.status, lowered.message, load_bundle(dest).manifest.get("capture") or {}
        job = self.prefetching.pop(k.key, None)
        if job is not None:
            proc, out, res, started = job
            left = max(1.0, self.timeouts.lower - (time.monotonic() - started))
            try:
                with self._waiting(f"lowering {k.key} ({knob_label(k.spec)})", self.timeouts.lower,
                                   "the lowering cap", "in the background since it was prefetched", since=started):
                    proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
            if res.is_file() and out.is_dir():
                data = json.loads(res.read_text())
                if dest.exists():
                    shutil.rmtree(dest)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(out, dest)  # the scratch and the campaign directory may be on different file systems
                shutil.rmtree(out.parent, ignore_errors=True)
                return data["status"], data.get("message", ""), load_bundle(dest).manifest.get("capture") or {}
            shutil.rmtree(out.parent, ignore_errors=True)  # the prefetch died: lower here instead
        with self._waiting(f"lowering {k.key} ({knob_label(k.spec)})", self.timeouts.lower, "the lowering cap",
                           "its own process"):
            r = capture(k.spec, self.c.gpu, dest, CaptureOptions(lower_only=True, timeout=self.timeouts.lower))
        return r.status, r.message, (load_bundle(r.bundle).manifest.get("capture") or {}) if r.bundle else {}

    # -- build (+ the numerics gate) ------------------------------------------------------------------------
    def build(self, kernel: Kernel) -> Built:
        from mosaic.bundle import load_bundle, save_bundle

        dest = self.dest(kernel.key)
        t0 = time.monotonic()
        if kernel.source is not None:  # a source edit: built by its language's kernel-file backend
            from mosaic.capture import CaptureOptions
            from mosaic.kernel_files import lower_source

            self.progress(f"build {kernel.key} ({kernel.spec.language}: edited source)")
            with self._waiting(f"lowering {kernel.key} (edited source)", self.timeouts.lower, "the lowering cap",
                               "its own process"):
                r = lower_source(kernel.spec, kernel.source, self.c.gpu, dest,
                                 CaptureOptions(lower_only=True, timeout=self.timeouts.lower))
            status, message = r.status, r.message
            record = (load_bundle(r.bundle).manifest.get("capture") or {}) if r.bundle else {}
        else:
            self.progress(f"build {kernel.key} ({kernel.spec.language}: {knob_label(kernel.spec)})"
                          + (" (prefetched)" if kernel.key in self.prefetching else ""))
            status, message, record = self._lower(kernel)
        t_lower = time.monotonic() - t0
        if status != "lowered":
            reason = f"{status}: {message}" if status != "unbuildable" else message
            if not dest.is_dir():
                save_bundle(dest, kernel=kernel.spec, language=kernel.spec.language,
                            files={"build.log": ("log", reason)}, gpu=self.c.gpu, overwrite=True)
            update_bundle(dest, extra=run_meta(kernel.key, "candidate", False, reason, t_lower))
            return Built(kernel.key, False, reason, "unbuildable", str(dest), self.cost(kernel.key))
        update_bundle(dest, extra={**run_meta(kernel.key, "candidate", True, "", t_lower, lower_wait_s=round(t_lower, 3)),
                                   "lowering": record})
        checked = self._cpu_gate(kernel, dest)
        if checked is None:  # no CPU stage for this candidate, or it passed: the device's gate
            where = "its own process" if self.isolation == "step" else "the worker"
            self.progress(f"build {kernel.key}: lowered in {t_lower:.1f} s; numerics gate in {where}")
            checked = self._gate(kernel, dest)
        self.checked[kernel.key] = checked
        self.progress(f"gate {kernel.key}: {'pass' if checked.passed else 'FAIL'}"
                      + ("" if checked.passed else f" ({checked.reason}); never timed") + f" ({self._gate_note})")
        # the gate's cost is part of the build step: one figure, the bundle's, for live and offline alike
        return Built(kernel.key, True, "", "", str(dest), self.cost(kernel.key))

    def inputs_file(self, shape: Mapping[str, int], seed: int, values: str) -> str:
        """The family's inputs for (shape, seed, values), made in this process and written once per campaign to
        the scratch (``inputs/<random name>.npz``): what a gate's or a timing session's request names instead of
        a seed."""
        import secrets

        import numpy as np

        from mosaic.families import make_inputs

        key = json.dumps([dict(shape), int(seed), values], sort_keys=True)
        if key not in self._input_files or not Path(self._input_files[key]).is_file():
            spec = KernelSpec(family=self.c.family, shape=dict(shape), dtype=self.c.dtype, language="inputs", knobs={})
            path = self.work / "inputs" / f"{secrets.token_hex(8)}.npz"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, **make_inputs(spec, int(seed), values))
            self._input_files[key] = str(path.resolve())
        return self._input_files[key]

    def _domain(self, kernel: Kernel, spec: KernelSpec):
        """(granules, allowed, why not) of the candidate's domain for the unseen shapes: a kernel file's
        ``MULTIPLE_OF``; a template's ``can_implement`` (its knob class's ``DEPENDENCIES.check``) as a predicate;
        neither: no unseen shape (``why not`` says so)."""
        from mosaic.plugins import host
        from mosaic.proposers.dependencies import dependencies_of

        if kernel.source is not None:
            from mosaic.kernel_files import write_source

            with tempfile.TemporaryDirectory(prefix="mosaic-domain-") as tmp:
                try:
                    kfile = write_source(spec, kernel.source, tmp)
                except MosaicError as exc:
                    return None, None, f"the kernel file's contract is unreadable here: {exc.line()}"
            own = {k: v for k, v in dict(spec.knobs).items() if kfile.knob(k) is not None}
            return kfile.granules(own), None, ""
        try:
            knob_cls = host().get("languages", spec.language).backend.knobs(spec.family)
        except (MosaicError, AttributeError) as exc:
            return None, None, f"no knob class for {spec.language} {spec.family}: {exc}"
        deps = dependencies_of(knob_cls)
        if deps is None or deps.check is None:
            return None, None, f"the {spec.language} template declares no domain (no can_implement)"
        knobs = knob_cls(**dict(spec.knobs))
        gpu = self.gpu

        def allowed(shape: Mapping[str, int]) -> str | None:
            try:
                found = deps.check(knobs, attrs.evolve(spec, shape=dict(shape)), gpu)
            except Exception as exc:  # noqa: BLE001 - a predicate that cannot judge a shape refuses it
                return f"{type(exc).__name__}: {exc}"
            return "; ".join(d.line() for d in found) or None

        return {}, allowed, ""

    def _device_cases(self, kernel: Kernel, spec: KernelSpec, dest: Path):
        """The device gate's cases after its capture (:func:`mosaic.gate.device_plan`): the campaign's shape with
        the second seed, two unseen shapes inside the candidate's domain x both seeds x every distribution; run in
        the worker (``cases``), judged here. (verdict or None when no case is left, the plan's record, seconds,
        the limit when the budget cut the request, else None). The request's limit is the gate's scaled limit
        times the cases over 4 (each case prepares the kernel again; a compile per unseen shape), at most 3 x
        the gate's cap, or what is left of the budget."""
        from mosaic import gate
        from mosaic.oracle import check as oracle_check
        from mosaic.oracle.cache import ReferenceCache
        from mosaic.run.live.protocol import read_inputs

        granules, allowed, why_not = self._domain(kernel, spec)
        if granules is None and allowed is None:  # no domain known: no unseen shape (each draw refused, said so)
            allowed = lambda shape: why_not  # noqa: E731
        plan, missing = gate.device_plan(spec.family, spec.shape, spec.dtype, self.gate_seeds, granules or {},
                                         allowed=allowed)
        record = {"plan": plan.to_json(), "missing": missing, "domain": (
            why_not or ("MULTIPLE_OF " + json.dumps(granules) if granules else "can_implement" if allowed else
                     "any size (the kernel file declares no MULTIPLE_OF)"))}
        extra = list(plan.cases[1:])
        if not extra:
            return None, record, 0.0, None
        work = self.work / "cases" / kernel.key
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        files = [self.inputs_file(c.shape, c.seed, c.values) for c in extra]
        base, limit_why, _ = self._limit("check", budgeted=False)
        limit = min(3 * self.timeouts.check, base * max(1.0, len(extra) / 4))
        limit_why = f"{limit_why}, x {max(1.0, len(extra) / 4):g} for {len(extra)} cases"
        left = self.c.budget_min * 60 - self.spent_s()
        by_budget = left < limit
        if by_budget:
            limit, limit_why = max(1.0, left), f"what is left of the {self.c.budget_min:g} device-minute budget"
        self.progress(f"gate {kernel.key}: {len(extra)} more cases on the device ({len(plan.shapes)} shapes x "
                      f"{len(plan.seeds)} seeds x distributions)")
        r = self._serve({"mode": "cases", "spec": spec.to_json(), "source": kernel.source, "gpu": self.c.gpu,
                         "work": str(work.resolve()), "cases": [{"shape": dict(c.shape), "inputs": f}
                                                                for c, f in zip(extra, files, strict=True)]},
                        limit, lambda r: "" if r.status == "ok" else f"{r.status}: {r.message or tail(r.output)}",
                        f"gate cases {kernel.key}", limit_why=limit_why,
                        desc=f"the numerics gate's unseen shapes of {kernel.key}")
        if r.status == "timeout" and by_budget:  # no verdict: the budget ran out with the cases in flight
            shutil.rmtree(work, ignore_errors=True)
            record["cut"] = {"s": round(limit, 3), "why": limit_why}
            return None, record, r.wall_s, limit
        records = list(r.data.get("cases") or []) if r.status == "ok" else \
            [{"error": f"{r.status}: {r.message or tail(r.output)}"}]
        outputs = []
        for i in range(len(extra)):
            p = work / f"outputs-{i}.npz"
            outputs.append(read_inputs(p) if p.is_file() else None)
        cache = ReferenceCache(self.oracle_cache)
        verdict = gate.judge_cases(plan, [read_inputs(f) for f in files], records, outputs,
                                   lambda fam, ins, outs, dt: oracle_check(fam, ins, outs, dt, cache=cache), skip=1)
        shutil.rmtree(work, ignore_errors=True)
        record["verdict"] = attrs.evolve(verdict, wall_s=r.wall_s).to_json()
        return verdict, record, r.wall_s, None

    def _cpu_gate(self, kernel: Kernel, dest: Path) -> Checked | None:
        """A source candidate in a language that runs kernel files on the CPU (Pallas: jax's GPU interpreter with
        its race detector) meets the gate's CPU stage first (:func:`mosaic.gate.cpu_stage`: three shapes, two
        seeds drawn for it, every distribution, the campaign directory watched). A rejection is the gate's verdict,
        recorded in the bundle (``gate-cpu.json``), and the device never runs the kernel; None when there is no CPU
        stage here or it passed."""
        from mosaic import gate
        from mosaic.errors import MosaicError
        from mosaic.kernel_files import write_source

        # what the loop does not write while a build runs (prefetched lowerings write candidate bundles beside
        # it): the journal and the reference's bundle
        guard = [self.dir / "journal.jsonl", self.dest(REFERENCE)]
        if kernel.source is None:  # a template candidate: where its backend runs it in the interpreter
            if gate.template_interprets(kernel.spec.language, kernel.spec.family) is None:
                return None
            self.progress(f"gate {kernel.key}: the CPU stage first ({kernel.spec.language} template in the "
                          "interpreter, a child process)")
            v = gate.template_stage(kernel.spec.language, kernel.spec.family, kernel.spec.dtype, kernel.spec.knobs,
                                    self.gpu, guard=guard, progress=self.progress)
            return self._cpu_verdict(kernel, dest, v)
        with tempfile.TemporaryDirectory(prefix="mosaic-cpu-gate-") as tmp:
            try:
                kfile = write_source(kernel.spec, kernel.source, tmp)
            except MosaicError:
                return None  # the lowering read it; what it could not is the device gate's to report
            if not gate.interprets(kfile, kernel.spec.language):
                return None
            self.progress(f"gate {kernel.key}: the CPU stage first ({kernel.spec.language} interpreter, a child process)")
            v = gate.cpu_stage(kfile, kernel.spec.language, kernel.spec.family, kernel.spec.dtype, kernel.spec.knobs,
                               guard=guard, progress=self.progress)
        return self._cpu_verdict(kernel, dest, v)

    def _cpu_verdict(self, kernel: Kernel, dest: Path, v) -> Checked | None:
        """Record the CPU stage's verdict in the bundle (``gate-cpu.json``); a rejection is the gate's verdict."""
        from mosaic.bundle import load_bundle

        record = {"gate-cpu.json": ("metrics", json.dumps(v.to_json(), indent=1))}
        meta = dict(load_bundle(dest).manifest["mosaic_run"])  # the stage's seconds are held-device seconds too
        meta["cost_s"] = round(float(meta.get("cost_s", 0.0)) + v.wall_s, 3)
        if v.unavailable or v.passed:
            update_bundle(dest, files=record, extra={"mosaic_run": meta})
            self.progress(f"gate {kernel.key}: CPU stage {v.reason()} ({v.wall_s:.1f} s)")
            return None
        reason = f"rejected by the gate's CPU stage before any hardware: {v.reason()}"
        update_bundle(dest, files=record, extra={
            "mosaic_run": meta,
            "capture": {"status": "numerics-failed", "lower_only": False, "gate": True, "stage": "cpu",
                        "message": reason, "summary": {"numerics_pass": False, "gate_cpu": v.first.to_json()},
                        "wall_s": round(v.wall_s, 3)}})
        self._gate_note = f"CPU stage, {v.wall_s:.1f} s"
        return Checked(kernel.key, False, reason, 0.0)

    def _gate(self, kernel: Kernel, dest: Path) -> Checked:
        """Poison, one run, float64 oracle (capture's ``check_and_time``, one short self-pair for the launch
        record) in a child; its files and verdict are merged into the kernel's bundle."""
        from mosaic.bundle import load_bundle
        from mosaic.capture import CaptureOptions

        spec = kernel.spec
        small = self.c.check_shape is not None and dict(self.c.check_shape) != dict(spec.shape)
        if small:
            spec = attrs.evolve(spec, shape=dict(self.c.check_shape))
        limit, limit_why, by_budget = self._limit("check")
        seed = self.gate_seeds[0]
        opts = CaptureOptions(blocks=1, runs=5, warmup=3, timeout=limit, seed=seed, values="normal",
                              max_array_bytes=0 if small else CaptureOptions().max_array_bytes)
        inputs = self.inputs_file(spec.shape, seed, "normal")  # made here: the request names a file, not the seed
        tmp = self.work / "gate" / f"{kernel.key}.bundle"
        shutil.rmtree(tmp, ignore_errors=True)

        def problem(r: ChildResult) -> str:
            if r.status != "ok":
                return f"{r.status}: {r.message or tail(r.output)}"
            cap = r.data.get("capture") or {}
            if cap.get("status") != "ok" or not (cap.get("summary") or {}).get("numerics_pass"):
                return f"the gate ended '{cap.get('status')}': {cap.get('message') or 'numerics'}"
            return ""

        r = self._serve({"mode": "check", "spec": spec.to_json(), "source": kernel.source, "gpu": self.c.gpu,
                         "out": str(tmp.resolve()), "options": {**attrs.asdict(opts), "seed": 0}, "extra": None,
                         "inputs": {"path": inputs}, "oracle_cache": str(self.oracle_cache.resolve())},
                        opts.timeout, problem,
                        f"gate {kernel.key}", before_retry=lambda: shutil.rmtree(tmp, ignore_errors=True),
                        limit_why=limit_why, desc=f"the numerics gate of {kernel.key}")
        self._observe("check", r)
        cap = r.data.get("capture", {}) if r.status == "ok" else {}
        status = cap.get("status", r.status)
        summary = dict(cap.get("summary") or {})
        passed = status == "ok" and bool(summary.get("numerics_pass"))
        if passed:
            reason = "passed the float64 oracle"
        elif status == "numerics-failed":
            reason = ("failed the float64 oracle" if not summary.get("numerics_pass", True)
                      else "output changed between runs (not deterministic)")
        elif status == "timeout" and by_budget:
            reason = (f"budget: killed after {limit:.0f} s, {limit_why}, with the gate in flight (no verdict on "
                      "the kernel's numerics)")
        elif status == "timeout":
            reason = f"hang: killed after {limit:.0f} s ({limit_why}); the worker was replaced"
        else:
            reason = f"{status} at run time: {cap.get('message') or r.message or tail(r.output)}"
        first = r.isolation.get("first_attempt")
        if passed and first:  # never overturned: a verdict that depends on what ran before is not a pass
            passed = False
            reason = (f"failed the gate in a reused worker (pid {first.get('pid')}, request {first.get('request')}: "
                      f"{first.get('problem')}) and passed in a fresh one: a kernel whose verdict depends on what "
                      "ran before it is not accepted")
        files: dict = {}
        if tmp.is_dir():
            g = load_bundle(tmp)
            for f in g.files:
                name = {"capture.log": "gate.log", "timings.json": "timings.json"}.get(f.path, f.path)
                if f.path == "inputs-meta.json":  # the seed the inputs were made from, recorded here (not there)
                    meta_in = json.loads(g.read_bytes(f.path, "json_bytes"))
                    files[name] = (f.role, json.dumps({**meta_in, "seed": seed, "values": "normal"}, indent=1))
                elif f.role in ("outputs", "inputs", "launch", "timings", "log") or f.path in (
                        "oracle.json", "outputs-meta.json"):
                    files[name] = (f.role, g.member(f.path))
        else:
            files["gate.log"] = ("log", f"gate {status}: {r.message}\n--- child output ---\n{r.output[-8000:]}")
        cost = r.wall_s
        if passed:  # the campaign's shape with the other seed, and two shapes it never saw: every case must pass
            cases, record, cases_s, cut = self._device_cases(kernel, spec, dest)
            cost += cases_s
            files["gate-device.json"] = ("metrics", json.dumps(record, indent=1))
            summary["gate_cases"] = {"shapes": record["plan"]["shapes"], "seeds": record["plan"]["seeds"],
                                     "cases": len(record["plan"]["cases"]), "missing": record["missing"],
                                     "passed": cases is None or cases.passed,
                                     "first": cases.first.to_json() if cases is not None and cases.first else None}
            if cut is not None:
                passed, status, by_budget, limit = False, "timeout", True, cut
                limit_why = record["cut"]["why"]
                reason = (f"budget: killed after {limit:.0f} s, {limit_why}, with the gate's other cases in flight "
                          "(no verdict on the kernel's numerics)")
                summary["gate_cases"]["passed"] = None
            elif cases is not None and not cases.passed:
                passed = False
                status = "numerics-failed"
                reason = f"failed the device gate: {cases.reason()}"
                if self.isolation == "worker":  # a failing kernel may have corrupted the context
                    self.workers.retire(f"gate cases {kernel.key}: {cases.reason()}")
                    self.workers.start()
        summary["numerics_pass"] = passed
        from mosaic.bundle import load_bundle as _lb

        meta = dict(_lb(dest).manifest["mosaic_run"])
        meta["cost_s"] = round(float(meta.get("cost_s", 0.0)) + cost, 3)
        update_bundle(dest, files=files, extra={
            "mosaic_run": meta,
            "capture": {"status": status, "lower_only": False, "gate": True, "options": attrs.asdict(opts),
                        "timeout": {"s": round(limit, 3), "why": limit_why, "budget": by_budget},
                        **({"message": reason} if status == "timeout" or "gate_cases" in summary and not passed
                           else {}),
                        "shape": dict(spec.shape), "summary": summary, "isolation": r.isolation,
                        "wall_s": round(cost, 3)}})
        ref = (summary.get("oracle_reference") or {}).get("source")
        self._gate_note = (f"{cost:.1f} s, {self._iso_text(r)}" + (f"; float64 reference {ref}" if ref else "")
                           + f"; limit {limit:.0f} s: {limit_why}")
        shutil.rmtree(tmp, ignore_errors=True)
        return Checked(kernel.key, passed, reason, 0.0, judged=not (status == "timeout" and by_budget))

    def check(self, kernel: Kernel, built: Built, reference: Kernel) -> Checked:
        if kernel.key in self.checked:
            return self.checked[kernel.key]
        from mosaic.bundle import load_bundle

        cap = load_bundle(self.dest(kernel.key)).manifest.get("capture") or {}
        summary = cap.get("summary") or {}
        cut = cap.get("status") == "timeout" and (cap.get("timeout") or {}).get("budget")
        if "numerics_pass" in summary and not cut:  # resume: the gate ran before the stop (a budget cut: gate again)
            ok = bool(summary["numerics_pass"])
            return Checked(kernel.key, ok, "recorded verdict of the gate" + ("" if ok else ": failed"))
        before = self.cost(kernel.key)
        checked = attrs.evolve(self._gate(kernel, self.dest(kernel.key)), cost_s=self.cost(kernel.key) - before)
        self.checked[kernel.key] = checked
        return checked

    # -- timing -----------------------------------------------------------------------------------------------
    def _label(self, key: str) -> str:
        """How progress lines name a kernel: its key, or a yardstick by its title."""
        if not is_yardstick(key):
            return key
        run = next((y for y in self.yard_runs if y.key == key), None)
        if run is not None:
            return f"the yardstick {run.title}"
        from mosaic.families import first_yardstick

        try:
            return f"the yardstick {first_yardstick(self.c.family).title}" if key == YARDSTICK else f"the {key}"
        except MosaicError:
            return "the yardstick"

    def time(self, incumbent: Kernel, kernel: Kernel, rounds: int) -> Timed:
        from mosaic.bundle import load_bundle

        ref_spec, ref_source = incumbent.spec, incumbent.source
        if incumbent.key == REFERENCE:  # as captured: a kernel file's reference is built from the bundle's copy
            ref_bundle = load_bundle(self.dest(REFERENCE))
            ref_spec, ref_source = ref_bundle.kernel, captured_file_source(ref_bundle)
        where = "one process" if self.isolation == "step" else "the worker"
        name = self._label(kernel.key)
        self.progress(f"time {name} against {incumbent.key}: {rounds} rounds x {self.c.runs_per_block} "
                      f"runs, interleaved A B A B, {where}")
        from mosaic.run.executor import gpu_identity

        gpu_at_start = gpu_identity()  # which device makes this verdict: index, UUID, clocks now
        # the yardstick's pairing at the stop is no step of the search: the budget does not cut it (it runs once, up to
        # its timeout, and its seconds are counted: a campaign stopped by its budget may end that much past it)
        limit, limit_why, by_budget = self._limit("time", budgeted=not is_yardstick(kernel.key))
        import secrets

        # the gate's inputs (its first seed: the runnable the gate prepared is the one timed), and after the session
        # the outputs of one timed run, the last of a round drawn here, go to the float64 oracle (the spot-check;
        # not for a yardstick's pairing, which judges no candidate)
        spot = None if is_yardstick(kernel.key) else {"round": secrets.randbelow(max(1, rounds)),
                                                      "oracle_cache": str(self.oracle_cache.resolve())}
        r = self._serve({"mode": "time", "gpu": self.c.gpu, "specs": [ref_spec.to_json(), kernel.spec.to_json()],
                         "sources": [ref_source, kernel.source],
                         "rounds": rounds, "runs": self.c.runs_per_block, "warmup": 10,
                         "inputs": {"path": self.inputs_file(kernel.spec.shape, self.gate_seeds[0], "normal")},
                         "spot_check": spot, "flush": True, "timer": "cupti"}, limit,
                        lambda r: "" if r.status == "ok" else f"{r.status}: {r.message or tail(r.output)}",
                        f"time {name}", limit_why=limit_why,
                        desc=f"timing {name} against {incumbent.key} ({rounds} rounds)")
        self._observe("time", r)
        if r.status == "timeout":
            what = "budget" if by_budget else "hang"
            raise LiveError(f"{what}: timing {name} against {incumbent.key} killed after {limit:.0f} s "
                            f"({limit_why}); the journal holds every step before it (mosaic run --resume "
                            f"{self.dir} retries)", "mosaic run")
        if r.status != "ok":
            raise LiveError(f"timing {name} against {incumbent.key} {r.status}: "
                            f"{r.message or tail(r.output)}; the journal holds every step before it "
                            f"(mosaic run --resume {self.dir} retries)", "mosaic run")
        d = r.data
        session = {"gpu": gpu_at_start, "against": incumbent.key, "order": "ABAB", "incumbent_blocks": d["blocks"][0],
                   "candidate_blocks": d["blocks"][1], "timer": d["timer"],
                   "fallback_reason": d.get("fallback_reason", ""), "rounds": rounds,
                   "runs": self.c.runs_per_block, "flush": d.get("flush"), "serialized": d.get("serialized"),
                   "kernels_per_run": d.get("kernels_per_run"), "launch": d.get("launch"),
                   "kernel_names": d.get("kernel_names"), "clocks": d.get("clocks"),
                   "power_rounds": d.get("power_rounds"),
                   "outputs_sha256": d.get("outputs_sha256"), "wall_s": round(r.wall_s, 3),
                   "isolation": r.isolation, "inputs": {"seed": self.gate_seeds[0], "values": "normal"}}
        spot_record = d.get("spot_check") if isinstance(d.get("spot_check"), Mapping) else None
        if spot is not None:  # asked: a session that answers none has no spot-check to pass
            spot_record = dict(spot_record or {"passed": False, "reason": "the timing session returned no spot-check"})
            session["spot_check"] = spot_record
        dest_b = load_bundle(self.dest(kernel.key))
        full = self.c.check_shape is None or dict(self.c.check_shape) == dict(kernel.spec.shape)
        if full and "outputs-meta.json" in dest_b.manifest["files"] and d.get("outputs_sha256"):  # same bits as the gate?
            gate_meta = json.loads(dest_b.read_bytes("outputs-meta.json", "json_bytes"))
            gate_sha = {k: v.get("sha256") for k, v in gate_meta.get("arrays", {}).items()}
            session["same_bits_as_gate"] = gate_sha == d["outputs_sha256"][1]
        before = self.cost(kernel.key)
        add_session(self.dest(kernel.key), session, r.wall_s)
        if d.get("power_rounds") and isinstance(gpu_at_start, dict):  # per-round clock/power/throttle samples
            gpu_at_start = {**gpu_at_start, "power_rounds": d["power_rounds"]}
        t = Timed(kernel.key, incumbent.key, d["blocks"][0], d["blocks"][1], "ABAB", "same-session",
                  self.cost(kernel.key) - before, gpu=gpu_at_start, spot_check=spot_record if spot else None)
        self.progress(f"time {name}: {t.t_candidate / 1e3:.2f} us vs {incumbent.key} "
                      f"{t.t_incumbent / 1e3:.2f} us ({d['timer']}, {r.wall_s:.1f} s, {self._iso_text(r)})"
                      + (f"; spot-check of round {spot_record.get('round')}: "
                         f"{'pass' if spot_record.get('passed') else 'FAIL ' + str(spot_record.get('reason'))}"
                         if spot else ""))
        return t


def open_live_workbench(campaign, out: Path, progress: Callable[[str], None] | None = None,
                        gate_seeds: Sequence[int] | None = None) -> LiveWorkbench:
    """The live workbench for ``campaign`` on this machine's GPU; :class:`NoGpu` when there is none, one
    clear :class:`~mosaic.errors.BadInput` when the device or a language does not match the campaign."""
    from mosaic.gpus import detect
    from mosaic.plugins import host

    detection = detect(host().items("gpus").values())
    if not detection.devices:
        err = NoGpu(f"no GPU here ({detection.reason}); a live run captures and times kernels on a CUDA device. "
                    "Re-decide recorded bundles with: mosaic run --offline DIR", "mosaic run")
        err.reason = detection.reason
        raise err
    matched = [d.target.name for d in detection.devices if d.target is not None]
    if campaign.gpu not in matched:
        seen = ", ".join(f"{d.name} (record {d.target.name if d.target else 'none'})" for d in detection.devices)
        raise BadInput(f"the campaign names GPU record '{campaign.gpu}' but this machine has {seen}; a live run "
                       "needs the device's own record (see mosaic gpus)", "--gpu")
    langs = host().items("languages")
    for flag, name in (("--source", campaign.source), ("--target", campaign.target)):
        if name not in langs or langs[name].backend is None:
            raise BadInput(f"language '{name}' is not installed with a backend here; installed: "
                           f"{', '.join(n for n, v in sorted(langs.items()) if v.backend is not None) or 'none'}",
                           flag)
    return LiveWorkbench(campaign, out, progress=progress, gate_seeds=gate_seeds)
