"""Where one decode step's time goes, task by task: a bench candidate (default: the CUDA VM's default config) built
with AMK_TRACE, timed like the bench (64 steps in one launch after 4 warm-up steps) against the same config without
the trace, then the last step's per-task stamps turned into a stage table (mosaic_amk/bench/trace.py: each stage kind's share of
the step, its critical task's hand-off and body). The traced VM's greedy tokens must equal the plain VM's. ``--ab
DEFINE`` (repeatable): also time the same config built with that extra define (e.g. AMK_SHORT_ROWS=0), interleaved,
its tokens gated the same way. ``--defines A=1,B=2``: build every VM of the run (plain, traced, the --ab ones) with
those defines.

    python3 benchmarks/amk_trace.py [--shapes llama-3.2-1b,smollm2-135m] [--candidates balanced-preload-q1-stage-sa-auto-blocked]
                                    [--ab AMK_SHORT_ROWS=0] [--defines AMK_ATT_NB1=0] [--json PATH]
    # writes $OUT/amk_trace.json (the tables and every task's stamps)
"""

from __future__ import annotations

import argparse
import sys

from _device import add_json, json_path, write_json


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="llama-3.2-1b,smollm2-135m")
    p.add_argument("--candidates", default="balanced-preload-q1-stage-sa-auto-blocked", help="bench candidate names")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ab", action="append", default=[], help="an extra build define to time against (same config; "
                                                             "repeatable: one VM per define)")
    p.add_argument("--defines", default="", help="extra build defines for every VM of the run (comma-separated)")
    add_json(p, "amk_trace")
    a = p.parse_args()
    from mosaic.plugins import host
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.bench.bench import all_candidates
    from mosaic_amk.bench.trace import format_table, stage_table, timeline
    from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch

    gpu = host().get("gpus", "h200")
    report = {"steps": a.steps, "shapes": {}}
    for shape in [s for s in a.shapes.split(",") if s]:
        model = hf_gpu.random_model(shape)
        spec = hf_gpu.spec_of(model)
        weights = weights_from_torch(model, spec)
        cands = dict(all_candidates(spec))
        out = report["shapes"][shape] = {}
        for name in [c for c in a.candidates.split(",") if c]:
            cfg = cands[name]
            extra = tuple(d for d in a.defines.split(",") if d)
            kw = dict(weights=weights, max_positions=a.steps + 64)
            vms = {"plain": CudaVM(spec, cfg, gpu, extra_defines=extra, **kw),
                   "traced": CudaVM(spec, cfg, gpu, trace=True, extra_defines=extra, **kw)}
            for define in a.ab:
                vms[define] = CudaVM(spec, cfg, gpu, extra_defines=extra + (define,), **kw)
            prompt = [5, 9, 200, 17]
            toks = {k: v.generate(prompt, 16, logits=False, steps_per_launch=16)[0] for k, v in vms.items()}
            same = all(t == toks["plain"] for t in toks.values())
            ms = {k: [] for k in vms}
            for _ in range(a.rounds):
                for k, v in vms.items():
                    ms[k].append(v.time_decode(a.steps))
            traced = vms["traced"]
            tl = timeline(traced.enc, traced.launcher.trace_stamps())
            rows, step_us = stage_table(tl)
            handoff = sum(r.handoff_share_us for r in rows)
            times = ", ".join(f"{k} {min(v):.3f}" for k, v in ms.items())
            print(f"trace {shape} [{name}]: {len(tl)} tasks; ms/token {times}; tokens equal: {same}; traced step "
                  f"(last of {a.steps}): {step_us:.1f} us, of it hand-offs on the critical path {handoff:.1f} us")
            for line in format_table(rows, step_us):
                print(line)
            out[name] = {"ms": ms, "tokens_equal": same, "step_us": step_us, "handoff_share_us": handoff,
                         "rows": [r.as_dict() for r in rows],
                         "tasks": [[t.task_id, t.sm, t.kind, t.top, t.waited, t.done,
                                    -1 if t.producers_done is None else t.producers_done] for t in tl]}
            del vms, traced
        del model, weights
    write_json(json_path(a), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
