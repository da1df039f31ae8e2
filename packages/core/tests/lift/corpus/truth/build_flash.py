"""Compile flash-attn-4's CuTe DSL attention forward for Hopper (flash_attn.cute.flash_fwd_sm90,
FlashAttentionForwardSm90) for sm_90a on this CPU machine, through the package's own CPU-only path
(FLASH_ATTENTION_ARCH=sm_90, CUTE_DSL_ARCH=sm_90a, FLASH_ATTENTION_NUM_SMS=132 and torch's FakeTensorMode
around ``flash_attn.cute.interface._flash_attn_fwd``), and keep each cubin and PTX, xz-compressed, under
artifacts/flash/, plus flash-labels.json: the truth read from flash-attn-4's source, never from the lifter.

    (the venvs of build_quack.py) /tmp/cv/bin/pip install --no-deps flash-attn-4==4.0.0b36
    PYTHONPATH=/tmp/cv/lib/python3.11/site-packages:/tmp/tv/lib/python3.11/site-packages:.venv/lib/python3.11/site-packages \\
        /tmp/cv/bin/python packages/core/tests/lift/corpus/truth/build_flash.py [--only NAME]

Truth (flash_fwd_sm90.py, interface.py): ``num_threads=384`` is one producer warpgroup (``warp_idx < 4``,
``setmaxregister_decrease(num_producer_regs)``) and two MMA warpgroups (``setmaxregister_increase``), with
``{2: (240, 24)}[num_wg_mma]`` registers (TMA for Q, K and V); the interface builds the kernel with
``num_stages=2`` (K and V pipelines of 2 stages each); ``SingleTileScheduler`` / ``SingleTileLPTScheduler``
give one tile per CTA (``is_persistent=False``); S = Q K^T and O += P V are warpgroup MMAs of
``atom_layout_mnk=(tile_m // 64, 1, 1)``, i.e. m64 x tile_n and m64 x head_dim_v, k16 for bf16; O leaves by
TMA (``use_tma_O``); exp2 is taken with ``fastmath=True`` (hardware ex2) and the row sum inverted with
``rcp_approx``.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ART = HERE / "artifacts" / "flash"

CASES = {
    # Blackwell (FlashAttentionForwardSm100, sm_100a: tcgen05 MMA into tensor memory, a warp-role switch
    # compiled to a jump table); causal, whose SingleTileLPTScheduler needs no SM count at trace time
    "flash4-fwd-sm100-hdim128-causal": {"head_dim": 128, "tile_mn": None, "causal": True, "arch": "sm_100"},
    "flash4-fwd-sm90-hdim128-128x128": {"head_dim": 128, "tile_mn": (128, 128), "causal": False},
    "flash4-fwd-sm90-hdim128-128x128-causal": {"head_dim": 128, "tile_mn": (128, 128), "causal": True},
    "flash4-fwd-sm90-hdim64-128x128": {"head_dim": 64, "tile_mn": (128, 128), "causal": False},
}


def labels_sm100(obj: dict) -> dict:
    """From the FlashAttentionForwardSm100 object the interface built: its threads_per_cta (softmax,
    correction, MMA, load and epilogue warps) and is_persistent; its MMAs are tcgen05 (UMMA) and Q/K/V
    arrive by TMA."""
    return {"block": [obj["threads_per_cta"], 1, 1], "persistent": obj["is_persistent"], "mma.form": ["tcgen05"],
            "transfer.form": ["tma"]}


def labels(cfg: dict) -> dict:
    tm, tn = cfg["tile_mn"]
    shapes = sorted({f"m64n{tn}k16", f"m64n{cfg['head_dim']}k16"})
    return {"block": [384, 1, 1], "roles": ["consumer", "producer"],
            "roles.registers": {"producer": 24, "consumer": 240}, "roles.warpgroups": {"producer": 1, "consumer": 2},
            "persistent": False, "mma.form": ["wgmma"], "mma.shape": shapes, "mma.types": ["bf16", "f32"],
            "transfer.form": ["tma"], "pipeline.stages": 2, "exp.form": ["approx"], "div.form": ["approx"],
            "loop.unroll@producer": 1, "loop.unroll@consumer": 1}  # cutlass.range(..., unroll=1) over n blocks


def compile_one(cfg: dict, out: Path) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flash_attn.cute import interface

    import cutlass.cute as cute

    seen = []
    real = cute.compile

    def compile_and_keep(obj, *args, **kw):
        seen.append(obj)
        return real(obj, *args, **kw)

    interface.cute.compile = compile_and_keep
    d = cfg["head_dim"]
    with FakeTensorMode():
        q, k, v = (torch.empty(2, 2048, 16, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        interface._flash_attn_fwd(q, k, v, causal=cfg["causal"],
                                  tile_mn=tuple(cfg["tile_mn"]) if cfg["tile_mn"] else None)
    obj = seen[-1]
    out.write_text(json.dumps({"threads_per_cta": int(getattr(obj, "threads_per_cta", 0)),
                               "is_persistent": bool(getattr(obj, "is_persistent", False))}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        compile_one(CASES[args.child], Path(os.environ["CUTE_DSL_DUMP_DIR"]) / "object.json")
        return 0
    from importlib.metadata import version

    ART.mkdir(parents=True, exist_ok=True)
    out_labels = HERE / "flash-labels.json"
    data = json.loads(out_labels.read_text()) if out_labels.exists() else {}
    for name, cfg in CASES.items():
        if args.only and name != args.only:
            continue
        with tempfile.TemporaryDirectory() as dump:
            arch = cfg.get("arch", "sm_90")
            env = {**os.environ, "FLASH_ATTENTION_ARCH": arch, "CUTE_DSL_ARCH": arch + "a",
                   "FLASH_ATTENTION_NUM_SMS": "148" if arch == "sm_100" else "132", "CUTE_DSL_KEEP_PTX": "1",
                   "CUTE_DSL_KEEP_CUBIN": "1", "CUTE_DSL_DUMP_DIR": dump}
            subprocess.run([sys.executable, __file__, "--child", name], env=env, check=True,
                           stderr=subprocess.DEVNULL)
            ptx, cubin = sorted(Path(dump).glob("*.ptx")), sorted(Path(dump).glob("*.cubin"))
            if len(ptx) != 1 or len(cubin) != 1:
                raise SystemExit(f"{name}: expected one kernel, the DSL kept {len(ptx)} PTX / {len(cubin)} cubins")
            (ART / f"{name}.cubin.xz").write_bytes(lzma.compress(cubin[0].read_bytes(), preset=9))
            (ART / f"{name}.ptx.xz").write_bytes(lzma.compress(ptx[0].read_bytes(), preset=9))
            obj = json.loads((Path(dump) / "object.json").read_text())
        lab = labels_sm100(obj) if cfg.get("arch") == "sm_100" else labels(cfg)
        data[name] = {"config": {**cfg, "tile_mn": list(cfg["tile_mn"]) if cfg["tile_mn"] else None, "batch": 2,
                                 "seqlen": 2048, "heads": 16, "dtype": "bf16"},
                      "flash_attn_4": version("flash-attn-4"), "nvidia_cutlass_dsl": version("nvidia-cutlass-dsl"),
                      "labels": lab}
        print(name, flush=True)
        out_labels.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
