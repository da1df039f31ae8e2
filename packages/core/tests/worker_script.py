"""A real live worker (``mosaic.run.live.worker.main``) with extra modes for the CPU tests: a kernel stand-in on
the CPU gated by capture's float64 oracle, and requests that crash, hang, break the protocol or fail only in
a reused worker. Run as ``python worker_script.py --fd N`` by ``Workers(argv=[python, this file])``."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from mosaic.oracle.formats import FORMATS
from mosaic.run.live.worker import main


class NumpyGemm:
    """Computes the GEMM on the CPU, wrongly at one element when ``wrong``."""

    def __init__(self, inputs, wrong):
        self.inputs, self.wrong, self.c = inputs, wrong, None

    def launch(self):
        c = FORMATS["bf16"].round(self.inputs["a"].astype(np.float64) @ self.inputs["b"]).astype(np.float32)
        if self.wrong:
            c[3, 4] = 0.0 if c[3, 4] != 0 else 1.0
        self.c = c

    def poison(self):
        self.c = None if self.c is None else np.full_like(self.c, np.nan)

    def output(self):
        return {"c": self.c}

    def close(self):
        pass


def numpy_gate(req, state):
    """capture_in_process on the worker's cached runnable and reference cache, as child_check does."""
    from mosaic.capture import CaptureOptions, capture_in_process
    from mosaic.records import KernelSpec

    spec = KernelSpec.from_json(req["spec"])
    made = lambda s, g, w, i: NumpyGemm(i, wrong=True)  # noqa: E731 - a failing kernel: never timed
    r = capture_in_process(spec, "h200", Path(req["out"]), CaptureOptions(),
                           runnable_factory=lambda s, g, i: state.runnable(s, g, i, prepare=made)[0],
                           reference_cache=state.reference_cache(req.get("oracle_cache")))
    return {"status": "ok", "capture": r.to_json()}


def numpy_cases(req, state):
    """The gate's other cases (``child_cases``' protocol) for the gemm stand-in: right at every shape."""
    from mosaic.gate import digest
    from mosaic.run.live.protocol import read_inputs

    records = []
    for i, case in enumerate(req["cases"]):
        inputs = read_inputs(case["inputs"])
        k = NumpyGemm(inputs, wrong=False)
        k.launch()
        np.savez(Path(req["work"]) / f"outputs-{i}.npz", **k.output())
        records.append({"inputs_after": digest(inputs)})
    return {"status": "ok", "cases": records}


def crash(req, state):
    os.kill(os.getpid(), signal.SIGKILL)


def hang(req, state):
    child = subprocess.Popen(["sleep", "60"])
    Path(req["pidfile"]).write_text(str(child.pid))
    time.sleep(60)


def garble(req, state):
    os.write(state.fd, b"this is not JSON\n")
    return {"status": "ok"}


def flaky(req, state):
    """Fails in a worker that served requests before (as after a kernel that corrupted the context)."""
    if state.requests > 1:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (left by an earlier kernel)")
    return {"status": "ok", "pid": state.pid}


def flaky_check(req, state):
    """A gate stand-in that fails numerics in a reused worker and passes in a fresh one."""
    if state.requests > 1:
        return {"status": "ok", "capture": {"status": "numerics-failed", "message": "c[3, 4] off by one ulp",
                                            "summary": {"numerics_pass": False}}}
    return {"status": "ok", "capture": {"status": "ok", "summary": {"numerics_pass": True}}}


# -- ``--cpu-device``: the worker's kernels run on the CPU ---------------------------------------------------------
class Interpreted:
    """A Pallas kernel (a kernel file or a template) run in jax's GPU interpreter on the CPU, the Runnable the
    worker's gate, cases and timing sessions take: every launch runs it on the inputs it was prepared with."""

    def __init__(self, run, inputs):
        self.run, self.inputs, self.out = run, inputs, None

    def launch(self):
        self.out = self.run(self.inputs)

    def poison(self):
        self.out = None

    def output(self):
        return {k: np.asarray(v, np.float32) for k, v in self.out.items()}

    def close(self):
        pass


class WhenTimed(NumpyGemm):
    """The gemm stand-in; with ``differs`` right at its first launch only (the gate's, or the output hash a timing
    session takes before its rounds) and wrong at one element in every later one: a kernel that differs when timed."""

    def __init__(self, inputs, differs):
        super().__init__(inputs, wrong=False)
        self.differs, self.launches = differs, 0

    def launch(self):
        self.launches += 1
        self.wrong = self.differs and self.launches > 1
        super().launch()


class WallTimer:
    """The CPU's clock around each launch, in the timer's interface (no GPU timer exists on the CPU)."""

    source = "cpu-wall-clock"

    def time_interleaved(self, runnables, runs, warmup=10, flush=None, flush_name="", clocks=True, power=True):
        from mosaic.timing.timer import TimedRuns

        for _ in range(warmup):
            for r in runnables:
                r.launch()
        times = [[] for _ in runnables]
        for _ in range(runs):
            for j, r in enumerate(runnables):
                t0 = time.perf_counter_ns()
                r.launch()
                times[j].append(time.perf_counter_ns() - t0)
        return [TimedRuns(self.source, tuple(t), warmup=warmup) for t in times]


class NoFlush:
    description = "none (the CPU)"

    def __init__(self, l2_bytes):
        pass

    def __call__(self):
        pass

    def close(self):
        pass


def cpu_prepare(real):
    """The worker's prepare for a Pallas candidate on the CPU: its kernel file's ``interpret`` (source) or the
    rowwise template's ``run_interpreted``; anything else as before."""

    def prepare(spec, gpu, workdir, inputs, source=None):
        if spec.language in ("numpy", "numpy-when-timed"):  # the gemm stand-in, right at every launch, or only
            return WhenTimed(inputs, spec.language == "numpy-when-timed")  # at its first (untimed) one
        if spec.language != "pallas":
            return real(spec, gpu, workdir, inputs, source)
        if source is not None:
            import attrs
            from mosaic.kernel_files import file_backend, source_knobs, write_source

            kfile = write_source(spec, source, Path(workdir) / "source")
            spec = attrs.evolve(spec, knobs=source_knobs(spec, kfile)[0])
            backend = file_backend(kfile, "pallas")
            return Interpreted(lambda ins: backend.interpret(spec, ins)["outputs"], inputs)
        from mosaic_target_pallas.rowwise import run_interpreted

        return Interpreted(lambda ins: {"y": run_interpreted(spec, ins).outputs[0]}, inputs)

    return prepare


def install_cpu_device():
    import mosaic.run.live.child as child
    import mosaic.run.live.worker as worker
    import mosaic.timing.device as device
    import mosaic.timing.timer as timer

    child.prepare = worker.prepare_kernel = cpu_prepare(child.prepare)
    timer.make_timer = lambda prefer="cupti": WallTimer()
    device.L2Flush = NoFlush
    device.synchronize = lambda: None


if __name__ == "__main__":
    if "--cpu-device" in sys.argv:
        sys.argv.remove("--cpu-device")
        install_cpu_device()
    sys.exit(main(modes={"numpy_gate": numpy_gate, "numpy_cases": numpy_cases, "crash": crash, "hang": hang, "garble": garble,
                         "flaky": flaky, "flaky_check": flaky_check}))
