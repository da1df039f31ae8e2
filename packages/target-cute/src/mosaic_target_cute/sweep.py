"""Lower every knob combination of a grid for a GpuTarget on the CPU; record built and unbuildable ones.

``python -m mosaic_target_cute.sweep [--gpu h200] [--json OUT]`` prints one row per configuration:
registers, static + dynamic shared memory, threads, cluster, compile seconds, or the Unbuildable reason.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

import attrs
from mosaic.backend import Unbuildable

from mosaic_target_cute import budget
from mosaic_target_cute.knobs import GemmKnobs
from mosaic_target_cute.lowering import compile_gemm

#: the small grid lowered in CI: tile, stages, persistence, cluster (+ the naive kernel)
SMALL_GRID = {
    "tile_mn": [(128, 128), (128, 256)],
    "stages": [4, 6],
    "persistent": [False, True],
    "cluster_mn": [(1, 1), (2, 1)],
}


def configurations(grid: dict) -> list[GemmKnobs]:
    keys = list(grid)
    out = [GemmKnobs(kernel="naive")]
    for values in itertools.product(*(grid[k] for k in keys)):
        out.append(GemmKnobs(**dict(zip(keys, values, strict=True))))
    return out


def sweep(configs, gpu, m=4096, n=4096, k=4096, dtype="bf16") -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, knobs in enumerate(configs):
            row = {"knobs": attrs.asdict(knobs)}
            try:
                _, b = compile_gemm(knobs, m, n, k, dtype, gpu.arch, gpu.sm_count, Path(tmp) / str(i))
                problems = budget.diagnose(b, gpu)
                row.update(status="built" if not problems else "unbuildable", registers=b.registers,
                           static_smem=b.static_smem, dynamic_smem=b.dynamic_smem, threads=b.threads,
                           cluster=list(b.cluster), grid_ctas=b.grid_ctas, seconds=round(b.compile_seconds, 2),
                           problems=[p.line() for p in problems])
            except Unbuildable as exc:
                row.update(status="unbuildable", problems=[exc.line()])
            rows.append(row)
    return rows


def main(argv=None) -> None:
    from mosaic.errors import MosaicError
    from mosaic.gpus import resolve_gpu
    from mosaic.plugins import host

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default=None, help="GPU record name (default: the detected device's record)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    try:  # the sweep lowers on the CPU: a named record is taken as asked, else the detected device's
        choice = resolve_gpu(args.gpu, on_device=False)
    except MosaicError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    args.gpu = choice.name
    rows = sweep(configurations(SMALL_GRID), host().get("gpus", args.gpu))
    for r in rows:
        k = r["knobs"]
        what = (f"{k['kernel']:<6} tile={k['tile_mn']} stages={k['stages']} persistent={k['persistent']!s:<5} "
                f"cluster={k['cluster_mn']}")
        if r["status"] == "built":
            print(f"{what}  built  regs={r['registers']} smem={r['static_smem']}+{r['dynamic_smem']} "
                  f"threads={r['threads']} grid={r['grid_ctas']} {r['seconds']}s")
        else:
            print(f"{what}  UNBUILDABLE  {'; '.join(r['problems'])}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=list))


if __name__ == "__main__":
    main()
