"""Where a campaign's work runs: ``mosaic run --executor local|ray``.

* ``local`` — the sequential in-process path: the loop asks its workbench directly (the live workbench lowers
  the next proposals in background processes of its own, see :mod:`mosaic.run.live`).
* ``ray`` — the same loop, the same workbench, on a Ray runtime (a local one started on the node's cores, or
  the cluster at ``--ray-address``):

  - **lowering** ahead of the GPU: the proposer's untried candidates are lowered as Ray tasks (one CPU each,
    the GPU hidden: ``CUDA_VISIBLE_DEVICES=""``), submitted in the proposer's order and at most as many at once
    as the runtime has CPUs for them, so the best-ranked are ready first; a lowering is a lower-only capture
    in a child process (:class:`CaptureLowerer`), its bundle shipped back as bytes so a task may run on any
    node;
  - **GPU evaluation** in a Ray actor pinned to one GPU (``num_gpus=1``, :class:`GpuEvaluator`) that holds the
    workbench: the reference, its noise, the gates and every interleaved session run on that one GPU, so a
    candidate is always compared with the incumbent on the same device. Every timing record names its GPU
    (:func:`gpu_identity`: index, UUID, clocks at the start of the session).

  The loop is unchanged: it asks one question at a time, in the proposer's order, and records each answer
  before the next, so the journal, ``--resume`` and ``--offline`` read a Ray campaign exactly as a local one
  (the order of verdicts is the proposer's, never the order in which lowerings completed).

Ray is optional (``pip install ray``): without it ``local`` is the only executor and the default.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from mosaic.errors import BadInput

EXECUTORS = ("local", "ray")


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def default_executor() -> str:
    """``ray`` when Ray is installed, else ``local``."""
    return "ray" if ray_available() else "local"


def check_executor(name: str | None, where: str = "--executor") -> str:
    name = default_executor() if name is None else name
    if name not in EXECUTORS:
        raise BadInput(f"unknown executor '{name}'; choose one of {', '.join(EXECUTORS)}", where)
    if name == "ray" and not ray_available():
        raise BadInput("--executor ray needs Ray (pip install ray); --executor local runs without it", where)
    return name


# -- which GPU ------------------------------------------------------------------------------------------------
def visible_gpu() -> str | None:
    """The first device of ``CUDA_VISIBLE_DEVICES`` (an index or a UUID; what Ray gives a GPU actor), None when
    the variable is unset."""
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    if v is None:
        return None
    first = v.split(",")[0].strip()
    return first or ""


def gpu_identity(device: str | None = None) -> dict:
    """The GPU this process times on, now: ``{"index", "uuid", "name", "clocks": {sm_mhz, mem_mhz, ...}}``
    through ``nvidia-smi`` (the physical index; ``device`` defaults to the first of ``CUDA_VISIBLE_DEVICES``,
    else 0). ``{"error": ...}`` when no device can be asked."""
    device = visible_gpu() if device is None else device
    if device == "":
        return {"error": "CUDA_VISIBLE_DEVICES hides every GPU"}
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {"error": "nvidia-smi not found"}
    fields = "index,uuid,name,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw"
    try:
        out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", device or "0"],
                             capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"nvidia-smi: {exc}"}
    if out.returncode != 0 or not out.stdout.strip():
        return {"error": (out.stderr or out.stdout).strip()[:200]}
    v = [x.strip() for x in out.stdout.strip().splitlines()[0].split(",")]
    ident = {"index": int(v[0]) if v[0].isdigit() else v[0], "uuid": v[1], "name": v[2]}
    ident["clocks"] = dict(zip(["sm_mhz", "mem_mhz", "max_sm_mhz", "temperature_c", "power_w"], v[3:], strict=False))
    return ident


# -- lowering ---------------------------------------------------------------------------------------------------
@attrs.frozen
class Lowered:
    """One lowering's answer: the capture's status and message, and the bundle it wrote (a tar, as bytes)."""

    key: str
    status: str  # "lowered" | "unbuildable" | "timeout" | "failed" | ...
    message: str = ""
    payload: bytes | None = attrs.field(default=None, repr=False)
    wall_s: float = 0.0
    host: str = ""

    def unpack(self, dest: str | os.PathLike) -> Path | None:
        """Write the bundle to ``dest`` (replacing it); None when the lowering left none."""
        if self.payload is None:
            return None
        dest = Path(dest)
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(self.payload), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")
        return dest


def pack(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in sorted(root.rglob("*")):
            tar.add(p, arcname=p.relative_to(root).as_posix(), recursive=False)
    return buf.getvalue()


@attrs.frozen
class CaptureLowerer:
    """The live lowering: a lower-only capture (``python -m mosaic.capture``, what the live workbench's own
    prefetch runs) in a child process with the GPU hidden, killed past ``timeout``."""

    gpu: str
    timeout: float
    languages: frozenset = attrs.field(converter=frozenset)  # whose lowering never touches the GPU
    python: str = sys.executable

    def accepts(self, kernel) -> bool:
        return kernel.source is None and kernel.spec.language in self.languages

    def __call__(self, key: str, spec_json: Mapping) -> Lowered:
        import socket

        from mosaic.capture import CaptureOptions

        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"mosaic-lower-{key}-") as tmp:
            tmp = Path(tmp)
            out, res, req = tmp / "lowered.bundle", tmp / "result.json", tmp / "request.json"
            req.write_text(json.dumps({"spec": dict(spec_json), "gpu": self.gpu, "out": str(out),
                                       "options": attrs.asdict(CaptureOptions(lower_only=True,
                                                                              timeout=self.timeout)),
                                       "result": str(res), "extra": None}))
            try:
                proc = subprocess.run([self.python, "-m", "mosaic.capture", str(req)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, timeout=self.timeout + 30,
                                      env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
            except subprocess.TimeoutExpired:
                return Lowered(key, "timeout", f"lowering killed after {self.timeout + 30:.0f} s", None,
                               time.monotonic() - t0, socket.gethostname())
            if not res.is_file():
                tail = (proc.stderr or "").strip().splitlines()[-3:]
                return Lowered(key, "failed", f"the lowering child (exit {proc.returncode}) wrote no result: "
                               + " | ".join(tail)[-600:], None, time.monotonic() - t0, socket.gethostname())
            data = json.loads(res.read_text())
            payload = pack(out) if out.is_dir() else None
            return Lowered(key, data["status"], data.get("message", ""), payload, time.monotonic() - t0,
                           socket.gethostname())


def _lower_remote(lowerer: Callable, key: str, spec_json: Mapping) -> Lowered:
    return lowerer(key, spec_json)


class LoweringStage:
    """Lowerings as Ray tasks, submitted in the order the loop names kernels (the proposer's), at most
    ``parallel`` in flight; :meth:`take` waits for one and says how long the loop waited."""

    def __init__(self, lowerer: Callable, parallel: int):
        import ray

        self.lowerer, self.parallel = lowerer, max(1, int(parallel))
        self.remote = ray.remote(num_cpus=1, max_retries=0,
                                 runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": ""}})(_lower_remote)
        self.queue: list[tuple[str, dict]] = []  # not yet submitted, in the loop's order
        self.running: dict[str, Any] = {}  # key -> ObjectRef
        self.order: list[str] = []  # every key in the order it was named (what the tests read)
        self.waits: dict[str, float] = {}

    def known(self, key: str) -> bool:
        return key in self.running or any(k == key for k, _ in self.queue)

    def submit(self, kernels: Iterable) -> None:
        for k in kernels:
            if not self.known(k.key) and k.key not in self.waits:
                self.queue.append((k.key, k.spec.to_json()))
                self.order.append(k.key)
        self._fill()

    def _fill(self) -> None:
        import ray

        done = [key for key, ref in self.running.items() if ray.wait([ref], timeout=0)[0]]
        in_flight = len(self.running) - len(done)
        while self.queue and in_flight < self.parallel:
            key, spec = self.queue.pop(0)
            self.running[key] = self.remote.remote(self.lowerer, key, spec)
            in_flight += 1

    def take(self, key: str) -> Lowered | None:
        """The lowering of ``key`` (waiting for it; submitted first when it was only queued); None when the
        stage was never asked for it."""
        import ray

        if key not in self.running:
            queued = [q for q in self.queue if q[0] == key]
            if not queued:
                return None
            self.queue.remove(queued[0])
            self.running[key] = self.remote.remote(self.lowerer, key, queued[0][1])
        t0 = time.monotonic()
        lowered = ray.get(self.running.pop(key))
        self.waits[key] = time.monotonic() - t0
        self._fill()
        return lowered

    def close(self) -> None:
        import ray

        for ref in self.running.values():
            ray.cancel(ref, force=True)
        self.running.clear()
        self.queue.clear()


# -- GPU evaluation ----------------------------------------------------------------------------------------------
class GpuEvaluator:
    """Holds one workbench on one GPU (a Ray actor with ``num_gpus=1``); answers the loop's questions."""

    def __init__(self, factory: Callable[[], Any]):
        self.bench = factory()
        self.device = visible_gpu()

    def kind(self) -> str:
        return self.bench.kind

    def identity(self) -> dict:
        return {"actor_pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu": gpu_identity(self.device) if self.device != "" else None}

    def call(self, method: str, *args):
        return getattr(self.bench, method)(*args)

    def build(self, kernel, lowered: Lowered | None):
        if lowered is not None:
            adopt = getattr(self.bench, "adopt", None)
            if adopt is not None:
                adopt(kernel.key, lowered)
        return self.bench.build(kernel)

    def close(self) -> None:
        close = getattr(self.bench, "close", None)
        if close is not None:
            close()


class RayWorkbench:
    """The loop's :class:`~mosaic.run.workbench.Workbench` on Ray: lowering tasks ahead of the GPU, the
    workbench itself in a GPU-pinned actor. ``factory`` builds the workbench inside the actor (picklable);
    ``lowerer`` (picklable, ``(key, spec_json) -> Lowered``, with ``accepts(kernel)``) lowers on the runtime's
    CPUs, None for a workbench that lowers nothing (offline). ``num_gpus`` is the actor's GPU share (1 on a GPU
    node; 0 for a workbench that needs none)."""

    def __init__(self, factory: Callable[[], Any], *, lowerer: Callable | None = None, address: str | None = None,
                 num_cpus: int | None = None, num_gpus: float = 1, actor_cpus: float = 1,
                 progress: Callable[[str], None] | None = None):
        import ray

        self.progress = progress or (lambda line: None)
        self.started = False
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, include_dashboard=False, log_to_driver=True)
                else:
                    ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                             log_to_driver=True)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise BadInput(f"could not start or join a Ray runtime: {str(exc).splitlines()[0][:200]}",
                               "--ray-address" if address else "--executor") from None
            self.started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        gpus = ray.cluster_resources().get("GPU", 0)
        if num_gpus and gpus < num_gpus:
            self.close()
            raise BadInput(f"the Ray runtime has {gpus:g} GPU(s); the GPU-evaluation actor needs {num_gpus:g}",
                           "--executor")
        self.actor = ray.remote(num_gpus=num_gpus, num_cpus=actor_cpus, max_restarts=0)(GpuEvaluator).remote(factory)
        self.kind = ray.get(self.actor.kind.remote())
        self.where = ray.get(self.actor.identity.remote())
        parallel = max(1, cpus - int(actor_cpus))
        self.lowering = LoweringStage(lowerer, parallel) if lowerer is not None else None
        self.lowerer = lowerer
        self.progress(f"ray: {cpus} CPU(s), {gpus:g} GPU(s); evaluation actor on "
                      f"{(self.where.get('gpu') or {}).get('uuid') or 'no GPU'}; "
                      + (f"{parallel} lowering(s) at once" if self.lowering else "no lowering stage"))

    def _ask(self, method: str, *args):
        import ray

        return ray.get(self.actor.call.remote(method, *args))

    def capture_reference(self, spec):
        return self._ask("capture_reference", spec)

    def prefetch(self, kernels) -> None:
        if self.lowering is not None:
            self.lowering.submit([k for k in kernels if self.lowerer.accepts(k)])

    def build(self, kernel):
        import ray

        lowered = self.lowering.take(kernel.key) if self.lowering is not None else None
        if lowered is not None:
            self.progress(f"ray: {kernel.key} lowered on {lowered.host} in {lowered.wall_s:.1f} s ({lowered.status}); "
                          f"the loop waited {self.lowering.waits[kernel.key]:.1f} s")
        return ray.get(self.actor.build.remote(kernel, lowered))

    def check(self, kernel, built, reference):
        return self._ask("check", kernel, built, reference)

    def time(self, incumbent, kernel, rounds):
        return self._ask("time", incumbent, kernel, rounds)

    def yardstick(self, spec, rounds):
        return self._ask("yardstick", spec, rounds)

    def bundle_path(self, key):
        return self._ask("bundle_path", key)

    def close(self) -> None:
        import ray

        if getattr(self, "lowering", None) is not None:
            self.lowering.close()
        actor = getattr(self, "actor", None)
        if actor is not None:
            try:
                ray.get(actor.close.remote())
            finally:
                ray.kill(actor)
            self.actor = None
        if self.started and ray.is_initialized():
            ray.shutdown()
            self.started = False


__all__ = ["EXECUTORS", "CaptureLowerer", "GpuEvaluator", "Lowered", "LoweringStage", "RayWorkbench",
           "check_executor", "default_executor", "gpu_identity", "ray_available", "visible_gpu"]
