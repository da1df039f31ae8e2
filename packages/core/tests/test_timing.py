"""Timing statistics, the acceptance predicate and CUPTI record grouping, on recorded/synthetic samples."""

import numpy as np
import pytest
from mosaic.errors import BadInput
from mosaic.timing import Scored, accept, measure_noise, measurement, summarize
from mosaic.timing.aa import decide_many
from mosaic.timing.device import TimingError
from mosaic.timing.noise import t_quantile
from mosaic.timing.timer import group_runs, make_timer, run_order, runs_from_records, split_interleaved


def test_accept_truth_table():
    best = Scored(True, 100.0, 5.0)
    assert accept(Scored(True, 97.0, 9.0), best, noise=2.0)  # faster beyond the noise
    assert not accept(Scored(True, 98.5, 9.0), best, noise=2.0)  # inside the noise, farther
    assert accept(Scored(True, 98.5, 4.0), best, noise=2.0)  # inside the noise, closer: tie-break
    assert accept(Scored(True, 101.9, 4.0), best, noise=2.0)  # slower but within noise and closer
    assert not accept(Scored(True, 102.1, 0.0), best, noise=2.0)  # slower beyond the noise
    assert not accept(Scored(True, 98.0, 5.0), best, noise=2.0)  # exactly at -noise, equal D: no
    assert accept(Scored(True, 97.999, 5.0), best, noise=2.0)
    assert not accept(Scored(False, None, 0.0), best, noise=2.0)  # failed numerics: never timed
    assert not accept(Scored(False, 1.0, 0.0), best, noise=2.0)
    with pytest.raises(BadInput):
        accept(Scored(True, 1.0), best, noise=float("nan"))
    with pytest.raises(BadInput):
        accept(Scored(True, None), best, noise=1.0)


def test_summary_and_measurement():
    s = summarize([5, 1, 3, 2, 4, 100])
    assert (s.runs, s.median, s.min, s.max) == (6, 3.5, 1.0, 100.0)
    assert s.mad == pytest.approx(1.5)
    assert measurement([10, 11, 1000]) == 11
    with pytest.raises(BadInput):
        summarize([])
    with pytest.raises(BadInput):
        summarize([1.0, -2.0])


def test_noise_is_a_prediction_bound_from_interleaved_self_pairs():
    # blocks (2i, 2i+1) are the reference against itself; a clock step moves a pair together
    blocks = [[100, 101, 99], [100, 100, 100], [120, 121, 122], [121, 121, 500], [98, 98, 98], [99, 98, 97],
              [130, 130, 130], [130, 131, 129], [101, 101, 101], [100, 100, 100]]
    n = measure_noise(blocks)
    diffs = [100 - 100, 121 - 121, 98 - 98, 130 - 130, 101 - 100]
    assert n.differences == tuple(float(d) for d in diffs)
    assert n.value == pytest.approx(t_quantile(4) * np.std(diffs, ddof=1))
    assert n.value < 5 < n.to_json()["sequential_range_ns"]  # the drift is not taken for noise
    assert t_quantile(19) == pytest.approx(2.8609, abs=1e-3) and t_quantile(4) == pytest.approx(4.604, rel=3e-3)
    assert t_quantile(10_000) == pytest.approx(2.5758, abs=1e-3)
    assert measure_noise([[7, 7, 7]] * 10).value == 0
    with pytest.raises(BadInput, match="at least 10 blocks"):
        measure_noise(blocks[:8])
    with pytest.raises(BadInput, match="even number"):
        measure_noise(blocks + [[1, 2, 3]])
    with pytest.raises(BadInput, match="fewer than 3"):
        measure_noise([*blocks[:9], [1, 2]])


def _pair_sampler(rng, mean_best, mean_cand, rel_sd=0.004, runs=30, clock_sd=0.02):
    """One block timed interleaved run by run: the clock of that block (which drifts by a few % between
    blocks, as on the H200) scales both kernels alike."""
    def measure(candidate_first: bool):
        clock = 1 + clock_sd * rng.standard_normal()
        b = list(mean_best * clock * (1 + rel_sd * rng.standard_normal(runs)))
        c = list(mean_cand * clock * (1 + rel_sd * rng.standard_normal(runs)))
        return b, c

    return measure


def test_aa_false_win_rate_and_planted_variants_under_clock_drift():
    rng = np.random.default_rng(0)
    ref = _pair_sampler(rng, 170_000.0, 170_000.0)
    wins = 0
    for _ in range(10):  # 10 calibrations x 200 A/A decisions: the rate, not one lucky draw
        blocks = [blk for _ in range(20) for blk in ref(False)]
        noise = measure_noise(blocks)
        assert 0 < noise.relative < 0.01  # a 2% clock drift between blocks is not noise
        aa = decide_many("A/A", ref, noise, 200)
        wins += aa.wins
    assert wins / 2000 <= 0.01
    slow = decide_many("slow", _pair_sampler(rng, 170_000.0, 170_000.0 * 1.03), noise, 20)
    assert slow.wins == 0 and slow.slower == 20 and slow.mean_ratio == pytest.approx(1.03, abs=0.005)
    fast = decide_many("fast", _pair_sampler(rng, 170_000.0, 170_000.0 * 0.97), noise, 20)
    assert fast.wins == 20


def _rec(name, start, end, **kw):
    return {"name": name, "start": start, "end": end, "grid": kw.get("grid", (132, 1, 1)), "block": (384, 1, 1),
            "cluster": kw.get("cluster", (2, 1, 1)), "static_smem": 0, "dynamic_smem": 214016, "registers": 168,
            "local_mem": 0, "correlation": 0, "stream": 7}


def test_cupti_records_grouped_per_run():
    recs = [_rec("gemm", 1000 * i, 1000 * i + 170) for i in range(4)][::-1]
    times, starts, ends, k, launch = runs_from_records(recs, 4)
    assert times == [170] * 4 and k == 1 and starts == [0, 1000, 2000, 3000]
    assert launch.grid == (132, 1, 1) and launch.cluster == (2, 1, 1) and launch.dynamic_smem == 214016
    assert launch.registers_per_thread == 168 and launch.source == "cupti"
    two = []
    for i in range(3):  # a library call that launches a main kernel and a reduction per run
        two += [_rec("main", 1000 * i, 1000 * i + 150, grid=(8, 8, 1)), _rec("reduce", 1000 * i + 160, 1000 * i + 175)]
    times, _, _, k, launch = runs_from_records(two, 3)
    assert k == 2 and times == [175] * 3 and launch.kernel_name == "main"
    with pytest.raises(TimingError, match="cannot attribute"):
        group_runs(two[:-1], 3)


def test_timer_falls_back_to_events_and_says_why():
    try:
        import cupti  # noqa: F401
        pytest.skip("cupti-python is installed here; the fallback path is not taken")
    except ImportError:
        pass
    try:
        timer = make_timer("cupti")
    except TimingError as exc:  # no cuda-python either: nothing to fall back to, said so
        assert "cuda-python" in exc.what
        return
    assert timer.source == "cuda-events" and "CUPTI unavailable" in timer.reason


def test_interleaved_runs_alternate_the_lead_and_are_attributed_to_their_kernel():
    assert [run_order(i, 2) for i in range(4)] == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert run_order(1, 3) == [2, 1, 0] and run_order(5, 1) == [0]
    recs, t = [], 0
    for i in range(3):  # A B, B A, A B with distinct durations per kernel
        for j in run_order(i, 2):
            recs.append(_rec("A" if j == 0 else "B", t, t + (100 if j == 0 else 250)))
            t += 1000
    per, k = split_interleaved(recs[::-1], 3, 2)
    assert k == 1 and [r["name"] for r in per[0]] == ["A"] * 3 and [r["name"] for r in per[1]] == ["B"] * 3
    assert runs_from_records(per[1], 3)[0] == [250, 250, 250]
