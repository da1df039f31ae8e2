"""HF's own decoders of one checkpoint, as criterion (2) needs them (parity.near_tie_criterion): the reference
(eager greedy ``generate`` with its KV cache, batch 1) and variants teacher-forced over the reference's tokens
(one forward per prompt without a cache; one forward of every prompt as a right-padded batch). Any dtype and
device: the model is used as loaded; logits come back as float32 numpy. The GPU's static cache + CUDA graph
variant is mosaic_amk.bench.hf_gpu's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mosaic_amk.parity import hf_greedy_with


def reference(model, prompts: Sequence[Sequence[int]], n_tokens: int) -> list[tuple[list[int], list[np.ndarray]]]:
    """Per prompt: HF eager greedy tokens and the logits each was chosen from (batch 1, KV cache)."""
    return [hf_greedy_with(model, p, n_tokens) for p in prompts]


def _rows(logits, start: int, n: int) -> tuple[list[int], list[np.ndarray]]:
    rows = [logits[start + i].float().cpu().numpy() for i in range(n)]
    return [int(np.argmax(r)) for r in rows], rows


def forced_single(model, prompts: Sequence[Sequence[int]], runs: Sequence[tuple]) -> list[tuple]:
    """Per prompt: one forward (batch 1, no cache) over prompt + the reference's tokens[:-1]."""
    import torch

    out = []
    with torch.no_grad():
        for p, (tokens, _) in zip(prompts, runs, strict=True):
            seq = torch.tensor([list(p) + list(tokens[:-1])], dtype=torch.long, device=model.device)
            out.append(_rows(model(seq).logits[0], len(p) - 1, len(tokens)))
    return out


def forced_batch(model, prompts: Sequence[Sequence[int]], runs: Sequence[tuple], pad_id: int = 0) -> list[tuple]:
    """Per prompt: its rows of one forward of every prompt + its reference tokens[:-1] as a batch, right-padded
    (the causal mask keeps a sequence's real positions from reading the padding)."""
    import torch

    seqs = [list(p) + list(t[:-1]) for p, (t, _) in zip(prompts, runs, strict=True)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    with torch.no_grad():
        logits = model(ids.to(model.device), attention_mask=mask.to(model.device)).logits
    return [_rows(logits[i], len(p) - 1, len(t)) for i, (p, (t, _)) in enumerate(zip(prompts, runs, strict=True))]


def static_cache(model, prompts: Sequence[Sequence[int]], runs: Sequence[tuple], *, graph: bool = True
                 ) -> tuple[str, list[tuple]]:
    """Per prompt: HF's StaticCache decode step (``bench.hf_gpu.StaticGraphDecoder``; captured in a CUDA graph
    when ``graph``, falling back to the uncaptured step, the same arithmetic, if capture fails), teacher-forced
    over the reference's tokens. Returns (variant name, runs)."""
    from mosaic_amk.bench.hf_gpu import StaticGraphDecoder

    cache = max(len(p) + len(t) for p, (t, _) in zip(prompts, runs, strict=True))
    name = "hf-static-cache-graph" if graph else "hf-static-cache"
    try:
        dec = StaticGraphDecoder(model, max_cache_len=cache, graph=graph)
    except Exception:  # noqa: BLE001 - capture refused: run the same step uncaptured, and say so in the name
        dec, name = StaticGraphDecoder(model, max_cache_len=cache, graph=False), "hf-static-cache(uncaptured)"
    out = []
    for p, (t, _) in zip(prompts, runs, strict=True):
        argmax, logits = dec.decode(p, len(t), forced=t)
        out.append((list(argmax), [np.asarray(x, np.float32) for x in logits]))
    return name, out


def bf16_criterion(model, prompts: Sequence[Sequence[int]], n_tokens: int, candidate, *, graph: bool = True):
    """Criterion (2) in one run: HF eager bf16 greedy (batch 1) is the reference; HF's static cache (+ CUDA
    graph on the GPU) and HF eager with every prompt in one batch, both teacher-forced over the reference's
    tokens, give the envelope; ``candidate(prompt, tokens) -> (argmax, logits)`` (e.g. ``CudaVM.forced``) is
    judged against it. Returns parity.NearTieVerdict."""
    from mosaic_amk.parity import near_tie_criterion

    ref = reference(model, prompts, n_tokens)
    name, static = static_cache(model, prompts, ref, graph=graph)
    variants = {name: static, f"hf-eager-batch{len(prompts)}": forced_batch(model, prompts, ref)}
    cand = [candidate(p, t) for p, (t, _) in zip(prompts, ref, strict=True)]
    return near_tie_criterion(ref, variants, cand)
