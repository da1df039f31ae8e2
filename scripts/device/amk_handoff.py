"""The grid-wide hand-off protocols alone (mosaic_amk/cuda/handoff.cu): the VM's counter (release add, relaxed
polls, acquire fence), flag-in-data 64-bit words (NCCL's LL protocol) and cooperative grid.sync(), each a chain of
dependent all-to-all stages of an n-float vector on one block per SM, interleaved launch by launch and checked for
stale data. With ``--vm-skeleton`` it also times the CudaVM's sync-skeleton probe (every op skipped) of CUDA_DEFAULT
on the bench shapes in the same process, divided by the schedule's longest counter chain: the VM's hand-off per
stage, the baseline the protocols compare against.

    python3 scripts/device/amk_handoff.py [--ns 576,2048] [--stages 256] [--launches 20]
                                          [--vm-skeleton smollm2-135m,llama-3.2-1b]
    # writes $OUT/amk_handoff.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ns", default="576,2048", help="vector lengths (floats): the bench shapes' hidden sizes")
    p.add_argument("--stages", type=int, default=256)
    p.add_argument("--launches", type=int, default=20)
    p.add_argument("--vm-skeleton", default="", help="bench shapes whose CUDA_DEFAULT skeleton to time too")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    a = p.parse_args()
    from mosaic_amk.cuda import handoff as H
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
        from mosaic_amk.config import CUDA_DEFAULT
        from mosaic_amk.cuda import hf_gpu
        from mosaic_amk.cuda.bench import probe_masks
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
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "amk_handoff.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
