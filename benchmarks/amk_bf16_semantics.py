"""Which bf16 rounding point moves the perplexity: the CUDA VM's hf-bf16 contract (docs/amk-cuda.md "Precision
contract"; mosaic_amk.bf16_contract, a float32 torch forward with switchable rounding points) teacher-forced over
the shipped passage of the real SmolLM2-135M checkpoint on its bf16 weights, on the CPU, beside transformers' own
bf16 forwards (eager, sdpa) and HF float32 on the same weights (the value every bf16 run approximates).

Variants: ``contract`` (every point), ``f32`` (none), ``minus-G`` (the contract less group G), ``only-G`` (group G
alone). Each runs in the natural summation order and with ``--seeds`` other orders (``order_seed``: the summed
axes permuted, the same sums): the spread of one variant over the seeds is the noise of a bf16 run of that
contract, the mean its bias against float32.

Measured (CPU, 2026-12-02, the whole passage; docs/amk-cuda.md "How far one bf16 run lands"): the contract over 40
orders 17.4047 (one run's std 3.8e-3), transformers' bf16 eager on 31 permuted equivalent copies 17.3961 (2.5e-3),
HF float32 17.3931; no group left out moves the mean by more than one run's noise. The H200 VM's 17.486056 is a
z +1.2 draw of the contract's ensemble.

    python benchmarks/amk_bf16_semantics.py [--tokens N] [--seeds S] [--variants contract,minus-probs,...]
        [--hf-seeds K] [--seed-start N] [--json OUT.json]      (the whole passage: ~6-20 s a run on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

GROUPS = {"linear": ("linear",), "residual": ("residual",), "norm": ("norm_x", "norm_w"),
          "rope": ("rope_cs", "rope_ops"), "scores": ("qk", "scale"), "probs": ("probs",), "pv": ("pv",),
          "mlp": ("silu", "gateup"), "logits": ("logits",)}


def variants() -> dict[str, frozenset]:
    from mosaic_amk.bf16_contract import CONTRACT

    out = {"contract": CONTRACT, "f32": frozenset()}
    for g, pts in GROUPS.items():
        out[f"minus-{g}"] = CONTRACT - frozenset(pts)
    for g, pts in GROUPS.items():
        out[f"only-{g}"] = frozenset(pts)
    return out


def hf_nll(d, ids, dtype: str, impl: str) -> np.ndarray:
    import torch
    from mosaic_amk.perplexity import token_nll
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, dtype), attn_implementation=impl).eval()
    with torch.no_grad():
        lg = m(torch.tensor([list(ids)], dtype=torch.long)).logits[0].float().numpy()
    return np.array([token_nll(lg[i], ids[i + 1]) for i in range(len(ids) - 1)])


def hf_seeded_nll(d, W: dict, ids, seeds, impl: str = "eager", dtype: str = "bfloat16"):
    """HF (``dtype``, ``impl`` attention) on bf16_contract.permuted_weights of each seed: (seed, per-prediction NLL)."""
    import torch
    from mosaic_amk.bf16_contract import permuted_weights
    from mosaic_amk.perplexity import token_nll
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, dtype), attn_implementation=impl).eval()
    for seed in seeds:
        sd = {k: torch.from_numpy(np.ascontiguousarray(v)).to(getattr(torch, dtype)) for k, v in permuted_weights(W, seed).items()}
        missing, unexpected = m.load_state_dict(sd, strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:
            raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
        if m.config.tie_word_embeddings:
            m.tie_weights()
        with torch.no_grad():
            lg = m(torch.tensor([list(ids)], dtype=torch.long)).logits[0].float().numpy()
        yield seed, np.array([token_nll(lg[i], ids[i + 1]) for i in range(len(ids) - 1)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=0, help="score only the passage's first N tokens (0: all)")
    ap.add_argument("--seeds", type=int, default=0, help="summation orders per variant besides the natural one")
    ap.add_argument("--seed-start", type=int, default=1, help="the first order seed (more runs of an ensemble)")
    ap.add_argument("--no-natural", action="store_true", help="skip the natural summation order (seed None)")
    ap.add_argument("--variants", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' own forwards")
    ap.add_argument("--hf-seeds", type=int, default=0,
                    help="HF bf16 eager and sdpa also on this many permuted (equivalent) copies of the model")
    ap.add_argument("--hf-impl", default="eager,sdpa", help="attention implementations of --hf-seeds")
    ap.add_argument("--json", default="", help="write every run's perplexity here (rewritten after each run)")
    a = ap.parse_args()
    allv = variants()
    names = [v for v in a.variants.split(",") if v] or list(allv)
    bad = [v for v in names if v not in allv]
    if a.tokens < 0 or a.tokens == 1 or a.seeds < 0 or bad:
        print(f"bad arguments: --tokens 0 (all) or >= 2, --seeds >= 0, variants from {', '.join(allv)}"
              + (f" (unknown: {', '.join(bad)})" if bad else ""), file=sys.stderr)
        return 2
    from mosaic_amk.bf16_contract import forward_nll, load_weights
    from mosaic_amk.checkpoints import checkpoint
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.perplexity import passage_path, read_text, token_ids

    d = checkpoint("smollm2-135m", bf16_weights=True)
    ids = token_ids(d, read_text(passage_path()))
    ids = ids[:a.tokens] if a.tokens else ids
    spec, W = import_checkpoint(d), load_weights(d)
    rec: dict = {"tokens": len(ids), "checkpoint": str(d), "hf": {}, "runs": {}}

    def save():
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rec, f, indent=1)

    ref = None
    if not a.no_hf:
        for key, dt, impl in (("hf-eager-float32", "float32", "eager"), ("hf-eager-bf16", "bfloat16", "eager"),
                              ("hf-sdpa-bf16", "bfloat16", "sdpa")):
            t = time.time()
            nll = hf_nll(d, ids, dt, impl)
            rec["hf"][key] = {"ppl": float(np.exp(nll.mean())), "mean_nll": float(nll.mean()),
                              "seconds": round(time.time() - t, 1)}
            ref = nll if ref is None else ref
            print(f"{key:24s} ppl {rec['hf'][key]['ppl']:.6f}", flush=True)
            save()
    for impl in (a.hf_impl.split(",") if a.hf_seeds else ()):
        runs = rec["hf"].setdefault(f"hf-{impl}-bf16-permuted", [])
        for seed, nll in hf_seeded_nll(d, W, ids, range(a.seed_start, a.seed_start + a.hf_seeds), impl):
            runs.append({"seed": seed, "ppl": float(np.exp(nll.mean())), "mean_nll": float(nll.mean())})
            save()
            print(f"hf-{impl}-bf16-permuted   seed {seed:<4d} ppl {runs[-1]['ppl']:.6f}", flush=True)
        p = np.array([r["ppl"] for r in runs])
        print(f"== hf-{impl}-bf16-permuted mean {p.mean():.6f} std {p.std(ddof=1) if len(p) > 1 else 0:.2e} over "
              f"{len(p)}", flush=True)
    if not a.variants and a.hf_seeds:
        names = []
    for name in names:
        runs = []
        for seed in [None] * (not a.no_natural) + list(range(a.seed_start, a.seed_start + a.seeds)):
            t = time.time()
            nll = forward_nll(spec, W, ids, allv[name], order_seed=seed)
            r = {"seed": seed, "ppl": float(np.exp(nll.mean())), "mean_nll": float(nll.mean()),
                 "seconds": round(time.time() - t, 1)}
            if ref is not None:
                dlt = nll - ref
                r.update(mean_nll_offset_vs_f32=float(dlt.mean()), nll_diff_std_vs_f32=float(dlt.std()))
            runs.append(r)
            rec["runs"][name] = runs
            save()
            print(f"{name:24s} seed {seed!s:4s} ppl {r['ppl']:.6f} ({r['seconds']} s)", flush=True)
        p = np.array([r["ppl"] for r in runs])
        f32 = rec["hf"].get("hf-eager-float32", {}).get("ppl")
        rel = f"rel vs HF f32 {np.mean(p) / f32 - 1:+.2e}" if f32 else ""
        print(f"== {name:21s} mean {p.mean():.6f} std {p.std(ddof=1) if len(p) > 1 else 0:.2e} over {len(p)} {rel}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
