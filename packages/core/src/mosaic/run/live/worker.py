"""The live workbench's persistent worker: one long-lived child process serving gates and timings in turn.

A step of the convergence loop used to start two processes (gate, timing), each paying Python and library
imports, a JIT compile of every kernel it ran (the timing one compiled the incumbent again) and the float64
oracle. The worker keeps what is safe to keep between requests and nothing else:

* **Prepared runnables**, keyed by the kernel spec, the GPU record and the SHA-256 of the input bytes they
  were prepared with: a kernel is compiled (``backend.prepare()``) once per worker; the gate's runnable is
  the one timed later. The worker's cache owns them (a request's ``close()`` does not close them); at most
  ``CAPACITY`` are kept, least recently used closed first. A cached runnable's output bits are remembered
  at its first timing; a later session that sees other bits fails (a corrupted buffer is never timed).
* **Seeded inputs** for timing sessions (kept read-only; each request gets a copy), and the oracle's float64 reference in memory
  (:class:`mosaic.oracle.cache.ReferenceCache`, also on disk for the whole campaign).

Isolation is kept by replacing the process, never by trusting it: the parent (:class:`Workers`) starts the
worker in its own process group and replaces it after ANY failure: a crash (signal), a timeout (the whole
group is killed), a failed request (an exception: a CUDA error among them), a gate that did not pass (a
failing kernel may have corrupted the context) or a protocol error. Each request keeps its own timeout.
Every answer carries ``worker = {pid, request}`` (the n-th request this process served), which the
workbench writes into the gate's and the timing session's records.

Protocol: the parent writes one JSON object per line to the worker's stdin (``{"format":
"mosaic-live-request", "id": N, "mode": ..., ...}``); the worker answers one JSON line on a dedicated pipe
(``--fd``): first ``{"ready": true, "pid": ...}``, then per request ``{"id": N, "status": "ok" | "failed",
..., "worker": {...}}``. The worker's stdout and stderr (libraries print there) go to a log file, whose
part written during a request is the request's output. Modes are :data:`mosaic.run.live.child.MODES` plus ``ping``.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mosaic.run.live.child import MODES
from mosaic.run.live.child import answer as answer_request
from mosaic.run.live.child import prepare as prepare_kernel
from mosaic.run.live.protocol import REQUEST_FORMAT, ChildResult, knob_label, read_inputs, result_problem

CAPACITY = 12  # prepared runnables kept per worker (4096^3 bf16 GEMM: ~100 MB of device memory each)
READY_TIMEOUT = 300.0
WORKER_MODULE = "mosaic.run.live.worker"  # python -m WORKER_MODULE --fd N


# -- the worker's side ------------------------------------------------------------------------------------------
class Borrowed:
    """A cached runnable lent to one request: its ``close()`` leaves it to the cache."""

    def __init__(self, inner):
        self.inner = inner

    def launch(self) -> None:
        self.inner.launch()

    def poison(self) -> None:
        self.inner.poison()

    def output(self) -> dict:
        return self.inner.output()

    def close(self) -> None:
        pass


def inputs_digest(inputs: Mapping[str, Any]) -> str:
    import numpy as np

    h = hashlib.sha256()
    for name in sorted(inputs):
        a = np.ascontiguousarray(inputs[name])
        h.update(f"{name}:{a.dtype}:{a.shape}:".encode())
        h.update(hashlib.sha256(a.tobytes()).digest())
    return h.hexdigest()


class WorkerState:
    """What one worker keeps between requests (see the module docstring)."""

    def __init__(self, fd: int | None = None, capacity: int = CAPACITY):
        self.fd = fd
        self.pid = os.getpid()
        self.requests = 0
        self.capacity = capacity
        self.root = Path(tempfile.mkdtemp(prefix="mosaic-worker-"))
        self.runnables: OrderedDict[str, tuple[Any, Path]] = OrderedDict()
        self.output_sha: dict[str, dict] = {}
        self.inputs: dict[str, tuple[dict, str]] = {}
        self.references: dict[str, Any] = {}
        self.prepared: dict[str, str] = {}  # this request's kernels: label -> compiled | cached

    def begin(self) -> None:
        self.requests += 1
        self.prepared = {}

    def record(self) -> dict:
        return {"pid": self.pid, "request": self.requests, "prepared": dict(self.prepared),
                "runnables_cached": len(self.runnables)}

    def reference_cache(self, root: str | None):
        from mosaic.oracle.cache import ReferenceCache

        key = root or ""
        if key not in self.references:
            self.references[key] = ReferenceCache(root)
        return self.references[key]

    def seeded_inputs(self, spec, seed: int, values: str) -> tuple[dict, str]:
        from mosaic.families import make_inputs

        key = json.dumps([spec.family, dict(spec.shape), spec.dtype, seed, values], sort_keys=True)
        if key not in self.inputs:
            arrays = make_inputs(spec, seed, values)
            for a in arrays.values():
                a.flags.writeable = False
            self.inputs[key] = (arrays, inputs_digest(arrays))
        arrays, digest = self.inputs[key]
        return {k: v.copy() for k, v in arrays.items()}, digest  # the kept arrays are never handed out

    def file_inputs(self, path: str) -> tuple[dict, str]:
        """Inputs the campaign's process made (from a gate seed this process never sees) and wrote to ``path``:
        read once per worker, kept read-only; each request gets a copy and the digest of their bytes."""
        if path not in self.inputs:
            arrays = read_inputs(path)
            for a in arrays.values():
                a.flags.writeable = False
            self.inputs[path] = (arrays, inputs_digest(arrays))
        arrays, digest = self.inputs[path]
        return {k: v.copy() for k, v in arrays.items()}, digest

    def runnable(self, spec, gpu, inputs: Mapping[str, Any], digest: str | None = None,
                 prepare: Callable | None = None, source: str | None = None):
        """A prepared runnable for ``spec`` on these inputs, compiled at most once per worker (``source``: a
        source edit's whole file, built by its language's kernel-file backend; part of the cache key)."""
        digest = digest or inputs_digest(inputs)
        ident = {"spec": spec.to_json(), "gpu": gpu.name, "inputs": digest}
        if source is not None:
            ident["source"] = hashlib.sha256(source.encode()).hexdigest()
        key = json.dumps(ident, sort_keys=True)
        label = f"{spec.language}({knob_label(spec)})"
        if key in self.runnables:
            self.runnables.move_to_end(key)
            self.prepared[label] = "cached"
            return Borrowed(self.runnables[key][0]), key
        work = Path(tempfile.mkdtemp(prefix="kernel-", dir=self.root))
        try:
            if source is not None:
                r = prepare_kernel(spec, gpu, work, dict(inputs), source)
            else:
                r = (prepare or prepare_kernel)(spec, gpu, work, dict(inputs))
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        self.runnables[key] = (r, work)
        self.prepared[label] = getattr(r, "prepared_how", None) or "compiled"  # e.g. "loaded artifact ..."
        while len(self.runnables) > self.capacity:
            _, (old, old_work) = self.runnables.popitem(last=False)
            _close(old)
            shutil.rmtree(old_work, ignore_errors=True)
        return Borrowed(r), key

    def close(self) -> None:
        for r, _ in self.runnables.values():
            _close(r)
        self.runnables.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def _close(r) -> None:
    try:
        r.close()
    except Exception:  # noqa: BLE001 - closing must not hide what ran before
        pass


def ping(req: Mapping[str, Any], state: WorkerState) -> dict:
    """A request that touches nothing: the worker answers with who it is."""
    return {"status": "ok", "pid": state.pid}


def serve(fd: int, modes: Mapping[str, Callable] | None = None, preload: tuple[str, ...] = ()) -> int:
    """The worker's loop: answer each request line on stdin with one JSON line on ``fd``, until stdin closes."""
    from mosaic.errors import MosaicError

    os.set_inheritable(fd, False)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    known = {**MODES, "ping": ping, **dict(modes or {})}
    t0 = time.monotonic()
    warm = _warm(preload)
    state = WorkerState(fd)

    def answer(obj: dict) -> None:
        line = json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)) + "\n"
        data = line.encode()
        while data:
            data = data[os.write(fd, data):]

    answer({"ready": True, "pid": state.pid, "warm_s": round(time.monotonic() - t0, 3), "preloaded": warm})
    try:
        for raw in sys.stdin.buffer:
            try:
                req = json.loads(raw)
            except json.JSONDecodeError as exc:
                answer({"status": "failed", "error": f"protocol: a request line is not JSON ({exc})"})
                continue
            state.begin()
            rid = req.get("id") if isinstance(req, dict) else None
            if not isinstance(req, dict) or req.get("format") != REQUEST_FORMAT:
                result = {"status": "failed", "error": MosaicError(f"protocol: not a {REQUEST_FORMAT} request",
                                                                   "worker").line()}
            else:
                result = answer_request(req, known, state)
            sys.stdout.flush()
            sys.stderr.flush()
            answer({**result, "id": rid, "worker": state.record()})
    finally:
        state.close()
    return 0


def _warm(preload: tuple[str, ...]) -> list[str]:
    """Imports that every request needs, done while nobody waits (no GPU is touched)."""
    import importlib

    done = []
    for name in ("numpy", "mosaic.capture", "mosaic.oracle", "mosaic.oracle.cache", "mosaic.timing.timer",
                 *preload):
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception:  # noqa: BLE001 - a module that does not import fails its request, recorded there
            pass
    return done


def main(argv: list[str] | None = None, modes: Mapping[str, Callable] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--fd":
        print("usage: python -m mosaic.run.live.worker --fd N [--preload MODULE ...]", file=sys.stderr)
        return 2
    preload = tuple(a for a in args[2:] if a != "--preload")
    return serve(int(args[1]), modes, preload)


# -- the parent's side ------------------------------------------------------------------------------------------
class _Proc:
    def __init__(self, proc: subprocess.Popen, rfd: int, log_path: Path, log, ordinal: int):
        self.proc, self.rfd, self.log_path, self.log, self.ordinal = proc, rfd, log_path, log, ordinal
        self.buf = b""
        self.ready: dict | None = None
        self.requests = 0
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid


class Workers:
    """One persistent worker at a time, replaced after any failure (the parent's side; see the module
    docstring). ``argv`` replaces ``[python, -m, mosaic.run.live.worker]`` (tests run real test workers)."""

    def __init__(self, work: str | os.PathLike, python: str | None = None, argv: list[str] | None = None,
                 env: Mapping[str, str] | None = None, preload: tuple[str, ...] = ()):
        self.work = Path(work)
        self.argv = list(argv or [python or sys.executable, "-m", WORKER_MODULE])
        self.env = dict(env or {})
        self.preload = tuple(preload)
        self.current: _Proc | None = None
        self.started = 0
        self.retired: list[dict] = []
        self._next_id = 0

    # -- lifetime ---------------------------------------------------------------------------------------------
    def start(self) -> _Proc:
        """Start a worker now (it imports while the caller goes on) unless one is running."""
        if self.current is not None:
            return self.current
        self.work.mkdir(parents=True, exist_ok=True)
        self.started += 1
        log_path = self.work / f"worker-{self.started}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - kept open for the worker's lifetime
        rfd, wfd = os.pipe()
        cmd = [*self.argv, "--fd", str(wfd), *(["--preload", *self.preload] if self.preload else [])]
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                    pass_fds=(wfd,), start_new_session=True, env={**os.environ, **self.env})
        finally:
            os.close(wfd)
        self.current = _Proc(proc, rfd, log_path, log, self.started)
        return self.current

    def retire(self, why: str) -> None:
        """End the current worker and its whole process group (after any failure; at close)."""
        w, self.current = self.current, None
        if w is None:
            return
        try:
            os.killpg(w.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            w.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for f in (w.proc.stdin, w.log):
            try:
                f.close()
            except (OSError, AttributeError):
                pass
        os.close(w.rfd)
        self.retired.append({"pid": w.pid, "worker": w.ordinal, "requests": w.requests, "why": why})

    def close(self) -> None:
        self.retire("closed")

    # -- requests ---------------------------------------------------------------------------------------------
    def serve(self, request: Mapping[str, Any], timeout: float):
        """Send one request and wait for its answer (at most ``timeout`` seconds, including the wait for a
        worker that is still starting). Returns a :class:`~mosaic.run.live.protocol.ChildResult` whose ``isolation`` names
        the worker; after any failure the worker is already retired."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        w = self.start()
        offset = _size(w.log_path)
        iso = {"mode": "worker", "pid": w.pid, "worker": w.ordinal}

        def done(status: str, data: dict, message: str) -> ChildResult:
            out = _read_from(w.log_path, offset)
            info = {**iso, "request": w.requests, **({k: v for k, v in (data.get("worker") or {}).items()
                                                       if k in ("prepared", "runnables_cached")})}
            if status != "ok":
                self.retire(f"{status}: {message}")
            return ChildResult(status, data, message, out, time.monotonic() - t0, info)

        if w.ready is None:
            got = self._line(w, deadline)
            if not isinstance(got, dict):
                return done(*self._lost(w, got, timeout, "while starting"))
            if not got.get("ready"):
                return done("failed", {}, "protocol: the worker's first line is not its ready line")
            w.ready = got
        self._next_id += 1
        rid = self._next_id
        w.requests += 1
        try:
            w.proc.stdin.write((json.dumps({"format": REQUEST_FORMAT, **dict(request), "id": rid}) + "\n").encode())
            w.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return done(*self._lost(w, "eof", timeout, "before the request"))
        got = self._line(w, deadline)
        if not isinstance(got, dict):
            return done(*self._lost(w, got, timeout, ""))
        if got.get("id") != rid:
            return done("failed", {}, f"protocol: the answer is for request {got.get('id')!r}, not {rid}")
        problem = result_problem(got)
        if problem:
            return done("failed", {}, problem)
        return done(got["status"], got, str(got.get("error", "")))

    def _line(self, w: _Proc, deadline: float):
        """The next answer line as a dict, or 'timeout' | 'eof' | 'protocol: ...'."""
        while b"\n" not in w.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([w.rfd], [], [], left)
            if not ready:
                return "timeout"
            chunk = os.read(w.rfd, 1 << 16)
            if not chunk:
                return "eof"
            w.buf += chunk
        line, w.buf = w.buf.split(b"\n", 1)
        try:
            got = json.loads(line)
        except json.JSONDecodeError:
            return f"protocol: an answer line is not JSON: {line[:200]!r}"
        return got if isinstance(got, dict) else f"protocol: an answer line is not an object: {line[:200]!r}"

    def _lost(self, w: _Proc, what: str, timeout: float, when: str) -> tuple[str, dict, str]:
        suffix = f" {when}" if when else ""
        if what == "timeout":
            return "timeout", {}, f"killed after {timeout:.0f} s{suffix} (the worker's whole process group)"
        if what.startswith("protocol"):
            return "failed", {}, what
        try:
            rc = w.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "failed", {}, f"the worker closed its answer pipe{suffix} but did not exit"
        if rc < 0:
            return "crashed", {}, f"killed by signal {-rc}{suffix}"
        return "failed", {}, f"exited with status {rc} and no result{suffix}"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int, limit: int = 64000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


if __name__ == "__main__":
    sys.exit(main())
