"""GEMV build variants of the AMK VM timed against each other on the Llama-3.2-1B decode GEMVs, each cut one task
per SM as ``gemv_split="balanced"`` cuts them: the default body (bursts of 8 16-byte loads per lane), the weight
preload (8 chunks per lane before the wait) and the weight stream (TMA into a shared-memory ring; slots, piece size
and the proxy fence varied). Each variant's hf-bf16 output must be bit-identical to the default build's (else it
is reported, not timed); us per step from 20-step launches (a grid sync per step: the skeleton of the same launch,
every op skipped, is timed too), GB/s of weight bytes. One table and ``$OUT/amk_gemv_variants.json``.

    python3 benchmarks/amk_gemv_variants.py [--variants default,preload8,stream4] [--launches 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _device import add_json, json_path, time_launch, write_json

VARIANTS = {"default": (), "preload8": ("AMK_WEIGHT_PRELOAD=8",), "stream2": ("AMK_WSTREAM=2",),
            "stream4": ("AMK_WSTREAM=4",), "stream4-nofence": ("AMK_WSTREAM=4", "AMK_WS_FENCE=0"),
            "stream2-4k": ("AMK_WSTREAM=2", "AMK_WS_PIECE_KB=4"), "stream1-8k": ("AMK_WSTREAM=1", "AMK_WS_PIECE_KB=8")}
# name: (op, rows, K); the Llama-3.2-1B shapes of one decode step
SHAPES = {"o_proj 2048x2048": ("gemv", 2048, 2048), "qkv 3072x2048": ("gemv", 3072, 2048),
          "gate_up 2x8192x2048": ("gemv_silu_mul", 8192, 2048), "down 2048x8192": ("gemv", 2048, 8192),
          "lm_head 128256x2048": ("gemv", 128256, 2048)}


def balanced(n: int, parts: int) -> list[tuple[int, int]]:
    base, extra = divmod(n, parts)
    out, lo = [], 0
    for k in range(min(parts, n)):
        hi = lo + base + (1 if k < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def case(op: str, n: int, k: int, sms: int, rng):
    from mosaic_amk.bench.microbench import op_schedule
    from mosaic_amk.cuda.launcher import bf16_round
    from mosaic_amk.schedule import Buffer

    x = bf16_round(rng.standard_normal(k).astype(np.float32))
    mats = ["w"] if op == "gemv" else ["wg", "wu"]
    weights = {m: bf16_round((0.02 * rng.standard_normal((n, k))).astype(np.float32)) for m in mats}
    bufs = [Buffer("x", "f32", (k,), "input")] + [Buffer(m, "f32", (n, k), "weight") for m in mats]
    bufs.append(Buffer("y", "f32", (n,), "output"))
    params = {"bias": False, "residual": False} if op == "gemv" else {"bias": False}
    s = op_schedule(op, bufs, ["x", *mats], ["y"], params, sms, rows=balanced(n, sms), row_buffers=[*mats, "y"])
    return s, weights, {"x": x}, len(mats) * n * k * 2


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--launches", type=int, default=5)
    add_json(p, "amk_gemv_variants")
    a = p.parse_args(argv)
    import cupy as cp
    from mosaic_amk.cuda import build as B
    from mosaic_amk.cuda.encode import encode
    from mosaic_amk.cuda.launcher import SKIPPABLE, Launcher, gate

    def timed(lz, **kw) -> float:
        return time_launch(lz, n=a.launches, steps=20, **kw)

    names = [v for v in a.variants.split(",") if v]
    rng = np.random.default_rng(0)
    out = {}
    for shape, (op, n, k) in SHAPES.items():
        s, weights, inputs, nbytes = case(op, n, k, 132, rng)
        assert gate(s).ok
        ref = None
        for v in names:
            defines = VARIANTS[v]
            try:
                b = B.build(512, defines=defines)
                lz = Launcher(encode(s, runtime_position=False), str(b.cubin), mode="hf-bf16", prefetch_depth=0,
                              ring_bytes=B.ring_bytes(512, defines))
                lz.bind(weights, inputs)
                lz.launch()
                lz.check()
                got = cp.asnumpy(lz.dev["y"]).astype(np.float32)
                ref = got if ref is None else ref
                same = bool(np.array_equal(got.view(np.uint32), ref.view(np.uint32)))
                us = timed(lz) if same else None
                skel = timed(lz, skip_ops=sum(SKIPPABLE.values()))
                r = {"us": us, "skeleton_us": skel, "gbs": nbytes / (us * 1e-6) / 1e9 if us else None,
                     "bits_equal_default": same, "registers": b.registers, "spills": b.spill_stores}
            except Exception as exc:  # noqa: BLE001 - one variant must not lose the others
                r = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            out.setdefault(shape, {})[v] = r
            print(f"{shape:22s} {v:16s} " + (f"{r['us']:8.2f} us {r['gbs']:7.0f} GB/s  skeleton {r['skeleton_us']:.2f} us"
                                              if r.get("us") else (r.get("error") or "bits differ from default")),
                  flush=True)
    write_json(json_path(a), out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
