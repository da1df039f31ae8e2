"""Compile Triton kernels written by others (liger-kernel's Triton ops) for sm_90a on this CPU machine, with
no GPU and no driver (``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``), and keep each
kernel's cubin and PTX, xz-compressed, under artifacts/triton/, plus triton-labels.json: the truth of each
case read from the kernel's source, its launch configuration (liger's own ``calculate_settings`` and
autotune configs) and Triton's documented lowering, never from the lifter.

    python -m venv /tmp/tv && /tmp/tv/bin/pip install triton==3.9.0 && /tmp/tv/bin/pip install --no-deps liger-kernel==0.8.5
    PYTHONPATH=.venv/lib/python3.11/site-packages /tmp/tv/bin/python \\
        packages/core/tests/lift/corpus/truth/build_triton.py [--only NAME]

(liger imports torch at module level; the CPU torch of .venv serves, Triton itself comes from the scratch venv.)

Truth used for every case: Triton launches ``32 * num_warps`` threads per program (``.reqntid``); one program
per row (the norms, softmax) or per output tile (swiglu), so nothing is persistent and there are no warp
roles; ``tl.load``/``tl.store`` on pointers are plain global accesses, a host TensorDescriptor's
``.load``/``.store`` is TMA; ``tl.dot`` of bf16 tiles on sm_90 with 4 warps and a 64-row tile is one warpgroup
MMA (``m64n{BLOCK_N}k16``), pipelined over ``num_stages`` buffers; fp32 ``/`` is ``tl.fdiv`` with
``ieee_rounding=False`` (not IEEE: triton/language/math.py), fp32 ``exp`` (also inside ``tl.sigmoid``) is the
hardware ``ex2`` after a multiply by log2(e).
"""

from __future__ import annotations

import argparse
import importlib
import json
import lzma
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ART = HERE / "artifacts" / "triton"
N_COLS = 4096  # a Llama-sized hidden dimension


def _row_kernel_labels(num_warps: int, exp: bool, loops: int) -> dict:
    return {"block": [32 * num_warps, 1, 1], "roles": ["all"], "roles.registers": {}, "mma.form": [],
            "persistent": False, "loops.depth": loops, "transfer.form": ["ld.global"],
            "transfer.store_form": ["st.global"], "exp.form": ["approx"] if exp else [],
            "div.form": ["approx"]}


def cases():
    from liger_kernel.ops.utils import calculate_settings

    block, warps = calculate_settings(N_COLS)  # liger's own launch settings for a 4096-wide row
    ptr = "*fp32"
    out = {
        "triton-liger-softmax-single-block": {
            "module": "liger_kernel.ops.softmax", "kernel": "_softmax_single_block_forward_kernel",
            "signature": {"Y_ptr": ptr, "Y_row_stride": "i32", "X_ptr": ptr, "X_row_stride": "i32", "n_cols": "i32"},
            "constexprs": {"BLOCK_SIZE": block}, "num_warps": warps, "num_stages": 3,
            "labels": _row_kernel_labels(warps, exp=True, loops=0)},
        "triton-liger-rms-norm": {
            "module": "liger_kernel.ops.rms_norm", "kernel": "_rms_norm_forward_kernel",
            "signature": {"Y_ptr": "*bf16", "Y_row_stride": "i32", "X_ptr": "*bf16", "X_row_stride": "i32",
                          "W_ptr": "*bf16", "W_row_stride": "i32", "RSTD_ptr": "*fp32", "RSTD_row_stride": "i32",
                          "n_cols": "i32", "eps": "fp32", "offset": "fp32"},
            "constexprs": {"casting_mode": 0, "elementwise_affine": True, "BLOCK_SIZE": block},  # llama casting
            "num_warps": warps, "num_stages": 3,
            "labels": _row_kernel_labels(warps, exp=False, loops=0)},
        "triton-liger-layer-norm": {
            "module": "liger_kernel.ops.layer_norm", "kernel": "_layer_norm_forward_kernel",
            "signature": {"Y_ptr": "*bf16", "Y_row_stride": "i32", "X_ptr": "*bf16", "X_row_stride": "i32",
                          "W_ptr": "*bf16", "W_row_stride": "i32", "B_ptr": "*bf16", "B_row_stride": "i32",
                          "Mean_ptr": "*fp32", "Mean_row_stride": "i32", "RSTD_ptr": "*fp32",
                          "RSTD_row_stride": "i32", "n_cols": "i32", "eps": "fp32"},
            "constexprs": {"BLOCK_SIZE": block}, "num_warps": warps, "num_stages": 3,
            "labels": _row_kernel_labels(warps, exp=False, loops=0)},
    }
    # liger's swiglu inference GEMM (TMA descriptors, two tl.dot per k step, sigmoid epilogue): three points
    # of its own autotune space (BLOCK_M in 32/64, BLOCK_N 128, BLOCK_K 64/128, num_warps 4/8, num_stages 2/3)
    for bm, bn, bk, w, s in ((64, 128, 64, 4, 2), (64, 128, 64, 4, 3), (64, 128, 128, 4, 2)):
        out[f"triton-liger-swiglu-{bm}x{bn}x{bk}-w{w}-s{s}"] = {
            "module": "liger_kernel.ops.mlp", "kernel": "_swiglu_kernel_forward_inference",
            "signature": {"desc_input": f"tensordesc<bf16[1, {bm}, {bk}]>", "desc_Wg": f"tensordesc<bf16[{bn}, {bk}]>",
                          "desc_Wu": f"tensordesc<bf16[{bn}, {bk}]>", "desc_A": f"tensordesc<bf16[1, {bm}, {bn}]>",
                          "S": "i32", "dim": "i32", "hidden_dim": "i32", "bucket_M": "i32"},
            "constexprs": {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SIZE_M": 4, "gate_multiplier": 1.0},
            "num_warps": w, "num_stages": s,
            "labels": {"block": [32 * w, 1, 1], "roles": ["all"], "roles.registers": {}, "persistent": False,
                       "loops.depth": 1, "loop.unroll": 1, "mma.form": ["wgmma"], "mma.shape": [f"m64n{bn}k16"],
                       "mma.types": ["bf16", "f32"], "transfer.form": ["tma"], "transfer.store_form": ["tma"],
                       "pipeline.stages": s, "exp.form": ["approx"], "div.form": ["approx"]}}
    # liger's int8 x packed-int2 GEMM (ops/experimental/mm_int8int2.py, the Triton tutorial's grouped matmul on
    # pointers): the first two configs of its own get_autotune_config(); int8 tl.dot into an int32 accumulator
    # (wgmma s32.s8.s8); strides of 1 are specialised to constants as Triton's launcher does; integer divides only
    from liger_kernel.ops.experimental.mm_int8int2 import get_autotune_config

    for cfg in get_autotune_config()[:2]:
        kw = cfg.kwargs
        name = (f"triton-liger-mm-int8int2-{kw['BLOCK_SIZE_M']}x{kw['BLOCK_SIZE_N']}x{kw['BLOCK_SIZE_K']}"
                f"-w{cfg.num_warps}-s{cfg.num_stages}")
        out[name] = {
            "module": "liger_kernel.ops.experimental.mm_int8int2", "kernel": "matmul_kernel",
            "signature": {"a_ptr": "*i8", "b_ptr": "*u8", "c_ptr": "*i32", "M": "i32", "N": "i32",
                          "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"},
            "constexprs": {"K": N_COLS, "stride_ak": 1, "stride_bn": 1, "stride_cn": 1, **kw},
            "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
            "labels": {"block": [32 * cfg.num_warps, 1, 1], "roles": ["all"], "roles.registers": {},
                       "persistent": False, "mma.form": ["wgmma"], "mma.types": ["s32", "s8"],
                       "transfer.store_form": ["st.global"], "exp.form": [], "div.form": []}}
    return out


def compile_case(spec: dict):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(spec["module"]), spec["kernel"])
    while not hasattr(fn, "src") and hasattr(fn, "fn"):  # an autotuner / heuristics wrapper
        fn = fn.fn
    src = ASTSource(fn=fn, signature=spec["signature"], constexprs=spec["constexprs"])
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": spec["num_warps"], "num_stages": spec["num_stages"]})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated
    import triton
    from importlib.metadata import version

    ART.mkdir(parents=True, exist_ok=True)
    out_labels = HERE / "triton-labels.json"
    data = json.loads(out_labels.read_text()) if out_labels.exists() else {}
    for name, spec in cases().items():
        if args.only and name != args.only:
            continue
        k = compile_case(spec)
        (ART / f"{name}.cubin.xz").write_bytes(lzma.compress(k.asm["cubin"], preset=9))
        (ART / f"{name}.ptx.xz").write_bytes(lzma.compress(k.asm["ptx"].encode(), preset=9))
        data[name] = {"kernel": f"{spec['module']}.{spec['kernel']}", "signature": spec["signature"],
                      "constexprs": spec["constexprs"], "num_warps": spec["num_warps"],
                      "num_stages": spec["num_stages"], "triton": triton.__version__,
                      "liger_kernel": version("liger-kernel"), "labels": spec["labels"]}
        print(f"{name}: {k.metadata.name} warps {k.metadata.num_warps} smem {k.metadata.shared}", flush=True)
        out_labels.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
