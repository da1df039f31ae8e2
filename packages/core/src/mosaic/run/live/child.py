"""The child request handler: the process that prepares kernels and answers one gate or timing request.

``python -m mosaic.run.live.child REQUEST.json`` answers one request (isolation ``"step"``, and the
reference's cuBLAS yardstick) and writes the result to ``request["result"]``; the persistent worker
(:mod:`mosaic.run.live.worker`) runs the same :data:`MODES` through :func:`answer` for every request line it
reads. Nothing here is imported by the loop's own process except through those two entry points.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mosaic.errors import MosaicError
from mosaic.families import yardstick_names  # library calls, no lowering
from mosaic.records import KernelSpec
from mosaic.run.live.protocol import REQUEST_FORMAT, knob_label


def prepare(spec: KernelSpec, gpu, workdir: Path, inputs: Mapping[str, Any], source: str | None = None):
    """A Runnable for ``spec`` on the GPU: its language backend's ``prepare()``, or cuBLAS for ``cublas``; a
    source edit (``source``: the whole edited file) through its language's kernel-file backend."""
    if source is not None:
        from mosaic.kernel_files import prepare_source

        return prepare_source(spec, source, gpu, Path(workdir), inputs)
    if spec.language in yardstick_names():
        from mosaic.families import yardstick_runnable

        return yardstick_runnable(spec, inputs)
    from mosaic.plugins import host

    lang = host().get("languages", spec.language)
    if lang.backend is None:
        raise MosaicError(f"language '{spec.language}' has no backend", spec.language)
    return lang.backend.prepare(spec, gpu, Path(workdir), dict(inputs))


def answer(req: Mapping[str, Any], modes: Mapping[str, Callable], state) -> dict:
    """Run one request in its mode; every failure becomes a recorded ``{"status": "failed"}`` (never lost)."""
    try:
        mode = modes.get(req.get("mode"))
        if mode is None:
            raise MosaicError(f"unknown mode {req.get('mode')!r}; known: {', '.join(modes)}", "mode")
        return mode(req, state)
    except MosaicError as exc:
        return {"status": "failed", "error": exc.line()}
    except Exception as exc:  # noqa: BLE001 - recorded for the parent, never lost
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc))[-4000:]}


def child_check(req: Mapping[str, Any], state=None) -> dict:
    """Capture's oracle (and short timing) on a prepared Runnable, bundle written to ``out``; no lowering.

    ``req["oracle_cache"]``: the campaign's float64 reference cache directory (None: computed here).
    ``state``: the persistent worker's (:class:`mosaic.run.live.worker.WorkerState`): the runnable then comes
    from, and stays in, its cache; None in a one-request child."""
    from mosaic.capture import CaptureOptions, capture_in_process
    from mosaic.oracle.cache import ReferenceCache

    spec = KernelSpec.from_json(req["spec"])
    source = req.get("source")  # a source edit's whole file, or None
    opts = CaptureOptions(**req["options"])
    root = req.get("oracle_cache")
    given = req.get("inputs")  # {"path": ...}: made by the campaign's process from a gate seed; the request holds none
    note = {"seed": None, "values": opts.values, "made_by": "the campaign's process (the gate's request holds no "
                                                            "seed; the campaign records it)"} if given else None
    if state is not None:  # the worker's seeded inputs (made once per worker, as for its timing sessions)
        if given:
            inputs, digest = state.file_inputs(given["path"])
        else:
            inputs, digest = state.seeded_inputs(spec, opts.seed, opts.values) if not opts.lower_only else (None, None)
        r = capture_in_process(spec, req["gpu"], Path(req["out"]), opts,
                               runnable_factory=lambda s, g, ins: state.runnable(s, g, ins, digest, source=source)[0],
                               extra=req.get("extra"), reference_cache=state.reference_cache(root), inputs=inputs,
                               inputs_note=note)
        return {"status": "ok", "capture": r.to_json()}
    work = Path(tempfile.mkdtemp(prefix="mosaic-live-check-"))
    try:
        from mosaic.run.live.protocol import read_inputs

        r = capture_in_process(spec, req["gpu"], Path(req["out"]), opts,
                               runnable_factory=lambda s, g, inputs: prepare(s, g, work, inputs, source),
                               extra=req.get("extra"), reference_cache=ReferenceCache(root) if root else None,
                               inputs=read_inputs(given["path"]) if given else None, inputs_note=note)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"status": "ok", "capture": r.to_json()}


def child_cases(req: Mapping[str, Any], state=None) -> dict:
    """The device gate's extra cases (:func:`mosaic.gate.device_plan`: the campaign's shape with the second seed,
    two shapes the candidate never saw with every distribution): each case's kernel prepared at its shape on the
    inputs the campaign's process wrote (``cases[i]["inputs"]``: the request holds no seed), poisoned, run once;
    its outputs go to ``work/outputs-<i>.npz`` and the campaign's process judges them. Nothing here is kept in the
    worker's cache (the timed runnables stay)."""
    import attrs
    import numpy as np

    from mosaic.gate import digest
    from mosaic.plugins import host
    from mosaic.run.live.protocol import read_inputs

    spec0 = KernelSpec.from_json(req["spec"])
    source = req.get("source")
    gpu = host().get("gpus", req["gpu"])
    work = Path(req["work"])
    tmp = Path(tempfile.mkdtemp(prefix="mosaic-live-cases-"))
    records = []
    try:
        for i, case in enumerate(req["cases"]):
            spec = attrs.evolve(spec0, shape=dict(case["shape"]))
            inputs = read_inputs(case["inputs"])
            rec: dict[str, Any] = {}
            r = None
            try:
                r = prepare(spec, gpu, tmp / str(i), inputs, source)
                r.poison()
                r.launch()
                out = r.output()
                np.savez(work / f"outputs-{i}.npz", **{k: np.asarray(v) for k, v in out.items()})
            except Exception as exc:  # noqa: BLE001 - the candidate's failure at this case is a finding
                first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
                rec["error"] = f"{type(exc).__name__}: {first[:400]}"
            finally:
                if r is not None:
                    try:
                        r.close()
                    except Exception:  # noqa: BLE001 - closing must not hide the case's record
                        pass
            rec["inputs_after"] = digest(inputs)
            records.append(rec)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"status": "ok", "cases": records}


def spot_check(spec: KernelSpec, inputs: Mapping[str, Any], outputs: Mapping[str, Any], cache) -> dict:
    """The float64 oracle's verdict on the outputs a timed run left: ``{passed, reason, sha256}``."""
    from mosaic.errors import BadInput
    from mosaic.oracle import check, numerics_pass

    try:
        verdict = check(spec.family, inputs, outputs, spec.dtype, cache=cache)
    except BadInput as exc:
        return {"passed": False, "reason": f"the oracle refused the outputs: {exc.what}", "sha256": _sha(outputs)}
    return {"passed": bool(numerics_pass(verdict)), "reason": verdict.reason, "sha256": _sha(outputs)}


def _sha(arrays: Mapping[str, Any]) -> dict:
    import numpy as np

    return {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in arrays.items()}


def child_time(req: Mapping[str, Any], state=None) -> dict:
    """Interleaved timing of two kernels in this one process (see :meth:`mosaic.run.live.parent.LiveWorkbench.time`). With a
    worker's ``state`` both runnables come from its cache (compiled once per worker), and one whose output
    bits differ from those it gave at its first timing in this worker fails the request."""
    from mosaic.families import make_inputs
    from mosaic.plugins import host
    from mosaic.timing.device import L2Flush, Serialized, TimingError
    from mosaic.timing.timer import make_timer

    specs = [KernelSpec.from_json(s) for s in req["specs"]]
    sources = list(req.get("sources") or [None] * len(specs))
    if len(specs) != 2 or len(sources) != 2:
        raise MosaicError("a timing session takes exactly two kernels (incumbent, candidate)", "specs")
    if dict(specs[0].shape) != dict(specs[1].shape) or specs[0].dtype != specs[1].dtype:
        raise MosaicError("both kernels of a timing session must solve the same problem", "specs")
    rounds, runs, warmup = int(req["rounds"]), int(req["runs"]), int(req.get("warmup", 10))
    gpu = host().get("gpus", req["gpu"])
    timer = make_timer(req.get("timer", "cupti"))  # before any CUDA context
    seed, values = int(req.get("seed", 0)), req.get("values", "normal")
    given = req.get("inputs")  # {"path": ...}: the gate's inputs, made by the campaign's process (no seed here)
    if given and state is not None:
        inputs, digest = state.file_inputs(given["path"])
    elif given:
        from mosaic.run.live.protocol import read_inputs

        inputs, digest = read_inputs(given["path"]), None
    elif state is not None:
        inputs, digest = state.seeded_inputs(specs[0], seed, values)
    else:
        inputs, digest = make_inputs(specs[0], seed, values), None
    spot = req.get("spot_check")  # {"round": r, "oracle_cache": dir}: which round's outputs the oracle sees
    caught = None
    work = Path(tempfile.mkdtemp(prefix="mosaic-live-time-"))
    runnables, keys, flush = [], [], None
    try:
        for i, (s, src) in enumerate(zip(specs, sources, strict=True)):
            if state is not None:
                r, key = state.runnable(s, gpu, inputs, digest, source=src)
                runnables.append(r)
                keys.append(key)
            else:
                runnables.append(prepare(s, gpu, work / str(i), inputs, src))
        hashes = []
        for r in runnables:  # the bits each kernel produces here (compare with its gate's outputs-meta)
            r.poison()
            r.launch()
            hashes.append(_sha(r.output()))
        for key, spec, h in zip(keys, specs, hashes, strict=False):
            seen = state.output_sha.setdefault(key, h)
            if seen != h:
                raise MosaicError(f"the worker's cached {spec.language} kernel ({knob_label(spec)}) now gives "
                                  "other output bits than at its first timing here (a corrupted buffer?)", "worker")
        flush = L2Flush(gpu.l2_bytes) if req.get("flush", True) else None
        serial = [Serialized(r) for r in runnables]
        per_run = []
        for s in serial:  # the interleaved records are split by kernels per run: both must launch alike
            one = timer.time_interleaved([s], 2, warmup=1, flush=flush, clocks=False, power=False)[0]
            per_run.append(one.kernels_per_run)
        if per_run[0] != per_run[1]:
            raise TimingError(f"cannot interleave: the incumbent launches {per_run[0]} kernel(s) per run and the "
                              f"candidate {per_run[1]}")
        blocks: list[list] = [[], []]
        launch, names, clocks, power = [None, None], [[], []], [], []
        for i in range(rounds):
            got = timer.time_interleaved(serial, runs, warmup=warmup if i == 0 else 2, flush=flush,
                                         flush_name=flush.description if flush else "none",
                                         clocks=i in (0, rounds - 1))
            for j, t in enumerate(got):
                blocks[j].append([int(x) for x in t.times_ns])
                launch[j] = launch[j] or (t.launch.to_json() if t.launch else None)
                names[j] = list(t.kernel_names)
            if got[0].clocks_before:
                clocks.append({"before": got[0].clocks_before, "after": got[0].clocks_after})
            if got[0].power is not None:  # taken after the round, before the next (mosaic.timing.throttle)
                power.append(got[0].power.to_json())
            if spot and i == int(spot["round"]):  # what the candidate's last timed run of this round left (read
                # between rounds: a copy inside the round would add its kernels to the timer's records)
                caught = runnables[1].output()
        spot_record = None
        if spot:
            from mosaic.oracle.cache import ReferenceCache

            root = spot.get("oracle_cache")
            cache = state.reference_cache(root) if state is not None else (ReferenceCache(root) if root else None)
            spot_record = {"round": int(spot["round"]), "run": "the candidate's last timed run of that round",
                           **(spot_check(specs[1], inputs, caught, cache) if caught is not None else
                              {"passed": False, "reason": "the chosen round did not run"})}
        return {"status": "ok", "blocks": blocks, "timer": timer.source,
                "fallback_reason": getattr(timer, "reason", ""), "launch": launch, "kernel_names": names,
                "kernels_per_run": per_run, "clocks": clocks, "power_rounds": power,
                "outputs_sha256": hashes, "spot_check": spot_record,
                "flush": flush.description if flush else "none",
                "serialized": "device synchronise before and after every launch"}
    finally:
        if flush is not None:
            flush.close()
        for r in runnables:
            try:
                r.close()
            except Exception:  # noqa: BLE001 - closing after an error must not hide it
                pass
        shutil.rmtree(work, ignore_errors=True)


MODES: dict[str, Callable[..., dict]] = {"check": child_check, "time": child_time, "cases": child_cases}


def main(request_path: str) -> int:  # one request per process (isolation = "step")
    """The child's entry: read the request, run its mode, write the result (failures included)."""
    try:
        req = json.loads(Path(request_path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: unreadable request {request_path}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(req, dict) or req.get("format") != REQUEST_FORMAT or "result" not in req:
        print(f"error: {request_path} is not a {REQUEST_FORMAT} request", file=sys.stderr)
        return 2
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    result = answer(req, MODES, None)
    Path(req["result"]).write_text(json.dumps(result, default=lambda o: o.tolist() if hasattr(o, "tolist")
                                              else str(o)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
