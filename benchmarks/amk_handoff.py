"""The grid-wide hand-off protocols alone (mosaic_amk/bench/handoff.cu): the VM's counter (release add, relaxed
polls, acquire fence), flag-in-data 64-bit words (NCCL's LL protocol) and cooperative grid.sync(), each a chain of
dependent all-to-all stages of an n-float vector on one block per SM, interleaved launch by launch and checked for
stale data. With ``--vm-skeleton`` it also times the CudaVM's sync-skeleton probe (every op skipped) of CUDA_DEFAULT
on the bench shapes in the same process, divided by the schedule's longest counter chain: the VM's hand-off per
stage, the baseline the protocols compare against. With ``--vm-chain`` it also times the VM's own counter hand-off
between two tasks: a chain of 2000 no-op tasks (each waits for the previous one's counter) all on SM 0, alternating
SM 0 / SM 1, SM 0 / SM 131 and SM 0 / SM 66, us per task with the ops skipped and with the add, and a one-task launch.

    python3 benchmarks/amk_handoff.py [--ns 576,2048] [--stages 256] [--launches 20]
                                      [--vm-skeleton smollm2-135m,llama-3.2-1b] [--vm-chain] [--json PATH]
    # writes $OUT/amk_handoff.json
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _device import add_json, json_path, time_launch, write_json


def vm_chain(n: int = 2000) -> dict:
    """The VM's counter hand-off: a chain of n no-op tasks (ops skipped: only wait + signal) on SM 0, alternating SM 0
    / SM 1, SM 0 / SM 131 and SM 0 / SM 66; the cost of one hand-off is the launch's time / n."""
    from mosaic_amk.bench.microbench import handoff_chain
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.launcher import SKIPPABLE, Launcher, gate

    def launcher(chain):
        gate(chain)
        lz = Launcher(E.encode(chain, runtime_position=False), str(build(512).cubin), threads=512, mode="f32",
                      timeout_s=1.0, prefetch_depth=1)
        lz.bind({}, {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)})
        return lz

    out: dict = {"n": n}
    for tag, sms in (("same_sm", [0]), ("sm0_sm1", [0, 1]), ("sm0_sm131", [0, 131]), ("sm0_sm66", [0, 66])):
        lz = launcher(handoff_chain(n, sms, 132))
        t_skip = time_launch(lz, n=5, skip_ops=sum(SKIPPABLE.values()))
        t_ops = time_launch(lz, n=5)
        y = float(lz.dev[f"y{n - 1}"].get()[0])
        out[tag] = {"us_per_task_sync_only": round(t_skip / n, 4), "us_per_task_with_add": round(t_ops / n, 4),
                    "launch_us": round(t_skip, 1), "chain_result": y, "chain_ok": y == n + 1}
    # an empty launch: the same VM with one no-op task (launch + two grid syncs)
    out["one_task_launch_us"] = round(time_launch(launcher(handoff_chain(1, [0], 132)), n=20), 2)
    # every task of the alternating chains waits for the other SM: its time per task is one hand-off
    out["cross_sm_handoff_us"] = out["sm0_sm1"]["us_per_task_sync_only"]
    out["cross_sm_extra_over_same_sm_us"] = round(out["sm0_sm1"]["us_per_task_sync_only"]
                                                  - out["same_sm"]["us_per_task_sync_only"], 4)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ns", default="576,2048", help="vector lengths (floats): the bench shapes' hidden sizes")
    p.add_argument("--stages", type=int, default=256)
    p.add_argument("--launches", type=int, default=20)
    p.add_argument("--vm-skeleton", default="", help="bench shapes whose CUDA_DEFAULT skeleton to time too")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--vm-chain", action="store_true", help="also time the VM's counter hand-off chains")
    add_json(p, "amk_handoff")
    a = p.parse_args()
    from mosaic_amk.bench import handoff as H
    from mosaic_amk.cuda.build import BuildError

    try:
        ns = [int(n) for n in a.ns.split(",") if n]
    except ValueError:
        p.error(f"--ns must be comma-separated integers, got {a.ns!r}")
    try:
        hb = H.build()
        print("build:", ", ".join(f"{k} {v['registers']} registers" for k, v in hb.resources.items()))
        results = H.measure(ns=ns, stages=a.stages, launches=a.launches, hb=hb)
    except (BuildError, H.DeviceError) as exc:
        print(f"amk_handoff: {exc}", file=sys.stderr)
        return 2
    print(f"hand-off protocols: {a.stages} dependent stages per launch, median of {a.launches} launches")
    for line in H.format_table(results):
        print(line)
    report = {"protocols": [r.to_json() for r in results], "vm_skeleton": {}}
    for shape in [s for s in a.vm_skeleton.split(",") if s]:
        from mosaic.plugins import host
        from mosaic_amk.bench import hf_gpu
        from mosaic_amk.bench.bench import probe_masks
        from mosaic_amk.config import CUDA_DEFAULT
        from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch

        model = hf_gpu.random_model(shape)
        spec = hf_gpu.spec_of(model)
        vm = CudaVM(spec, CUDA_DEFAULT, host().get("gpus", "h200"), weights=weights_from_torch(model, spec),
                    max_positions=a.steps + 64)
        kw = dict(probe_masks(vm.enc))["skip all ops (sync skeleton)"]
        vm.time_decode(a.steps, **kw)  # warm-up
        ms = min(vm.time_decode(a.steps, **kw) for _ in range(3))
        depth = H.stage_depth(vm.enc)
        us = ms * 1000.0 / depth
        print(f"vm skeleton {shape}: {ms:.4f} ms/token over {depth} dependent stages = {us:.3f} us per stage "
              f"(CUDA_DEFAULT, every op skipped, best of 3 x {a.steps} steps)")
        report["vm_skeleton"][shape] = {"ms_per_token": ms, "stages": depth, "us_per_stage": us}
        del vm, model
    if a.vm_chain:
        c = report["vm_chain"] = vm_chain()
        print(f"vm counter chain ({c['n']} tasks), us per task with the ops skipped | with the add:")
        for tag in ("same_sm", "sm0_sm1", "sm0_sm131", "sm0_sm66"):
            print(f"  {tag:10s} {c[tag]['us_per_task_sync_only']:8.4f} | {c[tag]['us_per_task_with_add']:8.4f}"
                  f"  chain ok {c[tag]['chain_ok']}")
        print(f"  one-task launch {c['one_task_launch_us']} us")
    write_json(json_path(a), report, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
