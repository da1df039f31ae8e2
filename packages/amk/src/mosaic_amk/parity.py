"""Parity against transformers: HF's own eager greedy generation in float32 on CPU, compared token by
token and logit by logit with the ReferenceVM's greedy decode of the same checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from mosaic_amk.importer import load_hf


@attrs.frozen
class ParityResult:
    vm_tokens: tuple
    hf_tokens: tuple
    max_logit_error: float  # max |vm - hf| over every generated step's logits
    first_mismatch: int | None  # index of the first differing generated token, None when identical

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None

    def to_json(self) -> dict:
        return {"ok": self.ok, "vm_tokens": list(self.vm_tokens), "hf_tokens": list(self.hf_tokens),
                "max_logit_error": self.max_logit_error, "first_mismatch": self.first_mismatch}


def hf_greedy(path: str | Path, prompt: Sequence[int], n_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """transformers' eager greedy ``generate`` in float32 on CPU: exactly ``n_tokens`` new tokens (no EOS
    stop), with the raw logits each token was chosen from."""
    import torch

    model, _ = load_hf(path, eager=True)
    gen = model.generation_config
    gen.eos_token_id = None
    gen.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.tensor([list(prompt)], dtype=torch.long), max_new_tokens=n_tokens,
                             min_new_tokens=n_tokens, do_sample=False, num_beams=1, output_logits=True,
                             return_dict_in_generate=True, generation_config=gen)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, [step[0].float().numpy() for step in out.logits]


def compare(vm_tokens: Sequence[int], vm_logits: Sequence[np.ndarray], hf_tokens: Sequence[int],
            hf_logits: Sequence[np.ndarray]) -> ParityResult:
    first = next((i for i, (a, b) in enumerate(zip(vm_tokens, hf_tokens, strict=False)) if a != b), None)
    if first is None and len(vm_tokens) != len(hf_tokens):
        first = min(len(vm_tokens), len(hf_tokens))
    # after a mismatch the two runs condition on different histories: compare logits up to it only
    upto = len(vm_logits) if first is None else first + 1
    pairs = list(zip(vm_logits, hf_logits, strict=False))[:upto]
    err = max((float(np.max(np.abs(a - b))) for a, b in pairs), default=0.0)
    return ParityResult(tuple(vm_tokens), tuple(hf_tokens), err, first)
