"""The correctness gate of ``mosaic amk bench`` and ``mosaic amk tune``: parity criterion (2) (docs/amk.md
"The parity criterion"), with HF's envelope measured once per run and every candidate judged against it.

:func:`measure_envelope` runs the reference (HF eager greedy, batch 1, KV cache) over the gate prompts and HF's
own variants teacher-forced over the reference's tokens (the static-cache decode step, in a CUDA graph on the GPU;
every prompt in one padded batch; on the CPU also one forward per prompt without a cache); the
envelope is the largest error any variant made in the reference's top-two difference, or in the gap of any token
pair it flipped (``parity.variant_envelope``). :func:`judge` teacher-forces one candidate decoder
(``candidate(prompt, tokens) -> (argmax, logits)``: ``CudaVM.forced``, or :func:`reference_vm_candidate` for the
ReferenceVM) over the same tokens: it passes when every argmax disagreement is a near-tie within the envelope,
with zero decisive disagreements (``parity.NearTieVerdict``). Free-running token equality is not the gate: two
correct bf16 decoders part at the first near-tie and then condition on different histories.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from mosaic_amk.parity import PARITY_PROMPTS, NearTieVerdict, forced, variant_envelope

Candidate = Callable[[Sequence[int], Sequence[int]], tuple]  # (prompt ids, reference tokens) -> (argmax, logits)


@attrs.frozen
class Envelope:
    """The reference runs and HF's own variants against them, measured once; ``k`` in bf16 ulps."""

    prompts: tuple  # tuple of token-id tuples
    reference: tuple  # per prompt (greedy tokens, logits each was chosen from)
    variants: tuple  # (variant name, tuple of parity.Forced per prompt)
    k: int
    seconds: float = 0.0

    @property
    def n_tokens(self) -> int:
        return len(self.reference[0][0]) if self.reference else 0

    def flips(self) -> dict:
        return {name: sum(len(f.disagreements) for f in fs) for name, fs in self.variants}

    def line(self) -> str:
        var = ", ".join(f"{n}: {c} flips" for n, c in self.flips().items())
        return (f"criterion (2) envelope: {self.k} bf16 ulps over {len(self.prompts)} prompts x {self.n_tokens} "
                f"tokens ({var}; {self.seconds:.1f} s)")

    def to_json(self) -> dict:
        return {"envelope_ulps": self.k, "prompts": len(self.prompts), "tokens": self.n_tokens,
                "prompt_ids": [list(p) for p in self.prompts], "variant_flips": self.flips(),
                "seconds": round(self.seconds, 2)}


def gate_prompts(model_dir: str | None, vocab_size: int, n: int = 8, seed: int = 0, length: int = 8
                 ) -> list[list[int]]:
    """The gate's prompts: the first ``n`` parity prompts (parity.PARITY_PROMPTS) through the checkpoint's tokenizer
    when ``model_dir`` has one, else ``n`` seeded random prompts of ``length`` ids (random-init shapes)."""
    if model_dir:
        from mosaic_amk.text import encode, has_tokenizer, load_tokenizer

        if has_tokenizer(model_dir):
            tok = load_tokenizer(model_dir)
            ids = [encode(tok, p) for p in PARITY_PROMPTS[:n]]
            if all(0 <= i < vocab_size for p in ids for i in p):
                return ids
    rng = np.random.default_rng(seed)
    # ids from 1: parity.hf_greedy_with tells generate pad_token_id = 0, which would mask a prompt's token 0
    return [[int(v) for v in rng.integers(1, vocab_size, length)] for _ in range(n)]


def model_dir_of(model) -> str | None:
    """The checkpoint directory a transformers model was loaded from (None for a model built from a config)."""
    from pathlib import Path

    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return path if path and Path(path).is_dir() else None


def measure_envelope(model, prompts: Sequence[Sequence[int]], n_tokens: int, *, graph: bool = True) -> Envelope:
    """The reference and HF's variants of one loaded model (any device and dtype), measured once: HF's static-cache
    decode step (in a CUDA graph on the GPU when ``graph``), every prompt in one padded batch, and on the CPU also
    one uncached forward per prompt."""
    from mosaic_amk import hf_variants

    if not prompts or n_tokens < 1:
        raise ValueError("measure_envelope: needs at least one prompt and one token")
    t0 = time.perf_counter()
    ref = hf_variants.reference(model, prompts, n_tokens)
    variants: dict[str, Any] = {}
    on_gpu = str(model.device).startswith("cuda")
    name, static = hf_variants.static_cache(model, prompts, ref, graph=graph and on_gpu)
    variants[name] = static
    if not on_gpu:
        variants["hf-eager-uncached"] = hf_variants.forced_single(model, prompts, ref)
    if len(prompts) > 1:
        variants[f"hf-eager-batch{len(prompts)}"] = hf_variants.forced_batch(model, prompts, ref)
    var = tuple((name, tuple(forced(r[0], r[1], v[0], v[1]) for r, v in zip(ref, runs, strict=True)))
                for name, runs in variants.items())
    k = variant_envelope([f for _, fs in var for f in fs])
    return Envelope(tuple(tuple(int(i) for i in p) for p in prompts), tuple(ref), var, k, time.perf_counter() - t0)


def judge(envelope: Envelope, candidate: Candidate) -> NearTieVerdict:
    """Criterion (2) for one candidate: teacher-forced over the reference's tokens, judged with k = the envelope."""
    cand = []
    for p, (tokens, logits) in zip(envelope.prompts, envelope.reference, strict=True):
        argmax, cl = candidate(list(p), list(tokens))
        cand.append(forced(tokens, logits, argmax, cl, envelope.k))
    return NearTieVerdict(envelope.k, envelope.variants, tuple(cand))


def reference_vm_candidate(vm) -> Candidate:
    """A ReferenceVM as a criterion (2) candidate: reset, then every step of prompt + tokens[:-1] through its
    lowered schedules (parity.teacher_force)."""
    from mosaic_amk.parity import teacher_force

    def run(prompt, tokens):
        vm.reset()
        return teacher_force(vm.step, prompt, tokens)

    return run


def verdict_json(v: NearTieVerdict) -> dict:
    """The per-candidate record (the envelope's variants are recorded once, in the run's envelope entry)."""
    decisive = [{"prompt": i, "position": d.position, "ref_token": d.ref_token, "other_token": d.other_token,
                 "gap_ulps": d.gap_ulps} for i, f in enumerate(v.candidate) for d in f.disagreements if not d.near_tie]
    return {"criterion": "bf16-near-tie", "ok": v.ok, "envelope_ulps": v.envelope_ulps, "positions": v.positions,
            "disagreements": v.disagreements, "near_ties": v.near_ties, "decisive": v.decisive,
            "decisive_at": decisive[:20], "max_abs_error": max((f.max_abs_error for f in v.candidate), default=0.0)}


def verdict_line(v: NearTieVerdict) -> str:
    return (f"criterion (2): {v.positions} positions, {v.disagreements} disagreements, {v.near_ties} near-ties "
            f"(<= {v.envelope_ulps} ulps), {v.decisive} decisive: {'PASS' if v.ok else 'FAIL'}")
