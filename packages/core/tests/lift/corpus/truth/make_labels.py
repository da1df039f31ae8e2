"""Write labels.json: the ground truth of every corpus case, each derived from the kernel's own source,
flags or configuration (never from the lifter), with the command that regenerates its artifact.

    .venv/bin/python packages/core/tests/lift/corpus/truth/make_labels.py

Sources:
- ``cuda``: the kernels in cuda/ (written for this corpus), compiled by nvcc at run time
  (``nvcc -cubin -arch=sm_90a -O3 <flags> -o X.cubin X.cu``); labels from the source and the flags.
- ``pallas``: jax 0.11.2's shipped Pallas Mosaic GPU hopper matmul (jax/experimental/pallas/ops/gpu/
  hopper_matmul_mgpu.py) in three TuningConfigs, captured on the H200 (jax compiles Mosaic GPU to PTX only
  with a CUDA backend: ``benchmarks/gemm_capture.py --part pallas``); labels from the TuningConfig in each
  bundle's manifest and the constants of jax's source (num_threads=3, num_compute_wgs=2,
  memory_registers=40, consumers' registers by pipeline._compute_registers, nd_loop over tiles on a grid
  of num_sms CTAs).
- ``cutlass``: CUTLASS 3 collective-builder GEMMs (cooperative, ping-pong) captured on the H200; labels from
  the template arguments in the mangled kernel name (stages, schedule) and CUTLASS's sm90 kernel constants
  (LoadRegisterRequirement 40, MmaRegisterRequirement 232, one producer and two MMA warpgroups, persistent
  tile scheduler, CUTLASS_PRAGMA_NO_UNROLL mainloops).
  Also compiled here (build_cutlass.py, nvcc 13.0 -arch=sm_90a, nvidia-cutlass 4.2.0.0's headers): cooperative,
  ping-pong, stream-K, tma-ws, 2x1 / 1x2 clusters, a no-smem epilogue; labels from the knobs and the constants
  of CUTLASS's kernel headers (cutlass-labels.json; cubin and PTX kept xz-compressed).
- ``triton``: liger-kernel's Triton ops (softmax, rms_norm, layer_norm, the swiglu TMA/wgmma GEMM in three
  autotune points) compiled for sm_90a without a GPU (build_triton.py, triton 3.9.0); labels from their
  source and launch settings (triton-labels.json).
- ``quack``: quack-kernels' CuTe DSL rmsnorm, layernorm, softmax and cross-entropy forward compiled for sm_90a
  without a GPU through their own fake-tensor compile functions (build_quack.py); labels from quack's source
  and launch heuristics (quack-labels.json).
- ``flash-attn-4``: its CuTe DSL Hopper attention forward (FlashAttentionForwardSm90) compiled for sm_90a
  through the package's CPU-only path and torch's FakeTensorMode (build_flash.py); labels from its source.
- ``cute``: the project's CuTe DSL Hopper GEMM lowered ahead of time here (build_cute.py, .venv312);
  labels from the knobs and the kernel module's constants (cute-labels.json).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[5]
H200 = "packages/core/tests/data/h200"
NVCC = "nvcc -cubin -O3"  # -arch=sm_90a unless the case's flags name another

# -- plain CUDA: (id, source, flags, labels) -----------------------------------------------------------
PLAIN = {"roles": ["all"], "mma.form": [], "roles.registers": {}}
CUDA = [
    ("divide", "divide.cu", [], {"block.max_threads": [256, 1, 1], "persistent": False, "loops.depth": 1,
                                  "div.form": ["ieee"], "exp.form": [], "transfer.form": ["ld.global"],
                                  "transfer.store_form": ["st.global"], "barrier.ops": [], "denormal.flush": "ieee"}),
    ("rsqrt", "rsqrt.cu", [], {"block.max_threads": [128, 1, 1], "persistent": False, "loops.depth": 0,
                                "div.form": ["ieee"], "exp.form": [], "barrier.ops": [], "denormal.flush": "ieee"}),
    ("expf-precise", "expf.cu", ["-DFAST=0"], {"block.max_threads": [256, 1, 1], "persistent": True,
                                               "loops.depth": 1, "exp.form": ["precise"], "div.form": [],
                                               "denormal.flush": "ieee"}),
    ("expf-intrinsic", "expf.cu", ["-DFAST=1"], {"persistent": True, "loops.depth": 1, "exp.form": ["approx"],
                                                 "div.form": []}),
    ("expf-fast-math", "expf.cu", ["-DFAST=0", "-use_fast_math"], {"persistent": True, "exp.form": ["approx"],
                                                                   "denormal.flush": "ftz"}),
    ("warp-shuffle-sum", "shuffle.cu", [], {"block.max_threads": [128, 1, 1], "persistent": False,
                                            "transfer.store_form": ["atomic"], "barrier.ops": [],
                                            "div.form": [], "exp.form": []}),
    ("histogram", "histogram.cu", [], {"block.max_threads": [256, 1, 1], "persistent": True,
                                       "transfer.store_form": ["atomic"], "barrier.ops": ["bar.sync"],
                                       "loops.depth": 1}),
    ("local-array", "localarray.cu", [], {"block.max_threads": [128, 1, 1], "stack_frame": {"min": 128},
                                          "spills": {"local_instructions": {"min": 1}}, "persistent": False}),
    ("saxpy-unroll1", "saxpy.cu", ["-DUNROLL=1"], {"persistent": True, "loops.depth": 1, "loop.unroll": 1,
                                                   "fma.contraction": "fused", "denormal.flush": "ieee"}),
    ("saxpy-unroll4", "saxpy.cu", ["-DUNROLL=4"], {"persistent": True, "loop.unroll": 4,
                                                   "fma.contraction": "fused"}),
    ("saxpy-unroll4-nofma", "saxpy.cu", ["-DUNROLL=4", "-fmad=false"], {"loop.unroll": 4,
                                                                        "fma.contraction": "unfused"}),
    ("saxpy-unroll2-ftz", "saxpy.cu", ["-DUNROLL=2", "-ftz=true"], {"loop.unroll": 2, "denormal.flush": "ftz",
                                                                     "fma.contraction": "fused"}),
    ("fast-divide", "fastdiv.cu", [], {"div.form": ["approx"], "loops.depth": 0, "persistent": False}),
    ("double-divide-sqrt", "ddiv.cu", [], {"div.form": ["ieee"], "loops.depth": 0}),
    ("wmma-gemm", "wmma.cu", [], {"mma.form": ["mma.sync"], "mma.types": ["f16", "f32"], "loop.unroll": 1,
                                  "loops.depth": 1, "block.max_threads": [32, 1, 1], "persistent": False}),
    ("cp-async-tiles", "cpasync.cu", [], {"transfer.form": ["cp.async"], "loop.unroll": 1, "loops.depth": 1,
                                          "barrier.ops": ["bar.sync", "cp.async.wait"], "persistent": False}),
    ("cluster-copy", "cluster.cu", [], {"cluster": [2, 1, 1], "block.max_threads": [64, 1, 1], "loops.depth": 0,
                                        "persistent": False}),
    ("nested-row-sums", "nested.cu", [], {"loops.depth": 2, "persistent": True, "loop.unroll": 1}),
    ("softmax-rows", "softmax.cu", ["-DFAST=0"], {"block.max_threads": [128, 1, 1], "persistent": False,
                                                  "loops.depth": 1, "exp.form": ["precise"], "div.form": ["ieee"],
                                                  "barrier.ops": [], "transfer.form": ["ld.global"]}),
    ("softmax-rows-fast", "softmax.cu", ["-DFAST=1"], {"exp.form": ["approx"], "div.form": ["approx"],
                                                       "loops.depth": 1, "persistent": False}),
    ("rmsnorm", "rmsnorm.cu", [], {"block.max_threads": [256, 1, 1], "div.form": [], "exp.form": [],
                                   "barrier.ops": ["bar.sync"], "fma.contraction": "fused", "persistent": False,
                                   "loops.depth": 1}),
    ("atomic-max-cas", "atomicmax.cu", [], {"transfer.store_form": ["atomic"], "loops.depth": 1,
                                            "persistent": False, "barrier.ops": []}),
    ("double-exp", "dexp.cu", [], {"div.form": [], "denormal.flush": "none", "loops.depth": 0}),
    ("divide-compiled-again", "divide.cu", [], {"div.form": ["ieee"], "loops.depth": 1}),
    ("softmax-rows-compiled-again", "softmax.cu", ["-DFAST=0"], {"exp.form": ["precise"], "div.form": ["ieee"]}),
    ("sqrt-ieee", "sqrt.cu", [], {"block.max_threads": [128, 1, 1], "persistent": False, "loops.depth": 0,
                                   "div.form": [], "exp.form": [], "transfer.form": ["ld.global"],
                                   "transfer.store_form": ["st.global"], "barrier.ops": []}),
    ("sqrt-fast-math", "sqrt.cu", ["-use_fast_math"], {"persistent": False, "loops.depth": 0, "div.form": [],
                                                        "exp.form": []}),
    ("integer-divide", "intdiv.cu", [], {"block.max_threads": [256, 1, 1], "persistent": False, "loops.depth": 0,
                                         "div.form": [], "exp.form": [], "transfer.store_form": ["st.global"],
                                         "fma.contraction": "none"}),
    ("device-printf", "printf.cu", [], {"block.max_threads": [64, 1, 1], "persistent": False, "loops.depth": 0,
                                        "div.form": [], "exp.form": [], "stack_frame": {"min": 8}}),
    ("ballot-compact", "ballot.cu", [], {"block.max_threads": [256, 1, 1], "persistent": True, "loops.depth": 1,
                                         "transfer.store_form": ["atomic", "st.global"], "div.form": [],
                                         "exp.form": [], "mma.form": []}),
    ("block-sum-float4", "blockreduce.cu", [], {"block.max_threads": [512, 1, 1], "persistent": False,
                                                "barrier.ops": ["bar.sync"], "access.global.load_width": [128],
                                                "transfer.store_form": ["atomic"], "div.form": [], "exp.form": []}),
    ("logsumexp-precise", "logsumexp.cu", ["-DFAST=0"], {"block.max_threads": [128, 1, 1], "persistent": False,
                                                         "loops.depth": 1, "exp.form": ["precise"], "div.form": [],
                                                         "transfer.store_form": ["st.global"]}),
    ("logsumexp-fast", "logsumexp.cu", ["-DFAST=1"], {"persistent": False, "loops.depth": 1, "exp.form": ["approx"],
                                                      "div.form": []}),
    ("tmem-roundtrip-sm100a", "tmem.cu", ["-arch=sm_100a"], {"block.max_threads": [128, 1, 1], "loops.depth": 1,
                                                             "persistent": False, "transfer.store_form": ["st.global"],
                                                             "div.form": [], "exp.form": []}),
]

# The planted kernels of corpus/src (pairs.json): each variant's define is its truth.
PLANTED = [
    ("planted-stages2", "stages.cu", ["-DSTAGES=2"], {"pipeline.stages": 2, "transfer.form": ["cp.async"],
                                                      "block.max_threads": [128, 1, 1]}),
    ("planted-stages2-renamed", "stages_renamed.cu", ["-DSTAGES=2"], {"pipeline.stages": 2,
                                                                       "transfer.form": ["cp.async"]}),
    ("planted-stages3", "stages.cu", ["-DSTAGES=3"], {"pipeline.stages": 3, "transfer.form": ["cp.async"]}),
    ("planted-stages4", "stages.cu", ["-DSTAGES=4"], {"pipeline.stages": 4, "transfer.form": ["cp.async"]}),
    ("planted-warp-specialised", "warpspec.cu", ["-DWS=1"], {
        "roles": ["consumer", "producer"], "roles.registers": {"producer": 40, "consumer": 232},
        "roles.warpgroups": {"producer": 1, "consumer": 1}, "block.max_threads": [256, 1, 1]}),
    ("planted-not-warp-specialised", "warpspec.cu", ["-DWS=0"], {"roles": ["all"], "roles.registers": {}}),
    ("planted-persistent", "persistent.cu", ["-DPERSISTENT=1"], {"persistent": True, "loops.depth": 2}),
    ("planted-not-persistent", "persistent.cu", ["-DPERSISTENT=0"], {"persistent": False, "loops.depth": 1}),
    ("planted-block128-cluster1", "geometry.cu", ["-DMAXT=128", "-DCLUSTER=1"], {"block.max_threads": [128, 1, 1],
                                                                                  "cluster": [1, 1, 1]}),
    ("planted-block256", "geometry.cu", ["-DMAXT=256", "-DCLUSTER=1"], {"block.max_threads": [256, 1, 1]}),
    ("planted-cluster2", "geometry.cu", ["-DMAXT=128", "-DCLUSTER=2"], {"cluster": [2, 1, 1]}),
    ("planted-mma-sync", "mma.cu", ["-DMMA=0"], {"mma.form": ["mma.sync"]}),
    ("planted-wgmma", "mma.cu", ["-DMMA=1"], {"mma.form": ["wgmma"]}),
    ("planted-cp-async", "copyform.cu", ["-DXFER=0"], {"transfer.form": ["cp.async"], "loop.unroll": 4}),
    ("planted-tma", "copyform.cu", ["-DXFER=1"], {"transfer.form": ["tma"], "loop.unroll": 4}),
    ("planted-fmad-on", "fmad.cu", ["-fmad=true"], {"fma.contraction": "fused"}),
    ("planted-fmad-off", "fmad.cu", ["-fmad=false"], {"fma.contraction": "unfused"}),
    ("planted-regs255", "spill.cu", ["-maxrregcount=255"], {"spills": {"local_instructions": 0}}),
    ("planted-regs32", "spill.cu", ["-maxrregcount=32"], {"spills": {"local_instructions": {"min": 1}}}),
    ("planted-ld32", "ldwidth.cu", ["-DVEC=1"], {"access.global.load_width": [32]}),
    ("planted-ld128", "ldwidth.cu", ["-DVEC=4"], {"access.global.load_width": [128]}),
    ("planted-unroll1", "unroll.cu", ["-DUNROLL=1"], {"loop.unroll": 1}),
    ("planted-unroll4", "unroll.cu", ["-DUNROLL=4"], {"loop.unroll": 4}),
    ("planted-expf-precise", "expf.cu", ["-DFAST=0"], {"exp.form": ["precise"]}),
    ("planted-expf-fast", "expf.cu", ["-DFAST=1"], {"exp.form": ["approx"]}),
]

# -- jax's Pallas hopper matmul ---------------------------------------------------------------------------
JAX = {"num_threads": 3, "num_compute_wgs": 2, "memory_registers": 40}


def jax_compute_registers(memory: int, compute_wgs: int) -> int:
    return int(min(256.0, (512 - memory) / compute_wgs) // 8 * 8)  # jax/_src/pallas/mosaic_gpu/pipeline.py


def pallas_labels(knobs: dict) -> dict:
    tile_n = knobs.get("tile_n", 128)
    return {"roles": ["consumer", "producer"],
            "roles.registers": {"producer": JAX["memory_registers"],
                                "consumer": jax_compute_registers(JAX["memory_registers"], JAX["num_compute_wgs"])},
            "roles.warpgroups": {"producer": 1, "consumer": JAX["num_compute_wgs"]},
            "warpgroups": JAX["num_threads"], "persistent": True, "mma.form": ["wgmma"],
            "mma.shape": [f"m64n{tile_n}k16"], "mma.types": ["bf16", "f32"], "transfer.form": ["tma"],
            "transfer.store_form": ["tma"], "pipeline.stages": knobs.get("max_concurrent_steps", 4)}


PALLAS_DEFAULT = {"tile_m": 128, "tile_n": 128, "tile_k": 64, "max_concurrent_steps": 4}  # GemmKnobs defaults
PALLAS = [
    ("pallas-reference-sass", "packages/target-pallas/src/mosaic_target_pallas/references/"
     "gemm-4096x4096x4096-bf16-h200.bundle", "bundle"),
    ("pallas-128x128x64-s4-sass", f"{H200}/pallas-jax-128x128x64-s4-sass.bundle", "bundle"),
    ("pallas-128x128x64-s4-ptx", f"{H200}/pallas-jax-128x128x64-s4.bundle/kernel.ptx", "file"),
    ("pallas-128x128x64-s3-ptx", f"{H200}/pallas-jax-128x128x64-s3.bundle/kernel.ptx", "file"),
]

# -- CUTLASS collective builder ---------------------------------------------------------------------------
CUTLASS = [
    ("cutlass-coop-128x128-c1x2-sass", f"{H200}/coop-128x128x64-c1x2-4096.bundle", "bundle"),
    ("cutlass-coop-128x256-c2x1-sass", f"{H200}/coop-128x256x64-c2x1-4096.bundle", "bundle"),
    ("cutlass-pingpong-64x128-s4-sass", f"{H200}/pingpong-64x128x64-c1x1-s4-4096.bundle", "bundle"),
    ("cutlass-coop-128x128-c1x2-ptx", f"{H200}/coop-128x128x64-c1x2-4096.bundle/kernel.ptx", "file"),
    ("cutlass-coop-128x256-c2x1-ptx", f"{H200}/coop-128x256x64-c2x1-4096.bundle/kernel.ptx", "file"),
    ("cutlass-pingpong-64x128-s4-ptx", f"{H200}/pingpong-64x128x64-c1x1-s4-4096.bundle/kernel.ptx", "file"),
]


def cutlass_labels(bundle: Path) -> dict:
    mangled = json.loads((bundle / "lowering.json").read_text())["kernel_name"]
    stages = int(re.search(r"MainloopSm90TmaGmmaWarpSpecialized\w*?ILi(\d+)E", mangled).group(1))
    return {"roles": ["consumer", "producer"], "roles.registers": {"producer": 40, "consumer": 232},
            "roles.warpgroups": {"producer": 1, "consumer": 2}, "persistent": True, "mma.form": ["wgmma"],
            "transfer.form": ["tma"], "pipeline.stages": stages,
            "loop.unroll@producer": 1, "loop.unroll@consumer": 1, "loops.depth": 2}


# Pairs that differ in one labelled way: the differing key must be a top-3 row of its layer; "same" pairs
# (one kernel compiled twice) must give no row at all.
PAIRS = [
    {"ref": "cute-128x128-s4-cubin", "cand": "cute-128x128-s6-cubin", "differs": ["control", "pipeline.stages"]},
    {"ref": "cute-128x128-s4-ptx", "cand": "cute-128x128-s6-ptx", "differs": ["control", "pipeline.stages"]},
    {"ref": "cute-128x128-s4-cubin", "cand": "cute-128x256-s4-cubin", "differs": ["instruction", "mma.shape"]},
    {"ref": "cute-128x128-s4-cubin", "cand": "cute-naive-16x16-cubin", "differs": ["launch", "roles"]},
    {"ref": "pallas-128x128x64-s4-ptx", "cand": "pallas-128x128x64-s3-ptx", "differs": ["control", "pipeline.stages"]},
    {"ref": "expf-precise", "cand": "expf-intrinsic", "differs": ["numerics", "exp.form"]},
    {"ref": "saxpy-unroll1", "cand": "saxpy-unroll4", "differs": ["control", "loop.unroll"]},
    {"ref": "saxpy-unroll4", "cand": "saxpy-unroll4-nofma", "differs": ["numerics", "fma.contraction"]},
    {"ref": "divide", "cand": "fast-divide", "differs": ["numerics", "div.form"]},
    {"ref": "planted-not-persistent", "cand": "planted-persistent", "differs": ["control", "persistent"]},
    {"ref": "planted-not-warp-specialised", "cand": "planted-warp-specialised", "differs": ["launch", "roles"]},
    {"ref": "logsumexp-precise", "cand": "logsumexp-fast", "differs": ["numerics", "exp.form"]},
    {"ref": "cutlass-coop-128x128x64-c1x1-s4-cubin", "cand": "cutlass-coop-128x128x64-c1x1-s5-cubin",
     "differs": ["control", "pipeline.stages"]},
    {"ref": "cutlass-coop-128x128x64-c1x1-s4-ptx", "cand": "cutlass-coop-128x128x64-c1x1-s5-ptx",
     "differs": ["control", "pipeline.stages"]},
    {"ref": "cutlass-coop-128x128x64-c1x1-s4-cubin", "cand": "cutlass-coop-128x128x64-c1x1-s4-nosmem-cubin",
     "differs": ["instruction", "transfer.store_form"]},
    {"ref": "triton-liger-swiglu-64x128x64-w4-s2-cubin", "cand": "triton-liger-swiglu-64x128x64-w4-s3-cubin",
     "differs": ["control", "pipeline.stages"]},
    {"ref": "triton-liger-swiglu-64x128x64-w4-s2-ptx", "cand": "triton-liger-swiglu-64x128x64-w4-s3-ptx",
     "differs": ["control", "pipeline.stages"]},
    {"ref": "flash4-fwd-sm90-hdim128-128x128-cubin", "cand": "flash4-fwd-sm90-hdim64-128x128-cubin",
     "differs": ["instruction", "mma.shape"]},
    {"ref": "divide", "cand": "divide-compiled-again", "same": True},
    {"ref": "softmax-rows", "cand": "softmax-rows-compiled-again", "same": True},
    {"ref": "planted-stages2", "cand": "planted-stages2-renamed", "same": True},
]


def arch_flag(flags: list[str]) -> str:
    return "" if any(f.startswith("-arch") for f in flags) else "-arch=sm_90a"


def build_cases() -> list[dict]:
    cases = []
    for folder, table in (("cuda", CUDA), ("../src", PLANTED)):
        for cid, src, flags, lab in table:
            base = PLAIN if "roles" not in lab else {}
            cases.append({"id": cid, "source": "cuda", "src": f"{folder}/{src}", "flags": flags,
                          "build": f"{NVCC} {arch_flag(flags)} {' '.join(flags)} -o {cid}.cubin {folder}/{src}"
                          .replace("  ", " "),
                          "labels": {**base, **lab}})
    for cid, path, kind in PALLAS:
        root = REPO / path if kind == "bundle" else (REPO / path).parent
        knobs = json.loads((root / "manifest.json").read_text())["kernel"]["knobs"] or PALLAS_DEFAULT
        lab = pallas_labels(knobs)
        if kind == "file":  # PTX alone holds no launch: the block (and so the warpgroup count) is unknown
            lab.pop("warpgroups")
        if kind == "bundle":
            launch = json.loads((root / "launch.json").read_text())
            lab.update({"block": [128 * JAX["num_threads"], 1, 1], "grid": [132, 1, 1], "cluster": [1, 1, 1]})
            assert launch["block"] == lab["block"]
        cases.append({"id": cid, "source": "pallas", "artifact": path,
                      "build": "on the H200: .venv312/bin/python benchmarks/gemm_capture.py --part pallas",
                      "config": knobs, "labels": lab})
    for cid, path, kind in CUTLASS:
        root = REPO / path if kind == "bundle" else (REPO / path).parent
        lab = cutlass_labels(root)
        if kind == "bundle":
            launch = json.loads((root / "launch.json").read_text())
            lab.update({"block": [384, 1, 1], "cluster": launch["cluster"]})
        cases.append({"id": cid, "source": "cutlass", "artifact": path,
                      "build": "on the H200: .venv/bin/python benchmarks/gemm_capture.py --part cutlass",
                      "labels": lab})
    for name, entry in sorted(json.loads((HERE / "cutlass-labels.json").read_text()).items()):
        for ext in ("cubin", "ptx"):
            lab = dict(entry["labels"])
            cases.append({"id": f"{name}-{ext}", "source": "cutlass",
                          "artifact": f"{HERE.relative_to(REPO)}/artifacts/cutlass/{name}.{ext}.xz",
                          "build": entry["build"][ext] + " (CUTLASS=nvidia-cutlass 4.2.0.0's cutlass_library/source; "
                          f".venv/bin/python {HERE.relative_to(REPO)}/build_cutlass.py --only {name})",
                          "config": entry["knobs"], "labels": lab})
    for name, entry in sorted(json.loads((HERE / "triton-labels.json").read_text()).items()):
        for ext in ("cubin", "ptx"):
            lab = dict(entry["labels"])
            cases.append({"id": f"{name}-{ext}", "source": "triton",
                          "artifact": f"{HERE.relative_to(REPO)}/artifacts/triton/{name}.{ext}.xz",
                          "build": f"PYTHONPATH=.venv/lib/python3.11/site-packages /tmp/tv/bin/python "
                          f"{HERE.relative_to(REPO)}/build_triton.py --only {name} (triton {entry['triton']}, "
                          f"liger-kernel {entry['liger_kernel']})",
                          "config": {k: entry[k] for k in ("kernel", "constexprs", "num_warps", "num_stages")},
                          "labels": lab})
    for name, entry in sorted(json.loads((HERE / "quack-labels.json").read_text()).items()):
        for ext in ("cubin", "ptx"):
            cases.append({"id": f"{name}-{ext}", "source": "quack",
                          "artifact": f"{HERE.relative_to(REPO)}/artifacts/quack/{name}.{ext}.xz",
                          "build": "PYTHONPATH=/tmp/cv/lib/python3.11/site-packages:/tmp/tv/lib/python3.11/site-packages:"
                          f".venv/lib/python3.11/site-packages /tmp/cv/bin/python {HERE.relative_to(REPO)}/build_quack.py "
                          f"--only {name} (quack-kernels {entry['quack_kernels']}, nvidia-cutlass-dsl "
                          f"{entry['nvidia_cutlass_dsl']})",
                          "config": {**{k: entry[k] for k in ("kernel", "N", "dtype")}, **entry.get("config", {})},
                          "labels": dict(entry["labels"])})
    for name, entry in sorted(json.loads((HERE / "flash-labels.json").read_text()).items()):
        for ext in ("cubin", "ptx"):
            cases.append({"id": f"{name}-{ext}", "source": "flash-attn-4",
                          "artifact": f"{HERE.relative_to(REPO)}/artifacts/flash/{name}.{ext}.xz",
                          "build": "PYTHONPATH=/tmp/cv/lib/python3.11/site-packages:/tmp/tv/lib/python3.11/site-packages:"
                          f".venv/lib/python3.11/site-packages /tmp/cv/bin/python {HERE.relative_to(REPO)}/build_flash.py "
                          f"--only {name} (flash-attn-4 {entry['flash_attn_4']}, nvidia-cutlass-dsl "
                          f"{entry['nvidia_cutlass_dsl']})",
                          "config": entry["config"], "labels": dict(entry["labels"])})
    cute = json.loads((HERE / "cute-labels.json").read_text())
    for name, entry in sorted(cute.items()):
        for ext in ("cubin", "ptx"):
            lab = dict(entry["labels"])
            cases.append({"id": f"{name}-{ext}", "source": "cute", "artifact": f"{HERE.relative_to(REPO)}/artifacts/{name}.{ext}",
                          "build": f".venv312/bin/python {HERE.relative_to(REPO)}/build_cute.py --only {name}",
                          "config": entry["knobs"], "labels": lab})
    return cases


def render(cases: list[dict]) -> str:
    ids = {c["id"] for c in cases}
    assert all(p["ref"] in ids and p["cand"] in ids for p in PAIRS)
    return json.dumps({"comment": __doc__.strip().splitlines()[0], "cases": cases, "pairs": PAIRS}, indent=1) + "\n"


def main() -> None:
    cases = build_cases()
    (HERE / "labels.json").write_text(render(cases))
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main()
