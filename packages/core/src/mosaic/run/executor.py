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

    def claim(self, key: str):
        """The lowering of ``key`` as a Ray object reference (submitted now when it was only queued), for a
        task or actor that takes it as an argument (Ray resolves it there; nobody waits here); None when the
        stage was never asked for it."""
        if key not in self.running:
            queued = [q for q in self.queue if q[0] == key]
            if not queued:
                return None
            self.queue.remove(queued[0])
            return self.remote.remote(self.lowerer, key, queued[0][1])
        return self.running.pop(key)

    def close(self) -> None:
        import ray

        for ref in self.running.values():
            ray.cancel(ref, force=True)
        self.running.clear()
        self.queue.clear()


# -- GPU evaluation ----------------------------------------------------------------------------------------------
class GpuEvaluator:
    """Holds one workbench on one GPU (a Ray actor with ``num_gpus=1``); answers the loop's questions.
    ``slot`` numbers the actors of one campaign (0 is the primary: the journal's reference and yardstick);
    with several, the factory is called with ``slot=`` and each timing record is stamped with this GPU."""

    def __init__(self, factory: Callable[..., Any], slot: int = 0, slots: int = 1):
        self.bench = factory(slot=slot) if slots > 1 else factory()
        if getattr(self.bench, "show_waits", False):  # the driver (RayWorkbench) shows the waits, not the actor
            self.bench.show_waits = False
        self.slot, self.slots = slot, slots
        self.device = visible_gpu()

    def kind(self) -> str:
        return self.bench.kind

    def identity(self) -> dict:
        gpu = gpu_identity(self.device) if self.device not in ("", None) or self.slots == 1 else None
        return {"slot": self.slot, "actor_pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu": gpu if gpu and "error" not in gpu else None}

    def uuid(self) -> str:
        """This GPU's UUID (``slot-N`` for an actor that holds none: the CPU workbenches of the tests)."""
        gpu = self.identity()["gpu"]
        return gpu["uuid"] if gpu else f"slot-{self.slot}"

    def stamp(self, timed):
        """A timing record that names this GPU (with several GPUs; the workbench's own record when it has one)."""
        if self.slots > 1 and not (isinstance(timed.gpu, Mapping) and timed.gpu.get("uuid")):
            timed = attrs.evolve(timed, gpu={**(self.identity()["gpu"] or {}), "uuid": self.uuid(),
                                             "slot": self.slot})
        return timed

    def call(self, method: str, *args):
        if method == "yardsticks":  # a workbench that knows only the first yardstick: the replay's fallback
            from mosaic.run.replay import ReplayBench

            return ReplayBench(self.bench, None).yardsticks(*args)
        out = getattr(self.bench, method)(*args)
        return self.stamp(out) if method in ("time", "pair_yardstick") and out is not None else out

    def build(self, kernel, lowered: Lowered | None):
        if lowered is not None:
            adopt = getattr(self.bench, "adopt", None)
            if adopt is not None:
                adopt(kernel.key, lowered)
        return self.bench.build(kernel)

    def evaluate(self, kernel, lowered: Lowered | None, reference, incumbent, rounds: int) -> tuple:
        """Build, gate and time ``kernel`` against ``incumbent`` on this GPU, ahead of the loop asking:
        (Built, Checked or None, Timed or None)."""
        built = self.build(kernel, lowered)
        if not built.ok:
            return built, None, None
        kernel = attrs.evolve(kernel, bundle=built.bundle)
        checked = self.bench.check(kernel, built, reference)
        if not checked.passed:
            return built, checked, None
        return built, checked, self.stamp(self.bench.time(incumbent, kernel, rounds))

    def close(self) -> None:
        close = getattr(self.bench, "close", None)
        if close is not None:
            close()


class RayWorkbench:
    """The loop's :class:`~mosaic.run.workbench.Workbench` on Ray: lowering tasks ahead of the GPU, the
    workbench itself in GPU-pinned actors. ``factory`` builds the workbench inside an actor (picklable; with
    ``gpus > 1`` it is called with ``slot=i``); ``lowerer`` (picklable, ``(key, spec_json) -> Lowered``, with
    ``accepts(kernel)``) lowers on the runtime's CPUs, None for a workbench that lowers nothing (offline).
    ``num_gpus`` is each actor's GPU share (1 on a GPU node; 0 for a workbench that needs none).

    With ``gpus`` actors (one per GPU): each captures the reference and measures its noise itself
    (:meth:`noise_by_gpu`); while the loop's candidate is evaluated on one GPU, the next candidates the
    proposer ranked are built, gated and timed against the same incumbent on the idle GPUs; the loop takes
    such an answer only for the same (candidate, incumbent) pair, when its proposer reaches that candidate,
    and decides it with the noise of the GPU that timed it. A comparison never spans two GPUs: the incumbent
    and the candidate run interleaved in one session on one GPU."""

    def __init__(self, factory: Callable[..., Any], *, lowerer: Callable | None = None, address: str | None = None,
                 num_cpus: int | None = None, num_gpus: float = 1, actor_cpus: float = 1, gpus: int = 1,
                 progress: Callable[[str], None] | None = None):
        import ray

        self.progress = progress or (lambda line: None)
        self.show_waits = progress is not None  # the waits on the actors and the lowering tasks (mosaic.progress.Wait)
        self.started = False
        self.actors: list = []
        self.lowering = None
        if gpus < 1:
            raise BadInput(f"--gpus {gpus}: at least one GPU evaluates", "--gpus")
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
        have = ray.cluster_resources().get("GPU", 0)
        if num_gpus and have < num_gpus * gpus:
            self.close()
            raise BadInput(f"the Ray runtime has {have:g} GPU(s); {gpus} evaluation actor(s) need "
                           f"{num_gpus * gpus:g}", "--gpus" if gpus > 1 else "--executor")
        cls = ray.remote(num_gpus=num_gpus, num_cpus=actor_cpus, max_restarts=0)(GpuEvaluator)
        self.actors = [cls.remote(factory, i, gpus) for i in range(gpus)]
        self.kind = ray.get(self.actors[0].kind.remote())
        self.where = ray.get([a.identity.remote() for a in self.actors])
        self.uuids = ray.get([a.uuid.remote() for a in self.actors])
        parallel = max(1, cpus - int(actor_cpus * gpus))
        self.lowering = LoweringStage(lowerer, parallel) if lowerer is not None else None
        self.lowerer = lowerer
        self.by_gpu: dict[str, tuple] = {}
        self.ahead: list = []  # the proposer's ranked kernels, as the loop last named them
        self.ahead_of: dict[str, tuple] = {}  # key -> (slot, ObjectRef of evaluate, incumbent key)
        self.answers: dict[str, tuple] = {}  # key -> (slot, (Built, Checked, Timed), incumbent key)
        self.slot_of: dict[str, int] = {}  # key -> the slot that built it
        self.busy: dict[int, Any] = {}  # slot -> ObjectRef of its speculative evaluation
        self.reference = None
        self.incumbent = None
        self.rounds = None
        self.unused_s = 0.0  # device seconds of evaluations ahead that the loop did not use
        gpu_names = ", ".join(str((w.get("gpu") or {}).get("uuid") or f"slot-{w['slot']}") for w in self.where)
        self.progress(f"ray: {cpus} CPU(s), {have:g} GPU(s); evaluation actor(s) on {gpu_names}; "
                      + (f"{parallel} lowering(s) at once" if self.lowering else "no lowering stage"))

    def _waiting(self, desc: str, note: str = ""):
        from mosaic.progress import Wait

        return Wait(desc, note=note, quiet=not self.show_waits)

    # -- one actor -------------------------------------------------------------------------------------------
    def _ask(self, method: str, *args, slot: int = 0, desc: str | None = None):
        import ray

        with self._waiting(desc or method, f"Ray actor on GPU slot {slot}"):
            return ray.get(self.actors[slot].call.remote(method, *args))

    def capture_reference(self, spec):
        import ray

        refs = [a.call.remote("capture_reference", spec) for a in self.actors]  # every GPU, at once
        with self._waiting(f"the reference capture ({spec.language})", f"{len(refs)} Ray actor(s), one per GPU"):
            caps = ray.get(refs)
        if len(self.actors) > 1:
            self.by_gpu = {u: c.noise_blocks for u, c in zip(self.uuids, caps, strict=True)}
        self.reference = caps[0].kernel
        return caps[0]

    def noise_by_gpu(self) -> dict:
        """The reference's noise blocks as each GPU measured them, by GPU UUID (empty with one GPU)."""
        return dict(self.by_gpu)

    def prefetch(self, kernels) -> None:
        kernels = list(kernels)
        if self.lowering is not None:
            self.lowering.submit([k for k in kernels if self.lowerer.accepts(k)])
        self.ahead = kernels
        self._speculate(skip=None)

    def _lowered(self, key: str):
        return self.lowering.take(key) if self.lowering is not None else None

    def _speculate(self, skip: str) -> None:
        """Start the proposer's next candidates on idle GPUs (other than the primary), against the incumbent."""
        import ray

        if len(self.actors) < 2 or self.incumbent is None or self.reference is None or self.rounds is None:
            return
        for slot, ref in list(self.busy.items()):
            if ray.wait([ref], timeout=0)[0]:
                del self.busy[slot]
        idle = [i for i in range(1, len(self.actors)) if i not in self.busy]
        for k in self.ahead:
            if not idle:
                break
            if k.key == skip or k.key in self.ahead_of or k.key in self.answers or k.key in self.slot_of:
                continue
            slot = idle.pop(0)
            lowered = self.lowering.claim(k.key) if self.lowering is not None else None  # resolved in the actor
            ref = self.actors[slot].evaluate.remote(k, lowered, self.reference, self.incumbent, self.rounds)
            self.ahead_of[k.key] = (slot, ref, self.incumbent.key)
            self.busy[slot] = ref
            self.progress(f"ray: {k.key} evaluated ahead on GPU slot {slot} against {self.incumbent.key}")

    def build(self, kernel):
        import ray

        if kernel.key in self.ahead_of:
            slot, ref, inc_key = self.ahead_of.pop(kernel.key)
            with self._waiting(f"{kernel.key}, evaluated ahead against {inc_key}", f"Ray actor on GPU slot {slot}"):
                self.answers[kernel.key] = (slot, ray.get(ref), inc_key)
            self.busy.pop(slot, None)
            self.slot_of[kernel.key] = slot
            return self.answers[kernel.key][1][0]
        with self._waiting(f"lowering {kernel.key}", "a Ray task"):
            lowered = self._lowered(kernel.key)
        if lowered is not None:
            self.progress(f"ray: {kernel.key} lowered on {lowered.host} in {lowered.wall_s:.1f} s ({lowered.status}); "
                          f"the loop waited {self.lowering.waits[kernel.key]:.1f} s")
        ref = self.actors[0].build.remote(kernel, lowered)
        self._speculate(skip=kernel.key)  # the other GPUs work while this one builds and gates
        self.slot_of[kernel.key] = 0
        with self._waiting(f"the build and numerics gate of {kernel.key}", "Ray actor on GPU slot 0"):
            return ray.get(ref)

    def check(self, kernel, built, reference):
        if kernel.key in self.answers and self.answers[kernel.key][1][1] is not None:
            return self.answers[kernel.key][1][1]
        return self._ask("check", kernel, built, reference, slot=self.slot_of.get(kernel.key, 0),
                         desc=f"the numerics gate of {kernel.key}")

    def time(self, incumbent, kernel, rounds):
        self.rounds = rounds
        ans = self.answers.pop(kernel.key, None)
        if ans is not None and ans[2] == incumbent.key and ans[1][2] is not None:
            timed = ans[1][2]
        else:  # on the GPU that built and gated it (the candidate is compiled there)
            if ans is not None and ans[1][2] is not None:  # timed against an incumbent that is no longer
                self.unused_s += ans[1][2].cost_s
            timed = self._ask("time", incumbent, kernel, rounds, slot=self.slot_of.get(kernel.key, 0),
                              desc=f"timing {kernel.key} against {incumbent.key} ({rounds} rounds)")
        if incumbent.key == (self.reference.key if self.reference is not None else None):
            self.incumbent = kernel  # measured against the reference: the loop's new incumbent
        else:
            self.incumbent = incumbent
        return timed

    def ahead_unused_s(self) -> float | None:
        """Device seconds spent on evaluations ahead that the loop never used (waits for those still running);
        None with one GPU (nothing is evaluated ahead). Not part of the loop's budget, which counts what its
        decisions used, exactly as the offline re-decision counts it."""
        import ray

        if len(self.actors) < 2:
            return None
        for key, (slot, ref, _) in list(self.ahead_of.items()):
            built, checked, timed = ray.get(ref)
            self.unused_s += built.cost_s + (checked.cost_s if checked else 0.0) + (timed.cost_s if timed else 0.0)
            del self.ahead_of[key]
            self.busy.pop(slot, None)
        for _slot, (_built, _checked, timed), _inc in self.answers.values():  # built ahead, never timed
            self.unused_s += timed.cost_s if timed else 0.0
        self.answers.clear()
        return self.unused_s

    def yardstick(self, spec, rounds):
        return self._ask("yardstick", spec, rounds)

    def yardsticks(self, spec, rounds):
        """The primary GPU's captures of every yardstick (a workbench that knows only the first: that one)."""
        return self._ask("yardsticks", spec, rounds)

    def pair_yardstick(self, kernel, rounds, key="yardstick"):
        """On the primary GPU, whose workbench measured the yardsticks (the report's figures are that GPU's)."""
        args = (kernel, rounds) if key == "yardstick" else (kernel, rounds, key)
        return self._ask("pair_yardstick", *args, desc=f"timing {kernel.key} against the {key}")

    def bundle_path(self, key):
        return self._ask("bundle_path", key, slot=self.slot_of.get(key, 0))

    def close(self) -> None:
        import ray

        if getattr(self, "lowering", None) is not None:
            self.lowering.close()
        for ref in getattr(self, "busy", {}).values():
            try:
                ray.get(ref)  # an evaluation ahead finishes its bundle before its workbench closes
            except Exception:  # noqa: BLE001 - its failure is not the campaign's: the loop never used it
                pass
        for actor in getattr(self, "actors", []):
            try:
                ray.get(actor.close.remote())
            finally:
                ray.kill(actor)
        self.actors = []
        if self.started and ray.is_initialized():
            ray.shutdown()
            self.started = False


__all__ = ["EXECUTORS", "CaptureLowerer", "GpuEvaluator", "Lowered", "LoweringStage", "RayWorkbench",
           "check_executor", "default_executor", "gpu_identity", "ray_available", "visible_gpu"]
