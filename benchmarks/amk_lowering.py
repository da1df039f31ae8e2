"""The AMK CUDA VM's schedules for the four model shapes, CPU only (nvcc for the VM build, no GPU): the VM built for
512 threads (registers, spills), then every shape lowered at position 0 and the last parity position, validated,
checked to have the same structure at both, encoded: tasks, counters, the weight-bandwidth floor (bytes, ms on the
H200), the KV capacity; the same for the fused configuration (config.VM_FUSIONS) with the serial stages per layer.
Prints a table and writes $OUT/amk_lowering.json (or --json PATH).

    python3 benchmarks/amk_lowering.py [--shapes smollm2-135m,llama-3.2-1b,...] [--tokens 128] [--prompt-len 16]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from _device import add_json, checked, json_path, write_json

SHAPE_ORDER = ("smollm2-135m", "llama-3.2-1b", "smollm2-360m", "tinyllama-1.1b")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPE_ORDER), help="Comma-separated shapes.")
    p.add_argument("--tokens", type=int, default=128, help="Generated tokens per prompt (the last position).")
    p.add_argument("--prompt-len", type=int, default=16, help="Tokens per prompt.")
    add_json(p, "amk_lowering")
    return checked(p, p.parse_args(argv), positive=("tokens", "prompt_len"), shapes="shapes")


def fake_spec(shape: str):
    """A ModelSpec of ``shape`` whose weights are zero-stride views (no memory): for lowering on the CPU."""
    from mosaic_amk.bench.hf_gpu import SHAPES
    from mosaic_amk.importer import _rope_params, reference_inv_freq
    from mosaic_amk.model import INV_FREQ, ModelSpec

    _, c = SHAPES[shape]
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kw = dict(family="llama", vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
              intermediate_size=c["intermediate_size"], num_layers=c["num_hidden_layers"],
              num_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"], head_dim=hd,
              rms_norm_eps=c["rms_norm_eps"], max_position_embeddings=c["max_position_embeddings"],
              tie_word_embeddings=c["tie_word_embeddings"], rope_type=c["rope_parameters"]["rope_type"])
    shapes = ModelSpec(**kw).expected_shapes()
    w = {n: np.broadcast_to(np.zeros((), np.float32), s) for n, s in shapes.items()}
    w[INV_FREQ] = reference_inv_freq(hd, _rope_params(c))
    return ModelSpec(**kw, weights=w)


def lowered(shape: str, tokens: int, prompt_len: int) -> dict:
    """One shape's schedule at positions 0 and the last parity position: validated, same structure, encoded."""
    import attrs
    from mosaic.plugins import host
    from mosaic_amk.bench.bench import floor_bytes
    from mosaic_amk.config import VM_FUSIONS, ScheduleConfig
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.cuda_vm import cuda_config
    from mosaic_amk.lowering import layer_stages, lower
    from mosaic_amk.validate import validate

    gpu = host().get("gpus", "h200")
    last = prompt_len + tokens - 2
    spec = fake_spec(shape)
    cfg = cuda_config(ScheduleConfig(), prompt_len + tokens)
    s0, s1 = lower(spec, cfg, gpu, 0), lower(spec, cfg, gpu, last)
    enc = E.encode(s0)
    fb = floor_bytes(enc)
    out = {"tasks": len(s0.tasks), "counters": s0.num_counters, "valid": [validate(s0).ok, validate(s1).ok],
           "same_structure": E.structure_key(s0) == E.structure_key(s1), "floor_bytes": fb,
           "floor_ms_h200": fb / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3, "kv_capacity": enc.max_attention_tokens}
    # the fused configuration (config.VM_FUSIONS): lowered, validated and encoded at the real sizes
    fcfg = attrs.evolve(cfg, fusion=VM_FUSIONS)
    f0, f1 = lower(spec, fcfg, gpu, 0), lower(spec, fcfg, gpu, last)
    E.encode(f0)
    out["fused"] = {"tasks": len(f0.tasks), "valid": [validate(f0).ok, validate(f1).ok],
                    "same_structure": E.structure_key(f0) == E.structure_key(f1),
                    "stages_per_layer": [layer_stages(s0)["per_layer"], layer_stages(f0)["per_layer"]]}
    return out


def main(argv=None) -> int:
    from mosaic_amk.cuda.build import build

    a = parse_args(argv)
    t = time.time()
    report = {"build": {**build(512).to_json(), "seconds": round(time.time() - t, 1)}, "shapes": {}}
    print(f"{'shape':16s} {'tasks':>6s} {'counters':>8s} {'valid':>11s} {'same':>5s} {'floor MB':>9s} "
          f"{'floor ms':>8s} {'kv cap':>6s} {'fused tasks':>11s} {'stages/layer':>12s}")
    for shape in a.shapes:
        r = report["shapes"][shape] = lowered(shape, a.tokens, a.prompt_len)
        f = r["fused"]
        print(f"{shape:16s} {r['tasks']:6d} {r['counters']:8d} {str(r['valid']):>11s} {str(r['same_structure']):>5s} "
              f"{r['floor_bytes'] / 1e6:9.1f} {r['floor_ms_h200']:8.3f} {r['kv_capacity']:6d} {f['tasks']:11d} "
              f"{str(f['stages_per_layer']):>12s}")
    b = report["build"]
    print(f"VM build: {b.get('registers')} registers, {b.get('spill_stores')} spill stores ({b['seconds']} s)")
    print(f"wrote {write_json(json_path(a), report, indent=1, default=str)}")
    ok = all(r["valid"] == [True, True] and r["same_structure"] for r in report["shapes"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
