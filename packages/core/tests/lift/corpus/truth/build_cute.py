"""Lower the project's CuTe DSL GEMMs (packages/target-cute, nvidia-cutlass-dsl) ahead of time for sm_90a on
this CPU machine and write each config's PTX and cubin under artifacts/, plus cute-labels.json: the truth of
each config read from its knobs and the kernel module's constants (never from the lifter).

    .venv312/bin/python packages/core/tests/lift/corpus/truth/build_cute.py [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ART = HERE / "artifacts"
M = N = K = 4096
SM_COUNT = 132  # the H200 record (mosaic-gpu-hopper)

CONFIGS = {
    "cute-128x128-s4": {"tile_mn": (128, 128), "stages": 4},
    "cute-128x256-s3-persistent": {"tile_mn": (128, 256), "stages": 3, "persistent": True, "epi_tile": (128, 32)},
    "cute-64x128-s6-c1x2": {"tile_mn": (64, 128), "stages": 6, "cluster_mn": (1, 2)},
    "cute-128x128-s5-c2x1-persistent": {"tile_mn": (128, 128), "stages": 5, "cluster_mn": (2, 1),
                                        "persistent": True},
    "cute-128x192-s2": {"tile_mn": (128, 192), "stages": 2},
    "cute-64x256-s4": {"tile_mn": (64, 256), "stages": 4},
    "cute-128x64-s8": {"tile_mn": (128, 64), "stages": 8},
    "cute-128x128-s3-c1x2-persistent": {"tile_mn": (128, 128), "stages": 3, "cluster_mn": (1, 2),
                                        "persistent": True},
    "cute-64x64-s7-persistent": {"tile_mn": (64, 64), "stages": 7, "persistent": True, "epi_tile": (64, 32)},
    "cute-128x128-s6": {"tile_mn": (128, 128), "stages": 6},
    "cute-128x256-s4": {"tile_mn": (128, 256), "stages": 4, "epi_tile": (128, 32)},
    "cute-naive-16x16": {"kernel": "naive", "block_mn": (16, 16)},
    "cute-naive-32x8": {"kernel": "naive", "block_mn": (32, 8)},
}


def naive_labels(knobs) -> dict:
    # kernels/naive_gemm.py: one thread per output element, plain global loads, fp32 FMA over k, no shared
    # memory, no tensor cores, no warp roles, one CTA per block of outputs
    return {"roles": ["all"], "roles.registers": {}, "mma.form": [], "transfer.form": ["ld.global"],
            "transfer.store_form": ["st.global"], "persistent": False, "loops.depth": 1, "barrier.ops": []}


def labels(knobs, kernel_mod) -> dict:
    if knobs.kernel == "naive":
        return naive_labels(knobs)
    tm, tn = knobs.tile_mn
    consumers = knobs.consumer_warpgroups
    return {
        "roles": ["consumer", "producer"],
        "roles.registers": {"producer": kernel_mod.PRODUCER_REGS, "consumer": kernel_mod.CONSUMER_REGS},
        "roles.warpgroups": {"producer": 1, "consumer": consumers},
        "warpgroups": 1 + consumers,
        # no "cluster": the DSL passes the cluster shape at launch; neither the PTX nor the cubin holds it
        "pipeline.stages": knobs.stages,
        "mma.form": ["wgmma"],
        "mma.shape": [f"m64n{tn}k16"],
        "mma.types": ["bf16", "f32"],
        "transfer.form": ["tma"],
        "transfer.store_form": ["tma"],
        # the static persistent tile scheduler's loop is in the kernel in both modes (hopper_gemm.py docstring)
        "persistent": True,
        "loops.depth": 2,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parents[5] / "packages" / "target-cute" / "src"))
    from mosaic_target_cute.kernels import hopper_gemm
    from mosaic_target_cute.knobs import GemmKnobs
    from mosaic_target_cute.lowering import compile_gemm

    ART.mkdir(exist_ok=True)
    out_labels = HERE / "cute-labels.json"
    data = json.loads(out_labels.read_text()) if out_labels.exists() else {}
    for name, kn in CONFIGS.items():
        if args.only and name != args.only:
            continue
        knobs = GemmKnobs(**kn)
        with tempfile.TemporaryDirectory() as tmp:
            _, build = compile_gemm(knobs, M, N, K, "bf16", "sm_90a", SM_COUNT, Path(tmp) / "dump")
            shutil.copy(build.ptx, ART / f"{name}.ptx")
            shutil.copy(build.cubin, ART / f"{name}.cubin")
        lab = labels(knobs, hopper_gemm)
        if knobs.kernel != "naive":
            lab["block"] = [build.threads, 1, 1]
        data[name] = {"knobs": {k: list(v) if isinstance(v, tuple) else v for k, v in kn.items()}, "labels": lab}
        print(f"{name}: {build.kernel_name} threads {build.threads} regs {build.registers} "
              f"({build.compile_seconds:.1f} s)", flush=True)
        out_labels.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
