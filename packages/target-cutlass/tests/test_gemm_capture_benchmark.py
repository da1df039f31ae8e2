"""The CPU-testable parts of benchmarks/gemm_capture.py (--part cutlass) and benchmarks/timing_aa.py: the CUTLASS
configurations are buildable by the rules, the A/A harness on synthetic samples, the summary table."""

import importlib

import numpy as np
import pytest
from mosaic.records import KernelSpec
from mosaic_target_cutlass import gemm
from mosaic_target_cutlass.backend import CutlassBackend


@pytest.fixture(scope="module")
def capture():
    return importlib.import_module("gemm_capture")  # benchmarks/ is on pytest's pythonpath


@pytest.fixture(scope="module")
def aa():
    return importlib.import_module("timing_aa")


def test_configurations_pass_the_rules(capture, aa):
    from mosaic_gpu_hopper.targets import H200

    assert len(capture.CONFIGS) == 3 and aa.CONFIGS is capture.CONFIGS
    labels = set()
    for knobs in capture.CONFIGS.values():
        for shape in (capture.BIG, capture.SMALL, {**capture.BIG, "k": aa.PLANTED_K["slower"]},
                      {**capture.BIG, "k": aa.PLANTED_K["faster"]}):
            s = KernelSpec(family="gemm", shape=shape, dtype="bf16", language="cutlass", knobs=knobs)
            assert CutlassBackend().source(s, H200)  # no Unbuildable
        labels.add(gemm.GemmKnobs(**knobs).label)
    assert len(labels) == 3
    assert aa.PLANTED_K["slower"] / capture.BIG["k"] == pytest.approx(1.031, abs=0.001)


def test_decision_harness_on_synthetic_samples(aa):
    rng = np.random.default_rng(1)
    ref, slow, fast = 170_000.0, 170_000.0 * 1.031, 170_000.0 * 0.969

    def measure_pair(a, b):  # one interleaved block: a clock step of up to a few % hits both alike
        clock = 1 + 0.02 * rng.standard_normal()
        return tuple(list(m * clock * (1 + 0.003 * rng.standard_normal(30))) for m in (a, b))

    res = aa.run_decisions(ref, slow, fast, measure_pair, noise_pairs=20, decisions=100, planted=10)
    assert res["aa"]["decisions"] == 100 and res["aa"]["accept_rate"] <= 0.01
    assert res["planted_slower"]["accepted"] == 0 and res["planted_slower"]["classified_slower"] == 10
    assert res["planted_faster"]["accepted"] == 10
    res.update(kernel="x", timer="cupti", runs_per_block=30)
    lines = aa.aa_lines(res)
    assert "false wins in 100 decisions" in lines[1] and "K=4224" in lines[2]


def test_summary_table(capture):
    caps = {"coop 4096": {"status": "ok", "shape": "4096x4096x4096", "summary": {
        "time_ns": 170_000.0, "noise_ns": 800.0, "launch": {"grid": [132, 1, 1], "block": [384, 1, 1],
                                                           "cluster": [1, 2, 1], "registers_per_thread": 168},
        "oracle": {"c": {"max_abs_error": 0.5, "mean_abs_error": 0.01, "max_error_over_band": 0.9,
                         "exact_checked": 0}}}},
        "cublas 4096": {"status": "timeout", "shape": "4096x4096x4096", "summary": {}}}
    t = capture.table(caps).splitlines()
    assert len(t) == 3 and "170.00" in t[1] and "808" in t[1] and "(132, 1, 1)/384/(1, 2, 1)" in t[1]
    assert "timeout" in t[2]


def test_acceptance_problems(capture):
    ok = {"status": "ok", "summary": {"numerics_pass": True, "time_ns": 4824.0, "oracle": {"c": {
        "failures": 0, "max_error_over_band": 0.969, "exact_checked": 196608}}}}
    assert capture.problems(ok) == [] and capture.problems(ok, exact=512 * 384) == []
    assert capture.problems(ok, exact=1) == ["196608 outputs checked exactly, not 1"]
    bad = {"status": "ok", "summary": {"numerics_pass": False, "time_ns": None, "oracle": {"c": {
        "failures": 3, "max_error_over_band": 1.5}}}}
    assert capture.problems(bad) == ["numerics did not pass", "oracle: 3 failures, max error / band 1.5",
                                     "no device time"]
    assert capture.problems({"status": "timeout", "message": "killed after 240 s"}) == [
        "status timeout: killed after 240 s"]
