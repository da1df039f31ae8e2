"""The AMK CUDA VM's synchronisation variants on the H200 (bench.SYNC_VARIANTS; vm.cu sync_flags), each against v0 in
one process: (1) the hand-off chain (2000 no-op tasks, each waiting for the previous one's counter; same SM, SM 0 <->
SM 1, SM 0 <-> SM 66), us per hand-off with the ops skipped and with the add; (2) the planted deadlock trips the
watchdog and a valid chain runs right after; (3) per bench shape, the best unfused config of the first sessions
(Llama-3.2-1B rows32-lm, SmolLM2-135M rows16-lm) and its fused twin under every variant, each gated on greedy-token
equality with HF eager bf16 (a broken variant reports no time), interleaved rounds: full, "skip all ops (sync
skeleton)" and "no prefetch" ms/token. Prints the variant table; the JSON is saved after every part.

Run on the device (repo root), after ``pip install --no-deps --no-build-isolation -e packages/core
-e packages/gpu-hopper -e packages/amk``:
    python3 benchmarks/amk_sync_variants.py [--bench-shapes llama-3.2-1b,smollm2-135m] [--rounds 3] [--budget 200]
                                            [--json PATH]   # about 1.5-2.5 min; $OUT/amk_sync_variants.json
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import numpy as np
from _device import add_json, checked, json_path, time_launch, write_json

T0 = time.time()
BENCH_SHAPES = ("llama-3.2-1b", "smollm2-135m")
BASE_NAME = {"llama-3.2-1b": "rows32-lm", "smollm2-135m": "rows16-lm"}
PROBES = ["skip all ops (sync skeleton)", "no prefetch"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench-shapes", default=",".join(BENCH_SHAPES), help="Shapes to bench ('' for none).")
    p.add_argument("--rounds", type=int, default=3, help="Interleaved bench rounds.")
    p.add_argument("--steps", type=int, default=64, help="Decode steps per bench sample.")
    p.add_argument("--budget", type=float, default=200.0, help="Seconds the bench shapes share (a time guard).")
    add_json(p, "amk_sync_variants")
    return checked(p, p.parse_args(argv), positive=("rounds", "steps"), shapes="bench_shapes")


def sync_launcher(schedule, variant: str, **kw):
    """A launcher of ``schedule`` (gated, or an already encoded schedule) under one synchronisation variant."""
    from mosaic_amk.bench.bench import SYNC_VARIANTS
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.launcher import Launcher, gate

    wait, signal, prefetch = SYNC_VARIANTS[variant]
    unsafe = kw.pop("unsafe", False)
    if not isinstance(schedule, E.Encoded):
        gate(schedule, unsafe)
        schedule = E.encode(schedule, runtime_position=False)
    return Launcher(schedule, str(build(512).cubin), threads=512, mode="f32", wait_mode=wait, signal_mode=signal,
                    prefetch_mode=prefetch, **kw)


def record_failure(out: dict, exc: BaseException) -> None:
    """A part that raised: its error line and the end of its traceback, kept in its JSON (never lost)."""
    out["error"] = f"{type(exc).__name__}: {exc}"[:1500]
    out["trace"] = traceback.format_exc()[-2000:]


def run(a: argparse.Namespace) -> dict:
    import cupy as cp
    import torch
    from mosaic.plugins import host
    from mosaic_amk.bench import bench as B
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.bench.microbench import deadlock, handoff_chain
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.launcher import SKIPPABLE, WatchdogAbort, gate

    path = json_path(a)
    res: dict = {"build": build(512).to_json(), "variants": {k: list(v) for k, v in B.SYNC_VARIANTS.items()},
                 "handoff": {}, "watchdog": {}, "bench": {}}
    n = 2000
    ones = {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)}
    for tag, sms in (("same_sm", [0]), ("sm0_sm1", [0, 1]), ("sm0_sm66", [0, 66])):
        chain = handoff_chain(n, sms, 132)
        gate(chain)
        chain = E.encode(chain, runtime_position=False)
        for v in B.SYNC_VARIANTS:
            try:
                lz = sync_launcher(chain, v)
                lz.bind({}, ones)
                t_skip = time_launch(lz, n=5, skip_ops=sum(SKIPPABLE.values()))
                t_ops = time_launch(lz, n=5)
                y = float(lz.dev[f"y{n - 1}"].get()[0])
                row = {"us_per_task_sync_only": round(t_skip / n, 4), "us_per_task_with_add": round(t_ops / n, 4),
                       "chain_ok": y == n + 1}
            except Exception as exc:  # noqa: BLE001
                row = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            res["handoff"].setdefault(tag, {})[v] = row
        print(f"  sync hand-off {tag}: {res['handoff'][tag]}", flush=True)
    write_json(path, res, indent=1, default=str)
    for v in B.SYNC_VARIANTS:
        w: dict = {}
        try:
            lz = sync_launcher(deadlock(132), v, unsafe=True, timeout_s=0.1)
            lz.bind({}, {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
            lz.launch()
            try:
                lz.check()
                w["tripped"] = False
            except WatchdogAbort as exc:
                w["tripped"] = True
                w["states"] = sorted({d["state"] for d in exc.dump})
                w["origin"] = [d for d in exc.dump if d["state"] == "timeout"][:1]
            ok = sync_launcher(handoff_chain(64, [0, 1], 132), v)
            ok.bind({}, ones)
            ok.launch(n_steps=3)
            ok.check()
            w["next_launch_ok"] = float(cp.asnumpy(ok.dev["y63"])[0]) == 65.0
        except Exception as exc:  # noqa: BLE001
            w["error"] = f"{type(exc).__name__}: {exc}"[:500]
        res["watchdog"][v] = w
    print(f"  sync watchdog: {res['watchdog']}", flush=True)
    write_json(path, res, indent=1, default=str)
    gpu = host().get("gpus", "h200")
    for i, shape in enumerate(a.bench_shapes):
        out: dict = {}
        res["bench"][shape] = out
        try:
            model = hf_gpu.random_model(shape, seed=0)
            spec = hf_gpu.spec_of(model)
            name = BASE_NAME.get(shape, "rows32-lm")
            base = [c for c in B.all_candidates(spec) if c[0] == name]
            fused = [c for c in B.fused_candidates(spec) if c[0] == f"fused-{name}"]
            cands = B.sync_candidates(base) + B.sync_candidates(fused)
            left = a.budget - (time.time() - T0)
            budget = max(20.0, left / max(1, len(a.bench_shapes) - i) - 10)
            b = B.run_bench(model, spec, gpu, cands, rounds=a.rounds, steps=a.steps, eager=False, graph=False,
                            probe=[c[0] for c in cands], probe_only=PROBES, log=print, deadline=time.time() + budget)
            out["bench"] = b
            print(B.format_table(b), flush=True)
            del model
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001
            record_failure(out, exc)
        write_json(path, res, indent=1, default=str)
    return res


def sync_summary(r: dict) -> list[str]:
    """The variant table: hand-off us, watchdog, and per shape / config: full, skeleton, no-prefetch ms/token."""
    lines = []
    hs = r.get("handoff") or {}
    if hs:
        lines.append("  sync hand-off us/task (sync only | with add):  " + "  ".join(hs))
        for v in r.get("variants", {}):
            cells = [f"{(hs[t].get(v) or {}).get('us_per_task_sync_only', '-')!s:>7} | "
                     f"{(hs[t].get(v) or {}).get('us_per_task_with_add', '-')!s:<7}" for t in hs]
            lines.append(f"    {v:10s} " + "   ".join(cells))
    for v, w in (r.get("watchdog") or {}).items():
        if not (w.get("tripped") and w.get("next_launch_ok")):
            lines.append(f"  sync watchdog {v}: {w}"[:200])
    for shape, o in (r.get("bench") or {}).items():
        if "error" in o:
            lines.append(f"  sync bench {shape}: ERROR {o['error'][:150]}")
            continue
        ms = {c["name"]: c.get("ms_per_token") for c in o["bench"].get("contenders", [])}
        lines.append(f"  sync bench {shape} ms/token: {'config/variant':28s} {'full':>7s} {'skeleton':>9s} {'no-pf':>7s}")
        for cand in o["bench"].get("candidates", []):
            nm = cand["name"]
            f = lambda k: f"{k:7.3f}" if isinstance(k, float) else f"{'-':>7s}"  # noqa: E731
            lines.append(f"    {'':24s} {nm:28s} {f(ms.get(f'amk[{nm}]'))} "
                         f"{f(ms.get(f'amk probe[{nm}]: skip all ops (sync skeleton)')):>9s} "
                         f"{f(ms.get(f'amk probe[{nm}]: no prefetch'))}"
                         + (f"  {cand.get('gate') or cand.get('error')}"[:120] if cand.get("gate") or cand.get("error") else ""))
    return lines


def main(argv=None) -> int:
    a = parse_args(argv)
    res = run(a)
    print("\n".join(sync_summary(res)), flush=True)
    print(f"elapsed {time.time() - T0:.0f} s; wrote {json_path(a)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
