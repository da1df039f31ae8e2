"""AMK CUDA VM speed race (needs the H200): ms/token of the persistent megakernel against HF eager, HF
static cache + CUDA graph and the weight-bandwidth floor, interleaved in one process, for random-init
Llama-3.2-1B- and SmolLM2-135M-shaped models. Prints a table and writes $OUT/amk_bench.json (or --json PATH;
$OUT defaults to benchmarks/results/). ``--probe a,b``: the bench's probes (bench.probe_masks) on those candidates.

Baselines (issue 8): goals <= 0.72 ms/token (Llama-3.2-1B shape) and <= 0.15 ms/token (SmolLM2-135M shape);
the named baseline each is compared with is the HF static cache + CUDA graph row of the same run. Every AMK
candidate is gated with parity criterion (2) before it is timed (bench/gate.py: teacher-forced over HF eager bf16's
tokens, disagreements only near-ties within the envelope of HF's own variants measured once per shape); the
verdicts are printed and recorded per candidate (``candidates[i].verdict``), the envelope in ``gate``.

    python3 benchmarks/amk_bench.py [--shapes llama-3.2-1b,smollm2-135m] [--rounds 5] [--steps 64] [--probe default,rows32-lm]
"""

from __future__ import annotations

import argparse
import sys

from _device import add_json, json_path, write_json

GOALS_MS = {"llama-3.2-1b": 0.72, "smollm2-135m": 0.15}
BASELINE = "hf static cache + cuda graph"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="llama-3.2-1b,smollm2-135m")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--gate-tokens", type=int, default=32, help="teacher-forced tokens per gate prompt (8 prompts)")
    p.add_argument("--probe", default="", help="candidates to probe (bench.probe_masks), comma-separated (default: the "
                                               "first that passes its gate)")
    add_json(p, "amk_bench")
    a = p.parse_args(argv)
    from mosaic.plugins import host
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.bench.bench import format_table, run_bench

    gpu = host().get("gpus", "h200")
    results = {}
    for shape in [s for s in a.shapes.split(",") if s]:
        model = hf_gpu.random_model(shape)
        spec = hf_gpu.spec_of(model)
        res = run_bench(model, spec, gpu, rounds=a.rounds, steps=a.steps, gate_tokens=a.gate_tokens,
                        probe=[n for n in a.probe.split(",") if n] or None)
        amk = [c["ms_per_token"] for c in res["contenders"] if c["name"].startswith("amk[") and c["ms_per_token"]]
        base = next((c["ms_per_token"] for c in res["contenders"] if c["name"] == BASELINE), None)
        best = min(amk) if amk else None
        res["verdict"] = {"best_amk_ms": best, "goal_ms": GOALS_MS.get(shape), "baseline": BASELINE,
                          "baseline_ms": base, "meets_goal": bool(best and best <= GOALS_MS.get(shape, 0)),
                          "speedup_vs_baseline": (base / best) if best and base else None,
                          "gate_passed": sum("verdict" in c and not c.get("gate") and not c.get("error")
                                             for c in res["candidates"]),
                          "gate_candidates": len(res["candidates"])}
        results[shape] = res
        print(format_table(res))
        print(f"  verdict: {res['verdict']}")
        del model
    print(f"wrote {write_json(json_path(a), results, indent=1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
