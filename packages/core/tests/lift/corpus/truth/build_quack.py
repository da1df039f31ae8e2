"""Compile quack-kernels' CuTe DSL kernels (rmsnorm, layernorm, softmax, cross-entropy; Tri Dao et al.) for
sm_90a on this CPU machine through their own tensor-free compile functions (fake tensors, a fake stream),
and keep each kernel's cubin and PTX, xz-compressed, under artifacts/quack/, plus quack-labels.json: the
truth of each case read from quack's source and its launch heuristics, never from the lifter.

    python3.11 -m venv /tmp/cv && /tmp/cv/bin/pip install nvidia-cutlass-dsl==4.8.1 apache-tvm-ffi einops \\
        && /tmp/cv/bin/pip install --no-deps quack-kernels==0.6.5
    PYTHONPATH=/tmp/cv/lib/python3.11/site-packages:/tmp/tv/lib/python3.11/site-packages:.venv/lib/python3.11/site-packages \\
        /tmp/cv/bin/python packages/core/tests/lift/corpus/truth/build_quack.py [--only NAME]

(quack imports torch (the CPU torch of .venv serves) and, for its autotuner, triton (build_triton.py's venv);
nvidia-cutlass-dsl 4.8.1 has cp311 wheels. CUTE_DSL_ARCH=sm_90a is set here: no GPU is asked.)

Truth used: every kernel launches ``block=[num_threads, 1, 1]`` (quack's ``_num_threads``: 128 up to
N = 16384, else 256) over ``grid=[ceil(M / rows_per_cta), cluster_n, 1]``, one CTA per tile of rows and no
loop over tiles (not persistent, no warp roles, no MMA); a whole row tile sits in registers, so there is no
loop over the columns either; results are stored with plain global stores. Softmax and the cross-entropy
forward take ``exp2(..., fastmath=True)`` (the hardware ``ex2``: approximate exp); softmax divides with
``rcp_approx``; the norms take no exp.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ART = HERE / "artifacts" / "quack"


def _labels(num_threads: int, exp: bool, rcp: bool | None) -> dict:
    lab = {"block": [num_threads, 1, 1], "roles": ["all"], "roles.registers": {}, "mma.form": [],
           "persistent": False, "loops.depth": 0, "transfer.store_form": ["st.global"],
           "exp.form": ["approx"] if exp else []}
    if rcp is not None:
        lab["div.form"] = ["approx"] if rcp else []
    return lab


def _threads(n: int) -> int:
    return 128 if n <= 16384 else 256  # quack.reduction_base.ReductionBase._num_threads


#: name -> (what to compile, its arguments, labels)
CASES = {
    "quack-rmsnorm-bf16-4096": ("rmsnorm", 4096, _labels(_threads(4096), exp=False, rcp=None)),
    "quack-rmsnorm-bf16-65536-cluster4": ("rmsnorm", 65536, _labels(_threads(65536), exp=False, rcp=None)),
    "quack-layernorm-bf16-4096": ("layernorm", 4096, _labels(_threads(4096), exp=False, rcp=None)),
    "quack-softmax-bf16-4096": ("softmax", 4096, _labels(_threads(4096), exp=True, rcp=True)),
    "quack-softmax-bf16-65536-cluster4": ("softmax", 65536, _labels(_threads(65536), exp=True, rcp=True)),
    "quack-cross-entropy-bf16-32768": ("cross_entropy", 32768, _labels(_threads(32768), exp=True, rcp=None)),
}


#: quack's Hopper GEMM (quack.gemm._compile_gemm -> GemmDefaultSm90), bf16 A (k-major) x B (k-major) -> D
#: (n-major), persistent tile scheduler: name -> (tile_mn, pingpong, cluster_m); its labels come from the
#: GemmSm90 object quack builds (threads_per_cta, mma_warp_groups, num_regs_load / num_regs_mma,
#: atom_layout_mnk, ab_stage, is_persistent), read after its own compile
GEMMS = {
    "quack-gemm-sm90-128x256-coop": ((128, 256), False, 1),
    "quack-gemm-sm90-128x128-pingpong": ((128, 128), True, 1),
    "quack-gemm-sm90-128x192-coop-c2x1": ((128, 192), False, 2),
}


def gemm_labels(obj) -> dict:
    atom_m, atom_n, _ = obj.atom_layout_mnk
    tn = obj.cta_tile_shape_mnk[1]
    return {"block": [obj.threads_per_cta, 1, 1], "roles": ["consumer", "producer"],
            "roles.registers": {"producer": obj.num_regs_load, "consumer": obj.num_regs_mma},
            "roles.warpgroups": {"producer": 1, "consumer": obj.mma_warp_groups},
            "persistent": bool(obj.is_persistent), "mma.form": ["wgmma"], "mma.shape": [f"m64n{tn // atom_n}k16"],
            "mma.types": ["bf16", "f32"], "transfer.form": ["tma"], "pipeline.stages": obj.ab_stage,
            "loop.unroll@consumer": 1}  # cutlass.range(k_tile_cnt, unroll=1) mainloops


def compile_gemm(name: str, out: Path) -> None:
    import importlib

    import cutlass.cute as cute
    from cutlass import BFloat16

    tile, pingpong, cm = GEMMS[name]
    g = importlib.import_module("quack.gemm")
    seen = []
    real = cute.compile

    def compile_and_keep(obj, *args, **kw):
        seen.append(obj)
        return real(obj, *args, **kw)

    g.cute.compile = compile_and_keep
    f = getattr(g._compile_gemm, "__wrapped__", g._compile_gemm)
    # (a, b, d, c dtypes; a, b, d, c majors; tile; cluster; pingpong, persistent, dynamic persistent; rowvec,
    # colvec dtypes, colvec ndim; alpha, beta modes; add_to_output, concat_layout, varlen_m, varlen_k, gather_A,
    # tma gather, batch permute; device capacity; rounding, sr seed mode; num_warps) as quack.gemm.gemm passes
    f(BFloat16, BFloat16, BFloat16, None, "k", "k", "n", None, tile, (cm, 1, 1), pingpong, True, False,
      None, None, 0, 0, 0, False, None, False, False, False, False, False, (9, 0), g.RoundingMode.RN, 0, None,
      batched=False)
    out.write_text(json.dumps(gemm_labels(seen[0])))


def compile_one(kind: str, n: int) -> None:
    import importlib

    from cutlass import BFloat16, Float32, Int64

    if kind in ("rmsnorm", "layernorm"):
        mod = importlib.import_module("quack.rmsnorm")
        f = getattr(mod._compile_rmsnorm_fwd, "__wrapped__", mod._compile_rmsnorm_fwd)
        layer = kind == "layernorm"
        # (dtype, out, residual, weight, bias, residual_out, N, has_rstd, has_mean, is_layernorm, per_head)
        f(BFloat16, BFloat16, None, BFloat16, BFloat16 if layer else None, None, n, True, layer, layer, False)
    elif kind == "softmax":
        mod = importlib.import_module("quack.softmax")
        f = mod.Softmax.compile
        getattr(f, "__wrapped__", f)(BFloat16, BFloat16, n)
    elif kind == "cross_entropy":
        mod = importlib.import_module("quack.cross_entropy")
        f = mod.CrossEntropy.compile
        # forward only (online softmax): int64 targets, no target logits, loss + lse, no dx, no weight
        getattr(f, "__wrapped__", f)(BFloat16, Int64, None, n, True, False, None, 1)
    else:
        raise SystemExit(f"unknown kind {kind}")
    del Float32


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "N", "DUMP"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.child[0] == "gemm":
            compile_gemm(args.child[1], Path(args.child[2]) / "labels.json")
        else:
            compile_one(args.child[0], int(args.child[1]))
        return 0
    from importlib.metadata import version

    ART.mkdir(parents=True, exist_ok=True)
    out_labels = HERE / "quack-labels.json"
    data = json.loads(out_labels.read_text()) if out_labels.exists() else {}
    todo = [(name, kind, str(n), lab) for name, (kind, n, lab) in CASES.items()]
    todo += [(name, "gemm", name, None) for name in GEMMS]
    for name, kind, arg, lab in todo:
        if args.only and name != args.only:
            continue
        with tempfile.TemporaryDirectory() as dump:
            env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_KEEP_PTX": "1", "CUTE_DSL_KEEP_CUBIN": "1",
                   "CUTE_DSL_DUMP_DIR": dump}
            subprocess.run([sys.executable, __file__, "--child", kind, arg, dump], env=env, check=True)
            if lab is None:
                lab = json.loads((Path(dump) / "labels.json").read_text())
                n = GEMMS[name]
            else:
                n = int(arg)
            ptx, cubin = sorted(Path(dump).glob("*.ptx")), sorted(Path(dump).glob("*.cubin"))
            if len(ptx) != 1 or len(cubin) != 1:
                raise SystemExit(f"{name}: expected one kernel, the DSL kept {len(ptx)} PTX / {len(cubin)} cubins")
            (ART / f"{name}.cubin.xz").write_bytes(lzma.compress(cubin[0].read_bytes(), preset=9))
            (ART / f"{name}.ptx.xz").write_bytes(lzma.compress(ptx[0].read_bytes(), preset=9))
        data[name] = {"kernel": kind, "N": n if kind != "gemm" else None, "dtype": "bf16",
                      **({"config": {"tile_mn": list(n[0]), "pingpong": n[1], "cluster": [n[2], 1, 1],
                                     "persistent": True}} if kind == "gemm" else {}), "quack_kernels": version("quack-kernels"),
                      "nvidia_cutlass_dsl": version("nvidia-cutlass-dsl"), "labels": lab}
        print(name, flush=True)
        out_labels.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(HERE / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
