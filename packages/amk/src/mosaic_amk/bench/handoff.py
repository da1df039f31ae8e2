"""Grid-wide stage hand-off protocols measured alone (handoff.cu): the VM's counter (release add, relaxed polls,
acquire fence), flag-in-data 64-bit words (NCCL's LL protocol: no fence, no atomic) and cooperative grid.sync().

Each kernel runs ``stages`` dependent stages on one block per SM; stage s reads the whole n-float vector the
previous stage wrote (every block a slice) and writes its slice of the next. The time per stage is the floor of one
row-split decode stage's hand-off for that protocol (plus one block reduction of n floats). ``measure`` checks every
launch's result (a stale or torn read changes the last sum) before it reports a time.
"""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path

import attrs
import numpy as np

from mosaic_amk.cuda.build import (
    BuildError,
    cache_dir,
    nvcc_cubin,
    nvcc_path,
    nvcc_version,
    parse_ptxas,
)
from mosaic_amk.cuda.launcher import DeviceError, _cupy

SOURCE = Path(__file__).with_name("handoff.cu")  # built with -I SOURCE_DIR (the VM sources)
PROTOCOLS = {"counter": "handoff_counter", "ll": "handoff_ll", "gridsync": "handoff_gridsync"}  # name -> kernel
KERNELS = tuple(PROTOCOLS.values())
THREADS = 512
TIMEOUT_NS = 2_000_000_000


@attrs.frozen
class HandoffBuild:
    cubin: Path
    ptxas_log: str
    resources: dict  # kernel -> parse_ptxas figures


def build(threads: int = THREADS) -> HandoffBuild:
    """Compile handoff.cu for sm_90a (cached by source, nvcc release and flags)."""
    if threads % 32 or not 32 <= threads <= 1024:
        raise BuildError(f"threads per block must be a multiple of 32 in 32..1024, got {threads}")
    nvcc = nvcc_path()
    flag_list = ["-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-O3", "-lineinfo", "-Xptxas", "-v",
                 f"-DHO_THREADS={threads}", "-std=c++17"]
    h = hashlib.sha256(SOURCE.read_bytes() + nvcc_version(nvcc).encode() + " ".join(flag_list).encode())
    out = cache_dir() / f"handoff-{h.hexdigest()[:24]}"
    cubin, log_path = out / "handoff.cubin", out / "ptxas.log"
    if not (cubin.is_file() and log_path.is_file()):
        nvcc_cubin(nvcc, SOURCE, cubin, log_path, flag_list)
    log = log_path.read_text()
    return HandoffBuild(cubin=cubin, ptxas_log=log, resources={k: parse_ptxas(log, k) for k in KERNELS})


@attrs.frozen
class HandoffResult:
    protocol: str
    n: int
    stages: int
    blocks: int
    us_per_stage: float  # median over launches of launch time / stages
    samples_us: tuple  # every launch's us per stage

    def to_json(self) -> dict:
        return {"protocol": self.protocol, "n": self.n, "stages": self.stages, "blocks": self.blocks,
                "us_per_stage": round(self.us_per_stage, 4), "samples_us": [round(v, 4) for v in self.samples_us]}


def measure(protocols=tuple(PROTOCOLS), ns=(576, 2048), stages: int = 256, launches: int = 20,
            blocks: int = 0, hb: HandoffBuild | None = None) -> list[HandoffResult]:
    """Time every protocol for every vector length: ``launches`` launches each (after one warm-up), the protocols
    interleaved launch by launch; each launch's last sums are checked (every block must read n * stages).
    ``blocks`` 0: one per SM."""
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown:
        raise DeviceError(f"unknown hand-off protocol(s) {unknown}; expected some of {', '.join(PROTOCOLS)}")
    if stages < 2 or launches < 1:
        raise DeviceError("stages must be >= 2 and launches >= 1")
    for n in ns:
        if n * stages >= 1 << 24:
            raise DeviceError(f"n={n} x stages={stages} must stay below 2^24 (the checked sums stay exact)")
    cp = _cupy()
    hb = hb or build()
    mod = cp.RawModule(path=str(hb.cubin), enable_cooperative_groups=True)
    fns = {p: mod.get_function(PROTOCOLS[p]) for p in protocols}
    sms = int(cp.cuda.runtime.deviceGetAttribute(16, cp.cuda.Device().id))
    blocks = blocks or sms
    if blocks > sms:
        raise DeviceError(f"{blocks} blocks > {sms} SMs (one cooperative block per SM)")
    out = []
    for n in ns:
        if n < blocks:
            raise DeviceError(f"n={n} < {blocks} blocks: every block writes a slice")

        xf = cp.zeros((stages + 1) * n, cp.float32)
        x64 = cp.zeros((stages + 1) * n, cp.uint64)
        counters = cp.zeros(stages, cp.int32)
        res = cp.zeros(blocks, cp.float32)
        err = cp.zeros(1, cp.int32)
        samples = {p: [] for p in protocols}
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        tag = 0
        count = 0
        for it in range(launches + 1):
            for p in protocols:
                res.fill(0)
                if p == "ll":
                    tag += 1
                    x64[:n] = (np.uint64(tag) << np.uint64(32)) | np.uint64(np.float32(1).view(np.uint32))
                    args = (x64, np.int32(n), np.int32(stages), np.uint32(tag), res, err, np.int64(TIMEOUT_NS))
                else:
                    xf.fill(0)
                    xf[:n] = 1
                    if p == "counter":
                        count += 1
                        args = (xf, counters, np.int32(n), np.int32(stages), np.int32(count), res, err,
                                np.int64(TIMEOUT_NS))
                    else:
                        args = (xf, np.int32(n), np.int32(stages), res)
                cp.cuda.Stream.null.synchronize()
                start.record()
                fns[p]((blocks,), (THREADS,), args)
                stop.record()
                stop.synchronize()
                if int(err.get()[0]):
                    raise DeviceError(f"{p} hand-off: a wait timed out (n={n}, launch {it})")
                got = cp.asnumpy(res)
                want = np.float32(n * stages)
                if not np.all(got == want):
                    bad = int(np.flatnonzero(got != want)[0])
                    raise DeviceError(f"{p} hand-off read stale data: block {bad} summed {got[bad]}, want {want} "
                                      f"(n={n}, launch {it})")
                if it:
                    samples[p].append(cp.cuda.get_elapsed_time(start, stop) * 1000.0 / stages)
        for p in protocols:
            out.append(HandoffResult(p, n, stages, blocks, statistics.median(samples[p]), tuple(samples[p])))
    return out


def format_table(results: list[HandoffResult]) -> list[str]:
    lines = [f"  {'protocol':<10} {'n':>6} {'stages':>7} {'blocks':>7} {'us/stage':>9}  (min .. max)"]
    for r in results:
        lines.append(f"  {r.protocol:<10} {r.n:>6} {r.stages:>7} {r.blocks:>7} {r.us_per_stage:>9.3f}  "
                     f"({min(r.samples_us):.3f} .. {max(r.samples_us):.3f})")
    return lines


def stage_depth(enc) -> int:
    """The longest chain of dependent counters of one step of an encoded schedule: the grid-wide hand-offs on its
    critical path when every op is skipped (the VM's sync-skeleton probe)."""
    from mosaic_amk.cuda import encode as E

    by_counter: dict[int, list[int]] = {}
    for i in range(len(enc.tasks)):
        by_counter.setdefault(int(enc.tasks[i, E.W_SIGNAL]), []).append(i)
    memo: dict[int, int] = {}

    def depth(c: int, seen: frozenset = frozenset()) -> int:
        if c in memo:
            return memo[c]
        if c in seen:
            raise DeviceError(f"counter {c} waits on itself through a cycle")
        best = 0
        for i in by_counter.get(c, ()):
            rec = enc.tasks[i]
            waits = [int(rec[E.W_WAIT + 2 * k]) for k in range(int(rec[E.W_NWAIT]))]
            best = max(best, 1 + max((depth(w, seen | {c}) for w in waits), default=0))
        memo[c] = best
        return best

    return max((depth(c) for c in by_counter), default=0)
