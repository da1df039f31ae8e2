"""Direct measurements of the AMK bench's best candidates against ``best-measured`` (rows32 + LM-head split, fused
GEMVs, relaxed polling, no L2 prefetch): its weight-preload twin ``best-measured-preload`` (a GEMV task's first
weight loads issued before its wait; a separate build of the VM), the ``balanced`` split (one task per SM per GEMV
stage) with and without the preload, with a separate RoPE stage, and on 66 SMs; plus ``rows32-lm`` (the best config
of the default bench) and HF static cache + CUDA graph, interleaved, for the bench shapes. Every candidate is gated
on greedy-token equality with HF first (a candidate whose tokens differ is reported, never timed). Probes ``skip all
ops`` (sync skeleton) on best-measured and balanced. Prints each shape's table and one verdict line per candidate
against best-measured (or, when best-measured is not among ``--candidates``, against the first one): ms/token and
ratio. The fused configurations (bench.fused_candidates: ``fused``, ``fused-rows16-lm``, ``fused-rows32-lm``) can be
named too: ``--candidates rows32-lm,rows16-lm,fused,fused-rows16-lm,fused-rows32-lm --probe fused-rows32-lm,fused-rows16-lm
--probe-all`` is the fused bench of the first sessions.

    python3 benchmarks/amk_speed.py [--shapes llama-3.2-1b,smollm2-135m] [--rounds 3] [--candidates a,b] [--json PATH]
    # writes $OUT/amk_speed.json
"""

from __future__ import annotations

import argparse
import sys
import time

from _device import add_json, json_path, write_json

CANDIDATES = ("rows32-lm", "best-measured", "best-measured-preload", "balanced", "balanced-preload",
              "balanced-rope-stage-preload", "balanced-66sm-preload", "balanced-stream2", "balanced-stream4",
              "balanced-preload-pf1-128k", "balanced-preload-pf1-256k", "balanced-preload-pf2-128k",
              "balanced-preload-q1", "balanced-preload6-q1", "balanced-preload6-q1-pp", "balanced-preload-q1-pp",
              "balanced-preload-q1-stage", "balanced-preload6-q1-stage", "balanced-q1-stage",
              "balanced-preload-q1-stage-sa", "balanced-preload-q1-stage-apart",
              "balanced-preload-q1-stage-sa-apart", "balanced-preload-q1-stage-sa-auto",
              "balanced-preload-q1-stage-sa-auto-blocked", "balanced-preload-q1-stage-sa-auto-blocked-smem160k",
              "balanced-preload-q1-stage-sa-apartqkv-blocked")
BASE = "best-measured"


def verdict(shape: str, res: dict, name: str, base: str = BASE) -> str:
    """One line: ``base`` vs ``name`` (ms/token, ratio), or why one of them has no time."""
    ms = {c["name"]: c.get("ms_per_token") for c in res.get("contenders", [])}
    why = {c["name"]: c.get("gate") or c.get("error") for c in res.get("candidates", [])}
    a, b = ms.get(f"amk[{base}]"), ms.get(f"amk[{name}]")
    if a is None or b is None:
        missing = [n for n, v in ((base, a), (name, b)) if v is None]
        return f"{name} {shape}: no comparison: " + "; ".join(f"{n}: {why.get(n) or 'no time'}" for n in missing)
    return (f"{name} {shape}: {base} {a:.3f} ms/token, {name} {b:.3f} ms/token "
            f"(x{b / a:.3f}; tokens equal to HF for both)")


def preload_verdict(shape: str, res: dict) -> str:
    return verdict(shape, res, "best-measured-preload")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="llama-3.2-1b,smollm2-135m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=64)
    add_json(p, "amk_speed")
    p.add_argument("--candidates", default=",".join(CANDIDATES),
                   help="bench candidate names (bench.all_candidates, bench.fused_candidates)")
    p.add_argument("--probe", default=f"{BASE},balanced", help="candidates to probe (bench.probe_masks)")
    p.add_argument("--probe-all", action="store_true", help="every probe, not only the sync skeleton")
    a = p.parse_args(argv)
    from mosaic.plugins import host
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.bench.bench import all_candidates, format_table, fused_candidates, run_bench

    gpu = host().get("gpus", "h200")
    out, verdicts = {}, []
    for shape in [s for s in a.shapes.split(",") if s]:
        t0 = time.time()
        model = hf_gpu.random_model(shape)
        spec = hf_gpu.spec_of(model)
        wanted = [n for n in a.candidates.split(",") if n]
        cands = [c for c in all_candidates(spec) + fused_candidates(spec) if c[0] in wanted]
        cands = [(n, c.for_gpu(gpu)) for n, c in cands]
        res = run_bench(model, spec, gpu, cands, rounds=a.rounds, steps=a.steps, eager=False,
                        probe=[n for n in a.probe.split(",") if n],
                        probe_only=None if a.probe_all else ["skip all ops (sync skeleton)"], log=print)
        res["seconds"] = round(time.time() - t0, 1)
        base = BASE if BASE in wanted else wanted[0]  # the baseline the verdicts compare with
        res["verdicts"] = [verdict(shape, res, n, base) for n, _ in cands if n != base]
        out[shape] = res
        verdicts.extend(res["verdicts"])
        print(format_table(res), flush=True)
        del model
    write_json(json_path(a), out, indent=1, default=str)
    print("\n".join(verdicts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
