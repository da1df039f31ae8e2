"""Timing statistics, the acceptance predicate and CUPTI record grouping, on recorded/synthetic samples."""

import numpy as np
import pytest
from mosaic.errors import BadInput
from mosaic.timing import Scored, accept, measure_noise, measurement, summarize
from mosaic.timing.aa import decide_many
from mosaic.timing.device import TimingError
from mosaic.timing.noise import t_quantile
from mosaic.timing.timer import group_runs, make_timer, runs_from_records


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


def test_noise_is_a_prediction_bound_from_block_medians():
    blocks = [[100, 101, 99], [102, 103, 104], [98, 98, 500], [100, 100, 100], [101, 101, 101]]
    n = measure_noise(blocks)
    medians = [100, 103, 98, 100, 101]
    assert n.block_medians == tuple(medians) and n.reference_time == 100
    assert n.value == pytest.approx(t_quantile(4) * np.sqrt(2) * np.std(medians, ddof=1))
    assert n.to_json()["range_ns"] == 5
    assert t_quantile(19) == pytest.approx(2.8609, abs=1e-3) and t_quantile(4) == pytest.approx(4.604, rel=3e-3)
    assert t_quantile(10_000) == pytest.approx(2.5758, abs=1e-3)
    assert measure_noise([[7, 7, 7]] * 5).value == 0
    with pytest.raises(BadInput, match="at least 5 blocks"):
        measure_noise(blocks[:4])
    with pytest.raises(BadInput, match="fewer than 3"):
        measure_noise([*blocks[:4], [1, 2]])


def _sampler(rng, mean, rel_sd=0.004, runs=30, drift=None):
    def measure():
        base = mean * (1 + (drift() if drift else 0.0))
        return list(base * (1 + rel_sd * rng.standard_normal(runs)))

    return measure


def test_aa_false_win_rate_and_planted_variants_on_synthetic_samples():
    rng = np.random.default_rng(0)
    block_jitter = lambda: 0.002 * rng.standard_normal()  # noqa: E731  between-block drift
    ref = _sampler(rng, 170_000.0, drift=block_jitter)
    wins = 0
    for _ in range(10):  # 10 calibrations x 200 A/A decisions: the rate, not one lucky draw
        noise = measure_noise([ref() for _ in range(20)])
        assert 0 < noise.relative < 0.03
        aa = decide_many("A/A", ref, ref, noise, 200)
        wins += aa.wins
    assert wins / 2000 <= 0.01
    slow = decide_many("slow", ref, _sampler(rng, 170_000.0 * 1.03, drift=block_jitter), noise, 20)
    assert slow.wins == 0 and slow.slower == 20 and slow.mean_ratio == pytest.approx(1.03, abs=0.005)
    fast = decide_many("fast", ref, _sampler(rng, 170_000.0 * 0.97, drift=block_jitter), noise, 20)
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
