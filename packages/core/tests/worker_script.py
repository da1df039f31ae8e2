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


if __name__ == "__main__":
    sys.exit(main(modes={"numpy_gate": numpy_gate, "crash": crash, "hang": hang, "garble": garble,
                         "flaky": flaky, "flaky_check": flaky_check}))
