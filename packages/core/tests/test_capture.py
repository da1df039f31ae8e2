"""Capture: shape/knob parsing, seeded inputs, child-process isolation (timeout recorded), a failing
candidate recorded and never timed, bundles that round-trip."""

import json

import numpy as np
import pytest
from mosaic.bundle import load_bundle
from mosaic.capture import (
    CaptureOptions,
    capture,
    capture_in_process,
    check_and_time,
    parse_knobs,
    parse_shape,
)
from mosaic.errors import BadInput
from mosaic.families import make_inputs
from mosaic.oracle.formats import FORMATS
from mosaic.records import KernelSpec

SPEC = KernelSpec(family="gemm", shape={"m": 64, "n": 32, "k": 48}, dtype="bf16", language="cutlass")


def test_parse_shape_and_knobs():
    assert parse_shape("gemm", "4096x2048x512") == {"m": 4096, "n": 2048, "k": 512}
    assert parse_shape("softmax", "rows=8,cols=128") == {"rows": 8, "cols": 128}
    for bad in ("4096x4096", "ax1x2", "0x1x1"):
        with pytest.raises(BadInput):
            parse_shape("gemm", bad)
    assert parse_knobs(["tile_m=128", "kernel_schedule = pingpong"]) == {"tile_m": "128", "kernel_schedule": "pingpong"}
    with pytest.raises(BadInput, match="name=value"):
        parse_knobs(["tile_m"])


def test_inputs_are_seeded_and_representable():
    a1 = make_inputs(SPEC, 7, "normal")
    a2 = make_inputs(SPEC, 7, "normal")
    assert np.array_equal(a1["a"], a2["a"]) and not np.array_equal(a1["a"], make_inputs(SPEC, 8, "normal")["a"])
    assert a1["a"].shape == (64, 48) and a1["b"].shape == (48, 32) and a1["a"].dtype == np.float32
    assert FORMATS["bf16"].representable(a1["a"]).all() and a1["a"].std() > 0.5
    ints = make_inputs(SPEC, 7, "int")["a"]
    assert np.array_equal(ints, np.round(ints)) and np.abs(ints).max() <= 4


class NumpyGemm:
    """A kernel stand-in that runs on the CPU: computes the GEMM, optionally wrongly."""

    def __init__(self, inputs, wrong=False):
        self.inputs, self.wrong, self.c, self.launches = inputs, wrong, None, 0

    def launch(self):
        self.launches += 1
        c = FORMATS["bf16"].round(self.inputs["a"].astype(np.float64) @ self.inputs["b"]).astype(np.float32)
        if self.wrong:
            c[3, 4] = 0.0 if c[3, 4] != 0 else 1.0
        self.c = c

    def poison(self):
        self.c = np.full_like(self.c, np.nan) if self.c is not None else None

    def output(self):
        return {"c": self.c}

    def close(self):
        pass


def test_failing_candidate_is_recorded_and_never_timed():
    inputs = make_inputs(SPEC, 0, "normal")
    k = NumpyGemm(inputs, wrong=True)
    log = []
    status, files, summary = check_and_time(k, SPEC, None, inputs, CaptureOptions(), log)
    assert status == "numerics-failed" and k.launches == 1
    assert "timings.json" not in files and not summary["numerics_pass"]
    assert json.loads(files["oracle.json"][1])["outputs"][0]["worst_index"] == [3, 4]


def test_bundle_of_a_failed_run_round_trips(tmp_path):
    out = tmp_path / "x.bundle"
    r = capture_in_process(SPEC, "h200", out, CaptureOptions(max_array_bytes=1 << 20),
                           runnable_factory=lambda s, g, i: NumpyGemm(i, wrong=True))
    assert r.status == "numerics-failed"
    b = load_bundle(out)
    assert b.manifest["capture"]["status"] == "numerics-failed"
    assert set(b.arrays("inputs")) == {"a", "b"} and b.arrays("outputs")["c"].shape == (64, 32)
    meta = json.loads((out / "outputs-meta.json").read_text())
    assert meta["arrays"]["c"]["sha256"] and meta["poisoned_before_run"]
    assert "FAIL" in b.read_text("log") and b.read_json("metrics")["passed"] is False


def test_large_arrays_are_recorded_by_hash(tmp_path):
    out = tmp_path / "y.bundle"
    capture_in_process(SPEC, "h200", out, CaptureOptions(max_array_bytes=100),
                       runnable_factory=lambda s, g, i: NumpyGemm(i, wrong=True))
    b = load_bundle(out)
    assert b.arrays("outputs") == {} and b.arrays("inputs") == {}
    assert len(json.loads((out / "inputs-meta.json").read_text())["arrays"]["a"]["sha256"]) == 64


def test_unbuildable_knobs_are_recorded_in_a_child(tmp_path):
    spec = KernelSpec(family="gemm", shape={"m": 256, "n": 256, "k": 128}, dtype="bf16", language="cutlass",
                      knobs={"kernel_schedule": "cooperative", "tile_m": 64})
    r = capture(spec, "h200", tmp_path / "u.bundle", CaptureOptions(lower_only=True, timeout=120))
    assert r.status == "unbuildable" and "CUTLASS-COOP-TILE" in r.message
    b = load_bundle(r.bundle)
    assert b.manifest["capture"]["status"] == "unbuildable" and "CUTLASS-COOP-TILE" in b.read_text("log")


def test_a_hang_is_killed_and_recorded(tmp_path):
    r = capture(SPEC, "h200", tmp_path / "t.bundle", CaptureOptions(lower_only=True, timeout=0.05))
    assert r.status == "timeout" and "killed after" in r.message
    assert load_bundle(r.bundle).manifest["capture"]["status"] == "timeout"
