#!/usr/bin/env python3
"""The memory-path ceiling of the Pallas row-wise pipeline (issue #19): the rmsnorm template of
mosaic_target_pallas.rowwise with its arithmetic removed (``build(block_body=...)``: the same block shape, TMA
copies, stages, output slots, barriers and weight-row copy), checked bitwise (y == x) and timed interleaved with
the rmsnorm template itself at the same knobs and with torch's copy, by core's CUPTI timer after an L2 flush,
the median of ``--blocks`` blocks of ``--runs`` runs.

    python3 benchmarks/pallas_copy_ceiling.py [--only "defaults;max_concurrent_steps=3,out_slots=0"] [--shape 16384x8192]
    # one line per configuration; writes $OUT/pallas_copy_ceiling.json

Columns (device time, us): ``copy`` y = x through registers (each box loaded from the stage and stored, the
loads and stores of the rmsnorm's last pass); ``store`` y = x stored straight from the stage (in place, TMA
only: the pipeline with no register pass at all; ``-`` elsewhere); ``rmsnorm`` the template at the same
knobs; ``torch`` torch's element-wise copy kernel; ``quack`` quack-kernels' rmsnorm (when it imports; built
once). TB/s is 2 x bytes / time of the copy column.

torch's ``y.copy_(x)`` between contiguous tensors of one dtype is a ``cudaMemcpyAsync`` device to device, which
CUPTI reports as a memcpy, not a kernel: the CUPTI timer cannot see it. The torch column is therefore torch's
element-wise kernel doing the same copy bit for bit (``bitwise_or(x, 0, out=y)`` on the int16 view: one
vectorized read and write per element); one line beside the table times ``y.copy_(x)`` itself with CUDA events
on torch's stream, interleaved with that kernel, so the two torch copies can be compared.

``--serialize`` (default): every timed launch runs alone on the device (a device synchronize before and after:
jax launches on its own stream and torch on the default stream, so otherwise a jax kernel may overlap the L2
flush or the torch kernel); ``--no-serialize`` launches as pallas_rowwise.py does. Either way the JSON counts
the timed runs of each column that overlapped a run of another column (CUPTI start/end stamps).

Configurations: ``knob=value,...;...`` over RmsnormKnobs' defaults (``defaults``: none), refused in one line
(exit 2) before any GPU work when a knob or value is unknown or does not fit the shape; no GPU: one line, exit 2.
``--time-budget S`` (default 80) starts no configuration after S seconds.
"""

from __future__ import annotations

import statistics
import time
import traceback
from pathlib import Path

from _device import OneLineParser, add_json, gpu_record, json_path, log, plain, write_json
from pallas_rowwise import parse_configs, row_sample_check, timed

START = time.time()
#: the best rmsnorm configurations of the session-10 sweep (results/2026-12-02/session10/2), plus the deepest
#: in-place pipeline that fits 8192 columns, the direct (no shared memory) path and TMA loads with register stores
DEFAULT_ONLY = ("defaults;max_concurrent_steps=3,out_slots=0;max_concurrent_steps=3,out_slots=0,blocks_per_cta=8;"
                "block_rows=2,vector=4,out_slots=0;auto_barriers=true;copy=direct;copy=tma_in,block_rows=2,vector=4;"
                "copy=tma_in,block_rows=2,vector=4,blocks_per_cta=8,max_concurrent_steps=3")
FAMILY = "rmsnorm"  # the pipeline measured is the rmsnorm template's (its weight-row copy included)


def copy_fn(knobs: dict, rows: int, cols: int, dtype, block_body: str = "copy", into: bool = False):
    """The rmsnorm template's pipeline at ``knobs`` with ``block_body`` ('copy' or 'store') for its arithmetic:
    ``f(x, w) -> x`` (``into=True``: ``f(x, w, out)``)."""
    from mosaic_target_pallas.rowwise import build
    from mosaic_target_pallas.rowwise_knobs import RmsnormKnobs

    return build(FAMILY, RmsnormKnobs(**knobs), rows, cols, dtype, into=into, block_body=block_body)


def lower_copy(knobs: dict, rows: int, cols: int, gpu, workdir: Path, dtype: str = "bf16", block_body: str = "copy"):
    """Lower the copy variant for the cuda platform through the backend's ``lower_fn`` (the shared-memory probe,
    the StableHLO): what the CPU test checks."""
    import jax
    from mosaic.records import KernelSpec
    from mosaic_target_pallas import backend as be
    from mosaic_target_pallas.rowwise import arg_shapes

    jdt = be._jax_dtype(KernelSpec(family=FAMILY, shape={"rows": rows, "cols": cols}, dtype=dtype,
                                   language="pallas"))
    fn = copy_fn(knobs, rows, cols, jdt, block_body)
    args = [jax.ShapeDtypeStruct(shape, jdt) for _, shape in arg_shapes(FAMILY, rows, cols)]
    return be.lower_fn(be.PallasBackend(), fn, args, f"pallas_{block_body}_ceiling", gpu, workdir,
                       [f"block_body={block_body}"])


class TorchCopy:
    """y = x by torch on the GPU. ``how="kernel"``: ``bitwise_or(x, 0, out=y)`` on int16 views (torch's vectorized
    element-wise kernel, bit for bit a copy, visible to CUPTI); ``how="copy_"``: ``y.copy_(x)`` (a
    cudaMemcpyAsync device to device: CUDA events only)."""

    def __init__(self, x, how: str):
        import torch

        self.torch, self.how = torch, how
        self.x = x
        self.y = torch.empty_like(x)
        self.xi, self.yi = x.view(torch.int16), self.y.view(torch.int16)

    def launch(self) -> None:
        if self.how == "kernel":
            self.torch.bitwise_or(self.xi, 0, out=self.yi)
        else:
            self.y.copy_(self.x)

    def poison(self) -> None:
        self.y.fill_(float("nan"))

    def exact(self) -> bool:
        self.torch.cuda.synchronize()
        return bool(self.torch.equal(self.yi, self.xi))

    def close(self) -> None:
        self.x = self.y = self.xi = self.yi = None


class Quack:
    """quack-kernels' rmsnorm ``quack.rmsnorm.rmsnorm(x, w, eps)`` (its own heuristic config), output ``y``."""

    def __init__(self, x, w, eps: float):
        from quack.rmsnorm import rmsnorm

        self.fn, self.x, self.w, self.eps = rmsnorm, x, w, eps
        self.out = None

    def launch(self) -> None:
        self.out = self.fn(self.x, self.w, eps=self.eps)

    def output(self) -> dict:
        import torch

        torch.cuda.synchronize()
        out = self.out[0] if isinstance(self.out, tuple | list) else self.out  # some versions return (out, ...)
        return {"y": out.float().cpu().numpy()}

    def close(self) -> None:
        self.x = self.w = self.out = None


def pallas_copy(knobs, rows, cols, inputs, block_body):
    """A PallasRunnable of the copy variant writing into a NaN-poisoned buffer, and whether y == x bit for bit
    in that very buffer."""
    import jax.numpy as jnp
    import numpy as np
    from mosaic_target_pallas.runnable import PallasRunnable

    fn = copy_fn(knobs, rows, cols, jnp.bfloat16, block_body, into=True)
    run = PallasRunnable(fn, [inputs["x"], inputs["w"]], jnp.bfloat16, (rows, cols), out_name="y", writes_into=True)
    run.poison()
    run.launch()
    run.output()
    got = np.asarray(run.out).view(np.uint16)
    want = np.asarray(run.args[0]).view(np.uint16)
    mismatches = int(np.count_nonzero(got != want))
    return run, mismatches, bool(run.poison_effective)


def overlaps(timings) -> list[int]:
    """For each column, how many of its timed runs overlap (CUPTI start/end) a timed run of another column."""
    spans = [list(zip(t.starts_ns, t.ends_ns, strict=True)) for t in timings]
    out = []
    for i, mine in enumerate(spans):
        others = [s for j, sp in enumerate(spans) if j != i for s in sp]
        out.append(sum(any(s < oe and os_ < e for os_, oe in others) for s, e in mine))
    return out


def timed_with_overlap(timer, flush, runnables, runs, blocks):
    """``pallas_rowwise.timed`` (medians, us) and, from one extra block, the overlap count and the kernel names
    of each column."""
    us = timed(timer, flush, runnables, runs, blocks)
    extra = timer.time_interleaved(runnables, runs, warmup=1, flush=flush, clocks=False, power=False)
    over = overlaps(extra) if all(t.starts_ns for t in extra) else None
    return us, over, [list(t.kernel_names) for t in extra]


def _time_columns(cols_run, timer, flush, runs, blocks, serialize):
    from mosaic.timing.device import Serialized  # every run alone on the device (the live sessions' wrapper)

    launch = [Serialized(r) if serialize else r for r in cols_run.values()]
    return timed_with_overlap(timer, flush, launch, runs, blocks)


def one(knobs, rows, cols, gpu, timer, flush, runs, blocks, workdir, inputs, torch_copy, quack, serialize) -> dict:
    from mosaic.records import KernelSpec
    from mosaic_target_pallas.backend import PallasBackend

    nbytes = 2 * rows * cols * 2  # read x + write y, bf16
    row = {"knobs": knobs, "status": "failed"}
    closers = []
    try:
        t0 = time.monotonic()
        copy, bad, poisoned = pallas_copy(knobs, rows, cols, inputs, "copy")
        closers.append(copy)
        row.update({"copy_mismatches": bad, "copy_poison_effective": poisoned})
        cols_run = {"copy": copy}
        if knobs["out_slots"] == 0 and knobs["copy"] == "tma":
            store, bad, poisoned = pallas_copy(knobs, rows, cols, inputs, "store")
            closers.append(store)
            row.update({"store_mismatches": bad, "store_poison_effective": poisoned})
            cols_run["store"] = store
        spec = KernelSpec(family=FAMILY, shape={"rows": rows, "cols": cols}, dtype="bf16", language="pallas",
                          knobs=knobs)
        rms = PallasBackend().prepare(spec, gpu, workdir, inputs)
        closers.append(rms)
        rms.poison()
        rms.launch()
        passed, reason, _ = row_sample_check(FAMILY, inputs, rms.output(), "bf16")
        row.update({"rmsnorm_oracle_pass": passed, "rmsnorm_reason": reason})
        cols_run["rmsnorm"] = rms
        cols_run["torch"] = torch_copy
        if quack is not None:
            cols_run["quack"] = quack
        row["prepare_s"] = round(time.monotonic() - t0, 2)
        try:
            us, over, kernels = _time_columns(cols_run, timer, flush, runs, blocks, serialize)
        except Exception as exc:  # noqa: BLE001 - e.g. quack launching a different kernel count: time without it
            if "quack" not in cols_run:
                raise
            row["quack_error"] = f"{type(exc).__name__}: {exc}"[:300]
            del cols_run["quack"]
            us, over, kernels = _time_columns(cols_run, timer, flush, runs, blocks, serialize)
        names = list(cols_run)
        row["kernels"] = dict(zip(names, kernels, strict=True))
        row["us"] = dict(zip(names, us, strict=True))
        row["overlapping_runs"] = None if over is None else dict(zip(names, over, strict=True))
        row["copy_tb_s"] = nbytes / (row["us"]["copy"] * 1e-6) / 1e12
        row["torch_tb_s"] = nbytes / (row["us"]["torch"] * 1e-6) / 1e12
        if "store" in row["us"]:
            row["store_tb_s"] = nbytes / (row["us"]["store"] * 1e-6) / 1e12
        row["exact"] = row["copy_mismatches"] == 0 and row.get("store_mismatches", 0) == 0
        row["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - a failing configuration is a row
        row.update({"error": f"{type(exc).__name__}: {exc}"[:400], "trace": traceback.format_exc()[-1500:]})
    finally:
        for r in closers:
            r.close()
    return row


HEAD = (f"{'config':58s} {'copy us':>8s} {'store us':>8s} {'rmsnorm':>8s} {'torch us':>8s} {'quack':>8s} "
        f"{'copy TB/s':>9s} {'torch TB/s':>10s}  check")


def line(r: dict, base: dict) -> str:
    edit = ",".join(f"{k}={v}" for k, v in r["knobs"].items() if base.get(k) != v) or "defaults"
    if r["status"] != "ok":
        return f"{edit:58s} FAILED: {r.get('error', r['status'])}"
    us = r["us"]

    def cell(k):
        return f"{us[k]:8.2f}" if k in us else f"{'-':>8s}"

    checks = [f"copy {'exact' if r['copy_mismatches'] == 0 else str(r['copy_mismatches']) + ' differ'}"]
    if "store_mismatches" in r:
        checks.append(f"store {'exact' if r['store_mismatches'] == 0 else str(r['store_mismatches']) + ' differ'}")
    checks.append(f"rmsnorm {'pass' if r['rmsnorm_oracle_pass'] else 'FAIL: ' + r['rmsnorm_reason'][:120]}")
    if r.get("overlapping_runs") and any(r["overlapping_runs"].values()):
        checks.append(f"OVERLAP {r['overlapping_runs']}")
    return (f"{edit:58s} {cell('copy')} {cell('store')} {cell('rmsnorm')} {cell('torch')} {cell('quack')} "
            f"{r['copy_tb_s']:9.3f} {r['torch_tb_s']:10.3f}  {'; '.join(checks)}")


def memcpy_line(torch_kernel, torch_memcpy, flush, runs, blocks) -> dict:
    """torch ``y.copy_(x)`` (cudaMemcpyAsync) vs torch's copy kernel, CUDA events on the default stream."""
    from mosaic.timing.timer import EventTimer

    try:
        ev = EventTimer(reason="torch copy_ is a memcpy, invisible to CUPTI's kernel records")
        per = [[], []]
        for i in range(blocks):
            got = ev.time_interleaved([torch_kernel, torch_memcpy], runs, warmup=5 if i == 0 else 1, flush=flush,
                                      clocks=False, power=False)
            for j, t in enumerate(got):
                per[j].append(statistics.median(t.times_ns))
        k, m = (statistics.median(p) / 1e3 for p in per)
        return {"status": "ok", "timer": "cuda-events", "torch_kernel_us": k, "torch_copy__us": m,
                "memcpy_exact": torch_memcpy.exact()}
    except Exception as exc:  # noqa: BLE001
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:400]}



def main() -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="16384x8192")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--gpu", default=None, help="GPU record name (default: the detected device's record)")
    p.add_argument("--only", default=DEFAULT_ONLY, help="configurations 'knob=value,...;...' over RmsnormKnobs")
    p.add_argument("--quack", choices=("auto", "off"), default="auto",
                   help="time quack-kernels' rmsnorm too when it imports (auto)")
    p.add_argument("--serialize", action="store_true", default=True,
                   help="a device synchronize before and after every timed launch (default)")
    p.add_argument("--no-serialize", dest="serialize", action="store_false")
    p.add_argument("--time-budget", type=float, default=80.0, help="start no configuration after S seconds")
    add_json(p, "pallas_copy_ceiling")
    a = p.parse_args()
    a.gpu = gpu_record(a.gpu, on_device=True)
    import tempfile

    import attrs
    from mosaic.errors import MosaicError
    from mosaic.families import make_inputs, physical_floor_ns
    from mosaic.plugins import host
    from mosaic.records import KernelSpec
    from mosaic.timing.device import L2Flush
    from mosaic.timing.timer import make_timer
    from mosaic_target_pallas.rowwise import EPS
    from mosaic_target_pallas.rowwise_knobs import RmsnormKnobs

    if a.runs < 1 or a.blocks < 1:
        p.error("--runs and --blocks must be >= 1")
    try:
        rows, cols = (int(x) for x in a.shape.lower().split("x"))
    except ValueError:
        p.error(f"--shape must be ROWSxCOLS, got {a.shape!r}")
    gpu = host().get("gpus", a.gpu)
    try:
        configs = parse_configs(a.only, RmsnormKnobs, rows, cols, gpu, "bf16")
    except ValueError as exc:
        p.error(str(exc))
    try:
        timer = make_timer("cupti")
        flush = L2Flush(gpu.l2_bytes)
    except MosaicError as exc:
        print(f"pallas_copy_ceiling: error: needs a CUDA device ({exc.line()})", flush=True)
        return 2
    import torch

    log(f"timer {timer.source} {getattr(timer, 'reason', '')}; gpu record {gpu.name}; {rows}x{cols} bf16; "
        f"serialize={a.serialize}")
    shape = {"rows": rows, "cols": cols}
    inputs = make_inputs(KernelSpec(FAMILY, shape, "bf16", "torch"), 0, "normal")
    x = torch.from_numpy(inputs["x"]).to("cuda").to(torch.bfloat16).contiguous()
    w = torch.from_numpy(inputs["w"]).to("cuda").to(torch.bfloat16).contiguous()
    torch_copy, torch_memcpy = TorchCopy(x, "kernel"), TorchCopy(x, "copy_")
    torch_copy.poison()
    torch_copy.launch()
    log(f"torch copy kernel (bitwise_or 0 on int16) exact: {torch_copy.exact()}")
    quack, quack_note = None, "off"
    if a.quack == "auto":
        try:
            t0 = time.monotonic()
            quack = Quack(x, w, EPS)
            quack.launch()
            passed, reason, _ = row_sample_check(FAMILY, inputs, quack.output(), "bf16")
            quack_note = (f"built in {time.monotonic() - t0:.1f} s, oracle (rows) "
                          f"{'pass' if passed else 'FAIL: ' + reason[:200]}")
        except Exception as exc:  # noqa: BLE001 - the quack column is optional
            quack, quack_note = None, f"not timed: {type(exc).__name__}: {str(exc)[:200]}"
    log(f"quack rmsnorm: {quack_note}")
    memcpy = memcpy_line(torch_copy, torch_memcpy, flush, a.runs, a.blocks)
    if memcpy["status"] == "ok":
        log(f"torch y.copy_(x) (cudaMemcpyAsync, CUDA events) {memcpy['torch_copy__us']:.2f} us vs torch copy "
            f"kernel {memcpy['torch_kernel_us']:.2f} us (same events, interleaved); copy_ exact: "
            f"{memcpy['memcpy_exact']}")
    else:
        log(f"torch y.copy_(x) timing failed: {memcpy['error']}")
    floor = physical_floor_ns(FAMILY, shape, "bf16", gpu) / 1e3
    log(f"rmsnorm physical floor {floor:.2f} us; a pure copy moves the same bytes")
    base = attrs.asdict(RmsnormKnobs())
    workdir = Path(tempfile.mkdtemp(prefix="pallas_copy_ceiling_"))
    out, t0 = [], time.time()
    print(HEAD, flush=True)
    for knobs in configs:
        if a.time_budget and time.time() - START > a.time_budget:
            log(f"time budget {a.time_budget:.0f} s spent: {knobs} and what follows not run")
            out.append({"knobs": knobs, "status": "not run", "error": "time budget spent"})
            break
        out.append(one(knobs, rows, cols, gpu, timer, flush, a.runs, a.blocks, workdir, inputs, torch_copy, quack,
                       a.serialize))
        print(line(out[-1], base), flush=True)
    for r in (torch_copy, torch_memcpy, quack):
        if r is not None:
            r.close()
    flush.close()
    path = write_json(json_path(a), {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "timer": timer.source, "gpu": gpu.name, "shape": shape,
        "dtype": "bf16", "runs": a.runs, "blocks": a.blocks, "serialize": a.serialize, "floor_us": floor,
        "bytes_moved": 2 * rows * cols * 2, "torch_column": "torch.bitwise_or(x.view(int16), 0, out=y.view(int16))",
        "torch_copy_": memcpy, "quack": quack_note, "seconds": round(time.time() - t0, 1), "rows": out},
        indent=1, default=plain)
    log(f"wrote {path}")
    ok = all(r["status"] == "ok" and r["exact"] and r["rmsnorm_oracle_pass"] for r in out)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
