"""One direct measurement of the AMK bench's ``best-measured`` candidate and its weight-preload twin
``best-measured-preload`` (the same config with ``weight_preload=8``: a GEMV task's first weight loads issued before
its wait; a separate build of the VM) against ``rows32-lm`` (the best config of the default bench) and HF static
cache + CUDA graph, interleaved, for the bench shapes; every candidate gated on greedy-token equality with HF
first (a candidate whose tokens differ is reported, never timed). Probes ``skip all ops`` (sync skeleton) on
best-measured. Prints each shape's table and one verdict line: preload vs no preload, ms/token and ratio.

    python3 scripts/device/amk_best.py [--shapes llama-3.2-1b,smollm2-135m] [--rounds 3]   # writes $OUT/amk_best.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

CANDIDATES = ("rows32-lm", "best-measured", "best-measured-preload")


def preload_verdict(shape: str, res: dict) -> str:
    """One line: best-measured vs best-measured-preload (ms/token, ratio), or why one of them has no time."""
    ms = {c["name"]: c.get("ms_per_token") for c in res.get("contenders", [])}
    why = {c["name"]: c.get("gate") or c.get("error") for c in res.get("candidates", [])}
    base, pre = ms.get("amk[best-measured]"), ms.get("amk[best-measured-preload]")
    if base is None or pre is None:
        missing = [n for n, v in (("best-measured", base), ("best-measured-preload", pre)) if v is None]
        return f"preload {shape}: no comparison: " + "; ".join(f"{n}: {why.get(n) or 'no time'}" for n in missing)
    return (f"preload {shape}: best-measured {base:.3f} ms/token, best-measured-preload {pre:.3f} ms/token "
            f"(x{pre / base:.3f}; tokens equal to HF for both)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="llama-3.2-1b,smollm2-135m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    a = p.parse_args(argv)
    from mosaic.plugins import host
    from mosaic_amk.cuda import hf_gpu
    from mosaic_amk.cuda.bench import default_candidates, format_table, run_bench

    gpu = host().get("gpus", "h200")
    out, verdicts = {}, []
    for shape in [s for s in a.shapes.split(",") if s]:
        t0 = time.time()
        model = hf_gpu.random_model(shape)
        spec = hf_gpu.spec_of(model)
        cands = [c for c in default_candidates(spec) if c[0] in CANDIDATES]
        cands = [(n, c.for_gpu(gpu)) for n, c in cands]
        res = run_bench(model, spec, gpu, cands, rounds=a.rounds, steps=a.steps, eager=False,
                        probe=["best-measured"], probe_only=["skip all ops (sync skeleton)"], log=print)
        res["seconds"] = round(time.time() - t0, 1)
        res["preload_verdict"] = preload_verdict(shape, res)
        out[shape] = res
        verdicts.append(res["preload_verdict"])
        print(format_table(res), flush=True)
        del model
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "amk_best.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    print("\n".join(verdicts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
