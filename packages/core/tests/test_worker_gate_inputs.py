"""The persistent worker's numerics gate (``child_check`` with a WorkerState) takes its seeded inputs from the
worker (made once per worker, as for its timing sessions): a second gate regenerates nothing, sees the same input
bytes, and its runnable is keyed by the same input digest the timing sessions use."""

import json

import numpy as np
from mosaic.oracle.formats import FORMATS
from mosaic.records import KernelSpec
from mosaic.run.live import child
from mosaic.run.live.worker import WorkerState, inputs_digest

SPEC = KernelSpec(family="rmsnorm", shape={"rows": 64, "cols": 256}, dtype="bf16", language="pallas", knobs={})


class NumpyRmsnorm:
    """rmsnorm on the CPU, wrong at (3, 4)."""
    def __init__(self, inputs):
        self.inputs, self.y = inputs, None

    def launch(self):
        x, w = self.inputs["x"].astype(np.float64), self.inputs["w"].astype(np.float64)
        self.y = FORMATS["bf16"].round(x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w).astype(np.float32)
        self.y[3, 4] = 64.0  # wrong at one element: the gate ends at the oracle (no GPU timer here)

    def poison(self):
        self.y = None

    def output(self):
        return {"y": self.y}

    def close(self):
        pass


def test_the_gate_takes_the_workers_seeded_inputs(tmp_path, monkeypatch):
    import mosaic.capture
    import mosaic.families

    made = []
    real = mosaic.families.make_inputs

    def counting(spec, seed, values):
        made.append((dict(spec.shape), seed, values))
        return real(spec, seed, values)

    monkeypatch.setattr(mosaic.families, "make_inputs", counting)
    monkeypatch.setattr(mosaic.capture, "make_inputs", counting)
    state = WorkerState()
    keys = []

    def runnable(spec, gpu, inputs, digest=None, prepare=None, source=None):
        keys.append(digest)
        assert digest == inputs_digest(inputs)  # the digest handed over is the one of the bytes the kernel gets
        return NumpyRmsnorm(inputs), digest

    monkeypatch.setattr(state, "runnable", runnable)
    import attrs
    from mosaic.capture import CaptureOptions

    opts = attrs.asdict(CaptureOptions(blocks=1, runs=2, warmup=1))
    outs = []
    try:
        for name in ("a", "b"):
            out = tmp_path / f"{name}.bundle"
            r = child.child_check({"spec": SPEC.to_json(), "gpu": "h200", "out": str(out), "options": opts,
                                   "oracle_cache": str(tmp_path / "oracle")}, state)
            assert r["status"] == "ok" and r["capture"]["status"] == "numerics-failed", r
            assert r["capture"]["summary"]["oracle"]["y"]["worst_index"] == [3, 4]
            outs.append(json.loads((out / "inputs-meta.json").read_text())["arrays"])
    finally:
        state.close()
    assert made == [({"rows": 64, "cols": 256}, 0, "normal")]  # once, for both gates
    assert outs[0] == outs[1] and keys[0] == keys[1] is not None


def test_the_campaigns_oracle_cache_is_under_the_cache_root(tmp_path, monkeypatch):
    """The float64 reference (2 GiB at 16384 x 8192) is kept under $MOSAIC_CACHE_DIR/oracle, never inside the
    campaign directory that gets committed as an example."""
    from mosaic.run.campaign import Campaign
    from mosaic.run.live.parent import LiveWorkbench

    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(tmp_path / "cache"))
    c = Campaign.from_json({"source": "pallas", "target": "cute", "family": "gemm", "shape": "64x64x64",
                            "dtype": "bf16", "gpu": "h200"})
    bench = LiveWorkbench(c, tmp_path / "campaign", progress=lambda line: None)
    try:
        assert bench.oracle_cache == tmp_path / "cache" / "oracle"
        assert (tmp_path / "campaign") not in bench.oracle_cache.parents
        scratch = bench.work  # and so is the scratch: lowerings in flight and gate bundles
        assert scratch.parent == tmp_path / "cache" / "scratch" and (tmp_path / "campaign") not in scratch.parents
    finally:
        bench.close()
    assert not scratch.exists() and not (tmp_path / "campaign" / ".work").exists()
