"""Device timers. CUPTI activity records (``CONCURRENT_KERNEL``) through cupti-python are the timer;
CUDA events are a declared fallback, used only when CUPTI cannot be loaded, and the bundle says so.

``time(runnable, runs, warmup, flush)``: ``warmup`` untimed runs, then ``runs`` timed ones, each preceded
by ``flush()`` (an L2 flush); one run is everything ``runnable.launch()`` enqueues. With CUPTI a run's
device time is end of its last kernel minus start of its first (one kernel for most kernels; a library
call that launches k kernels per run is grouped in k's, and a record count that is not a multiple of the
runs is an error, never guessed around). The launch record (grid, block, cluster, static/dynamic shared
memory, registers, local memory) comes from the activity record of the run's longest kernel.
"""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Callable

import attrs

from mosaic.records import LaunchRecord
from mosaic.timing.device import TimingError, cudart, gpu_clocks, synchronize
from mosaic.timing.throttle import PowerSample, sample_power


@attrs.frozen
class TimedRuns:
    source: str  # "cupti" | "cuda-events"
    times_ns: tuple
    starts_ns: tuple = ()
    ends_ns: tuple = ()
    kernels_per_run: int = 1
    kernel_names: tuple = ()
    launch: LaunchRecord | None = None
    warmup: int = 0
    flush: str = ""
    clocks_before: dict = attrs.field(factory=dict)
    clocks_after: dict = attrs.field(factory=dict)
    fallback_reason: str = ""
    power: PowerSample | None = None  # sampled after this round's runs, before the next round (throttle.py)

    def to_json(self) -> dict:
        return {"source": self.source, "unit": "ns", "runs": len(self.times_ns), "warmup": self.warmup,
                "flush": self.flush, "kernels_per_run": self.kernels_per_run,
                "kernel_names": list(self.kernel_names), "times_ns": list(self.times_ns),
                "starts_ns": list(self.starts_ns), "ends_ns": list(self.ends_ns),
                "clock": "CUPTI device timestamps (ns)" if self.source == "cupti" else
                         "cudaEventElapsedTime around each launch (includes launch gaps)",
                "clocks_before": self.clocks_before, "clocks_after": self.clocks_after,
                "fallback_reason": self.fallback_reason,
                "launch": self.launch.to_json() if self.launch else None,
                **({"power": self.power.to_json()} if self.power is not None else {})}


def group_runs(records: list[dict], runs: int) -> tuple[list[list[dict]], int]:
    """Split kernel records (sorted by start) into ``runs`` consecutive groups of equal size."""
    if runs <= 0:
        raise TimingError("runs must be positive")
    if not records or len(records) % runs:
        raise TimingError(f"CUPTI returned {len(records)} kernel record(s) for {runs} run(s); "
                          "cannot attribute them to runs")
    k = len(records) // runs
    recs = sorted(records, key=lambda r: r["start"])
    return [recs[i * k:(i + 1) * k] for i in range(runs)], k


def run_order(i: int, n: int) -> list[int]:
    """The launch order of ``n`` interleaved kernels in run ``i``: forward on even runs, reversed on odd."""
    return list(range(n)) if i % 2 == 0 else list(range(n - 1, -1, -1))


def split_interleaved(records: list[dict], runs: int, n: int) -> tuple[list[list[dict]], int]:
    """Attribute the kernel records of ``runs`` interleaved runs of ``n`` kernels (launched in
    :func:`run_order`) to each kernel, in time order. -> (records per kernel, kernels per launch)."""
    groups, k = group_runs(records, runs * n)
    owner = [j for i in range(runs) for j in run_order(i, n)]
    return [[rec for g, who in zip(groups, owner, strict=True) if who == j for rec in g] for j in range(n)], k


def launch_record(rec: dict) -> LaunchRecord:
    return LaunchRecord(kernel_name=rec["name"], grid=tuple(rec["grid"]), block=tuple(rec["block"]),
                        cluster=tuple(max(1, c) for c in rec["cluster"]), static_smem=rec["static_smem"],
                        dynamic_smem=rec["dynamic_smem"], registers_per_thread=rec["registers"],
                        local_mem_per_thread=rec["local_mem"], source="cupti")


def runs_from_records(records: list[dict], runs: int) -> tuple[list[int], list[int], list[int], int, LaunchRecord]:
    groups, k = group_runs(records, runs)
    starts = [g[0]["start"] for g in groups]
    ends = [max(r["end"] for r in g) for g in groups]
    times = [e - s for s, e in zip(starts, ends, strict=True)]
    if any(t <= 0 for t in times):
        raise TimingError("CUPTI reported a run with non-positive duration")
    main = max(groups[0], key=lambda r: r["end"] - r["start"])
    return times, starts, ends, k, launch_record(main)


_CUPTI: dict = {"registered": False, "records": [], "lock": threading.Lock()}


def _record(a, kind_names) -> dict:
    g = lambda name, default=0: getattr(a, name, default)  # noqa: E731
    return {"name": str(g("name", "?")), "start": int(a.start), "end": int(a.end),
            "grid": (g("grid_x", 1), g("grid_y", 1), g("grid_z", 1)),
            "block": (g("block_x", 1), g("block_y", 1), g("block_z", 1)),
            "cluster": (g("cluster_x", 1), g("cluster_y", 1), g("cluster_z", 1)),
            "static_smem": int(g("static_shared_memory")), "dynamic_smem": int(g("dynamic_shared_memory")),
            "registers": int(g("registers_per_thread")), "local_mem": int(g("local_memory_per_thread")),
            "correlation": int(g("correlation_id")), "stream": int(g("stream_id"))}


class CuptiTimer:
    source = "cupti"

    def __init__(self) -> None:
        try:
            from cupti import cupti  # type: ignore[import-not-found]
        except ImportError as exc:
            raise TimingError(f"cupti-python is not importable ({exc}); pip install cupti-python") from None
        self._cupti = cupti
        kinds = (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.KERNEL)
        if not _CUPTI["registered"]:
            def requested():
                return 8 * 1024 * 1024, 0

            def completed(activities):
                got = [_record(a, kinds) for a in activities if getattr(a, "kind", None) in kinds]
                with _CUPTI["lock"]:
                    _CUPTI["records"].extend(got)

            try:
                cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
                try:
                    cupti.activity_enable_launch_attributes(1)  # cluster dimensions in kernel records
                except Exception:  # noqa: BLE001 - older CUPTI: cluster fields stay as reported
                    pass
                cupti.activity_register_callbacks(requested, completed)
            except Exception as exc:  # noqa: BLE001
                raise TimingError(f"CUPTI could not be enabled: {exc}") from None
            _CUPTI["registered"] = True

    def _drain(self) -> list[dict]:
        self._cupti.activity_flush_all(1)
        with _CUPTI["lock"]:
            recs, _CUPTI["records"] = _CUPTI["records"], []
        return recs

    def time(self, runnable, runs: int, warmup: int = 10, flush: Callable[[], None] | None = None,
             flush_name: str = "", clocks: bool = True, power: bool = True) -> TimedRuns:
        return self.time_interleaved([runnable], runs, warmup, flush, flush_name, clocks, power)[0]

    def time_interleaved(self, runnables, runs: int, warmup: int = 10, flush: Callable[[], None] | None = None,
                         flush_name: str = "", clocks: bool = True, power: bool = True) -> list[TimedRuns]:
        """Time several kernels alternately, run by run, each run after its own flush, so a clock step
        during the block affects all of them alike. The order alternates every run (A B, B A, A B, ...:
        ABBA counterbalancing), because on the H200 the kernel that ran first in a pair was measured
        ~0.16% faster, a bias that would otherwise favour whichever kernel leads. One TimedRuns per
        runnable."""
        flush = flush or (lambda: None)
        n = len(runnables)
        synchronize()
        for i in range(warmup):
            for j in run_order(i, n):
                flush()
                runnables[j].launch()
        synchronize()
        self._drain()
        before = gpu_clocks() if clocks else {}
        for i in range(runs):
            for j in run_order(i, n):
                flush()
                runnables[j].launch()
        synchronize()
        sample = sample_power(round_end=_time.perf_counter()) if power else None  # between rounds
        recs = self._drain()
        after = gpu_clocks() if clocks else {}
        per_kernel, k = split_interleaved(recs, runs, n)
        out = []
        for mine in per_kernel:
            times, starts, ends, _, launch = runs_from_records(mine, runs)
            names = tuple(dict.fromkeys(r["name"] for r in mine))
            out.append(TimedRuns("cupti", tuple(times), tuple(starts), tuple(ends), k, names, launch, warmup,
                                 flush_name, before, after, power=sample))
        return out


class EventTimer:
    """CUDA events around each launch: a fallback that also measures launch gaps (DESIGN.md)."""

    source = "cuda-events"

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        self._rt = cudart()

    def time(self, runnable, runs: int, warmup: int = 10, flush: Callable[[], None] | None = None,
             flush_name: str = "", clocks: bool = True, power: bool = True) -> TimedRuns:
        return self.time_interleaved([runnable], runs, warmup, flush, flush_name, clocks, power)[0]

    def time_interleaved(self, runnables, runs: int, warmup: int = 10, flush: Callable[[], None] | None = None,
                         flush_name: str = "", clocks: bool = True, power: bool = True) -> list[TimedRuns]:
        rt = self._rt
        flush = flush or (lambda: None)
        for i in range(warmup):
            for j in run_order(i, len(runnables)):
                flush()
                runnables[j].launch()
        synchronize()
        before = gpu_clocks() if clocks else {}
        pairs: list[list] = [[] for _ in runnables]
        for i in range(runs):
            for j in run_order(i, len(runnables)):
                start = rt.cudaEventCreate()[1]
                end = rt.cudaEventCreate()[1]
                flush()
                rt.cudaEventRecord(start, 0)
                runnables[j].launch()
                rt.cudaEventRecord(end, 0)
                pairs[j].append((start, end))
        synchronize()
        sample = sample_power(round_end=_time.perf_counter()) if power else None  # between rounds
        after = gpu_clocks() if clocks else {}
        out = []
        for mine in pairs:
            times = []
            for start, end in mine:
                err, ms = rt.cudaEventElapsedTime(start, end)
                if int(err) != 0:
                    raise TimingError(f"cudaEventElapsedTime failed: {err!s}")
                times.append(int(round(ms * 1e6)))
                rt.cudaEventDestroy(start)
                rt.cudaEventDestroy(end)
            out.append(TimedRuns("cuda-events", tuple(times), (), (), 1, (), None, warmup, flush_name, before,
                                 after, fallback_reason=self.reason, power=sample))
        return out


def make_timer(prefer: str = "cupti"):
    """CUPTI if it loads; otherwise the events fallback, carrying the reason (recorded in the bundle)."""
    if prefer == "cupti":
        try:
            return CuptiTimer()
        except TimingError as exc:
            return EventTimer(reason=f"CUPTI unavailable: {exc.what}")
    if prefer == "cuda-events":
        return EventTimer(reason="requested")
    raise TimingError(f"unknown timer '{prefer}'; known: cupti, cuda-events")
