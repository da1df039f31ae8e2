"""Compile CUTLASS 3 collective-builder GEMMs (NVIDIA's CUTLASS headers, as PyPI's nvidia-cutlass 4.2.0.0
ships them) for sm_90a on this CPU machine with the real nvcc, and keep each config's cubin and PTX,
xz-compressed, under artifacts/cutlass/, plus cutlass-labels.json: the truth of each config read from its
template arguments and from the constants of CUTLASS's own kernel headers (never from the lifter).

    .venv/bin/python packages/core/tests/lift/corpus/truth/build_cutlass.py [--only NAME]

The translation unit is the one packages/target-cutlass renders for its knobs (mosaic_target_cutlass.gemm:
CollectiveBuilder mainloop + epilogue, GemmUniversal, a tile scheduler); each case records the exact nvcc
command. About 40 s and 3.5 GB per compile on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[5]
ART = HERE / "artifacts" / "cutlass"
NVCC_FLAGS = ["-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-arch=sm_90a"]

#: name -> mosaic_target_cutlass.gemm.GemmKnobs fields (bf16 A/B/D, fp32 accumulation)
CONFIGS = {
    "cutlass-coop-128x128x64-c1x1-s4": {"tile_m": 128, "tile_n": 128, "stages": 4},
    "cutlass-coop-128x128x64-c1x1-s5": {"tile_m": 128, "tile_n": 128, "stages": 5},
    "cutlass-coop-128x256x64-c1x1-s3": {"tile_m": 128, "tile_n": 256, "stages": 3},
    "cutlass-coop-256x128x64-c1x1-s3": {"tile_m": 256, "tile_n": 128, "stages": 3},
    "cutlass-coop-128x128x64-c2x1-s4": {"tile_m": 128, "tile_n": 128, "stages": 4, "cluster_m": 2},
    "cutlass-coop-128x128x64-c1x2-s4": {"tile_m": 128, "tile_n": 128, "stages": 4, "cluster_n": 2},
    "cutlass-coop-128x128x64-c1x1-s4-nosmem": {"tile_m": 128, "tile_n": 128, "stages": 4,
                                                "epilogue_schedule": "no-smem"},
    "cutlass-streamk-128x128x64-c1x1-s4": {"tile_m": 128, "tile_n": 128, "stages": 4, "tile_scheduler": "stream-k"},
    "cutlass-pingpong-64x128x64-c1x1-s4": {"tile_m": 64, "tile_n": 128, "stages": 4, "kernel_schedule": "pingpong",
                                            "epilogue_schedule": "tma"},
    "cutlass-pingpong-128x128x64-c2x1-s4": {"tile_m": 128, "tile_n": 128, "stages": 4, "kernel_schedule": "pingpong",
                                             "epilogue_schedule": "tma", "cluster_m": 2},
    "cutlass-pingpong-128x256x64-c1x1-s3": {"tile_m": 128, "tile_n": 256, "stages": 3,
                                             "kernel_schedule": "pingpong", "epilogue_schedule": "tma"},
    "cutlass-tmaws-128x128x64-c1x1-s4": {"tile_m": 128, "tile_n": 128, "stages": 4, "kernel_schedule": "tma-ws",
                                          "epilogue_schedule": "tma"},
}
KERNEL_HEADERS = {"cooperative": "sm90_gemm_tma_warpspecialized_cooperative.hpp",
                  "pingpong": "sm90_gemm_tma_warpspecialized_pingpong.hpp",
                  "tma-ws": "sm90_gemm_tma_warpspecialized.hpp"}


def header_constants(inc: Path, schedule: str) -> dict:
    """The register budgets of CUTLASS's kernel header: ``LoadRegisterRequirement = !Heavy ? a : b`` and the
    ``RegsPerThread >= n`` threshold of HeavyRegisterPressure (absent in the non-persistent tma-ws kernel)."""
    text = (inc / "cutlass" / "gemm" / "kernel" / KERNEL_HEADERS[schedule]).read_text()
    out = {}
    for name in ("LoadRegisterRequirement", "MmaRegisterRequirement"):
        m = re.search(rf"{name}\s*=\s*!HeavyRegisterPressure\s*\?\s*(\d+)\s*:\s*(\d+)", text)
        if m:
            out[name] = (int(m.group(1)), int(m.group(2)))
    m = re.search(r"HeavyRegisterPressure\s*=\s*RegsPerThread\s*>=\s*(\d+)", text)
    if m:
        out["heavy_at"] = int(m.group(1))
    return out


def labels(kn: dict, inc: Path) -> dict:
    """Truth from the template arguments and CUTLASS's kernel constants."""
    schedule = kn.get("kernel_schedule", "cooperative")
    tm, tn = kn["tile_m"], kn["tile_n"]
    consts = header_constants(inc, schedule)
    # cooperative: the builder's atom layout puts two 64-row warpgroups on tile_m (NumMMAThreads 256);
    # ping-pong: each of the two math warpgroups owns a whole tile (NumMMAThreads 128 per warpgroup);
    # tma-ws: one math warpgroup, the kernel is not persistent (one CTA per output tile)
    consumers = 1 if schedule == "tma-ws" else 2
    lab = {"roles": ["consumer", "producer"], "roles.warpgroups": {"producer": 1, "consumer": consumers},
           "block.max_threads": [128 * (1 + consumers), 1, 1], "mma.form": ["wgmma"],
           "mma.shape": [f"m64n{tn}k16"], "mma.types": ["bf16", "f32"], "transfer.form": ["tma"],
           "pipeline.stages": kn["stages"], "persistent": schedule != "tma-ws",
           "loop.unroll@producer": 1, "loop.unroll@consumer": 1}  # CUTLASS_PRAGMA_NO_UNROLL mainloops
    if schedule != "tma-ws":
        mma_threads = 256 if schedule == "cooperative" else 128
        heavy = tm * tn // mma_threads >= consts["heavy_at"]  # RegsPerThread (fp32 accumulators)
        pick = 1 if heavy else 0
        lab["roles.registers"] = {"producer": consts["LoadRegisterRequirement"][pick],
                                  "consumer": consts["MmaRegisterRequirement"][pick]}
        lab["loops.depth"] = 2  # the tile scheduler's work loop around the k-block mainloop
    else:
        lab["loops.depth"] = 1
    epi = kn.get("epilogue_schedule", "tma-cooperative")
    if kn.get("tile_scheduler") != "stream-k":  # stream-K's partial-tile fixup adds workspace stores
        lab["transfer.store_form"] = ["tma"] if epi.startswith("tma") else ["st.global"]
    return lab


def compile_one(name: str, kn: dict, inc: Path, util: Path) -> dict:
    sys.path.insert(0, str(REPO / "packages" / "target-cutlass" / "src"))
    from mosaic_target_cutlass.gemm import GemmKnobs, render

    knobs = GemmKnobs(**kn)
    src_text = render(knobs, "bf16")
    ART.mkdir(parents=True, exist_ok=True)
    cmds = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{name}.cu"
        src.write_text(src_text)
        for kind in ("cubin", "ptx"):
            out = Path(tmp) / f"{name}.{kind}"
            cmd = ["nvcc", f"-{kind}", *NVCC_FLAGS, f"-I{inc}", f"-I{util}", "-o", str(out), str(src)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            if proc.returncode:
                raise SystemExit(f"{shlex.join(cmd)}\n{proc.stderr[-2000:]}")
            (ART / f"{name}.{kind}.xz").write_bytes(lzma.compress(out.read_bytes(), preset=9))
            cmds[kind] = shlex.join(["nvcc", f"-{kind}", *NVCC_FLAGS, "-I$CUTLASS/include",
                                     "-I$CUTLASS/tools/util/include", "-o", f"{name}.{kind}", f"{name}.cu"])
    return cmds


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--labels-only", action="store_true", help="rewrite cutlass-labels.json without compiling")
    args = ap.parse_args()
    import cutlass_library  # nvidia-cutlass 4.2.0.0

    root = Path(cutlass_library.__file__).parent / "source"
    inc, util = root / "include", root / "tools" / "util" / "include"
    version = re.search(r"CUTLASS_MAJOR (\d+)", (inc / "cutlass" / "version.h").read_text())
    out_labels = HERE / "cutlass-labels.json"
    data = json.loads(out_labels.read_text()) if out_labels.exists() else {}
    for name, kn in CONFIGS.items():
        if args.only and name != args.only:
            continue
        entry = data.get(name, {})
        if not args.labels_only:
            entry["build"] = compile_one(name, kn, inc, util)
        entry.update({"knobs": kn, "labels": labels(kn, inc), "cutlass_major": int(version.group(1))})
        data[name] = entry
        print(name, flush=True)
        out_labels.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
