"""Teacher-forced perplexity of a text, by transformers (HF eager float32, CPU) and by the ReferenceVM.

The text is tokenised with the checkpoint's own tokenizer (``mosaic_amk.text``); with ids ``t_0 .. t_n``
the score is ``exp(mean_i -log softmax(logits_i)[t_{i+1}])`` over the ``n`` predictions, one sequence,
no window. Both sides use the same float64 log-softmax of their float32 logits (``token_nll``), so the
comparison sees only the difference of the logits: HF computes them in one forward pass over the
whole sequence; the ReferenceVM runs the decode-step schedule once per position (lowered per position,
not kept, so memory stays flat over a long text), feeding the text's own tokens.

Criterion (3) (docs/amk.md): on the shipped public-domain passage (``PASSAGE``, 1,145 tokens for
SmolLM2-135M), ``|ppl_vm - ppl_hf| / ppl_hf <= PPL_RTOL`` in float32.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

import attrs
import numpy as np
from mosaic.errors import BadInput

PPL_RTOL = 1e-4  # criterion (3): float32 VM perplexity equal to HF eager float32 within this, relative
PASSAGE = "public-domain-passage.txt"  # in mosaic_amk/data/: Gettysburg Address + the Declaration's opening


def passage_path() -> Path:
    return Path(str(resources.files("mosaic_amk").joinpath("data", PASSAGE)))


def read_text(path: str | Path) -> str:
    """The text of ``path`` (UTF-8), less a leading header of lines that start with ``#``."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read the text: {exc}", str(p)) from None
    lines = raw.splitlines(keepends=True)
    k = 0
    while k < len(lines) and lines[k].startswith("#"):
        k += 1
    text = "".join(lines[k:])
    if not text.strip():
        raise BadInput("the text is empty", str(p))
    return text


def token_ids(model_dir: str | Path, text: str) -> list[int]:
    from mosaic_amk.text import encode, load_tokenizer

    ids = encode(load_tokenizer(model_dir, hint="perplexity scores text: the checkpoint needs its tokenizer"),
                 text)
    if len(ids) < 2:
        raise BadInput(f"the text is {len(ids)} token(s): perplexity needs at least 2")
    return ids


def token_nll(logits: np.ndarray, target: int) -> float:
    """-log softmax(logits)[target], in float64 from float32 logits."""
    x = np.asarray(logits, np.float32).astype(np.float64)
    m = float(np.max(x))
    return float(m + math.log(float(np.sum(np.exp(x - m)))) - x[int(target)])


@attrs.frozen
class Perplexity:
    source: str  # "hf-eager-float32" | "reference-vm-float32"
    tokens: int  # tokens in the text (predictions scored: tokens - 1)
    nll: tuple  # per prediction, float64
    seconds: float

    @property
    def mean_nll(self) -> float:
        return float(np.mean(self.nll))

    @property
    def ppl(self) -> float:
        return math.exp(self.mean_nll)

    def to_json(self) -> dict:
        return {"source": self.source, "tokens": self.tokens, "predictions": len(self.nll), "ppl": self.ppl,
                "mean_nll": self.mean_nll, "seconds": round(self.seconds, 3)}


def hf_perplexity(model_dir: str | Path, ids: Sequence[int]) -> Perplexity:
    """transformers eager float32 on CPU, one forward over the whole sequence."""
    import torch

    from mosaic_amk.importer import load_hf

    t0 = time.perf_counter()
    model, _ = load_hf(model_dir, eager=True)
    with torch.no_grad():
        logits = model(torch.tensor([list(ids)], dtype=torch.long)).logits[0].float().numpy()
    nll = tuple(token_nll(logits[i], ids[i + 1]) for i in range(len(ids) - 1))
    return Perplexity("hf-eager-float32", len(ids), nll, time.perf_counter() - t0)


def vm_perplexity(spec, ids: Sequence[int], config=None, gpu=None,
                  progress: Callable[[int, int], None] | None = None) -> Perplexity:
    """The ReferenceVM fed the text's tokens one position at a time (its KV cache carries the history)."""
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.lowering import lower
    from mosaic_amk.reference_vm import ReferenceVM

    if gpu is None:  # a library default (CPU-only): `mosaic amk perplexity` passes the --gpu record
        from mosaic.gpus import DEFAULT_GPU
        from mosaic.plugins import host

        gpu = host().get("gpus", DEFAULT_GPU)
    config = config or ScheduleConfig()
    bad = [t for t in ids if not 0 <= int(t) < spec.vocab_size]
    if bad:
        raise BadInput(f"token id {bad[0]} outside the vocabulary (0 .. {spec.vocab_size - 1})")
    t0 = time.perf_counter()
    vm = ReferenceVM(spec, config, gpu)
    vm.reset()
    nll = []
    for pos in range(len(ids) - 1):
        step = vm.run(lower(spec, config, gpu, pos), int(ids[pos]))  # lowered per position, not kept
        nll.append(token_nll(step.logits, ids[pos + 1]))
        if progress:
            progress(pos + 1, len(ids) - 1)
    return Perplexity("reference-vm-float32", len(ids), tuple(nll), time.perf_counter() - t0)


# the position ranges PerplexityCheck.nll_diff_by_range reports: the CUDA attention stages up to 159 cached tokens (SmolLM2-135M,
# CUDA_DEFAULT), then reads the cache from global memory
NLL_RANGES = (159, 512)


@attrs.frozen
class PerplexityCheck:
    vm: Perplexity
    hf: Perplexity
    rtol: float = PPL_RTOL

    @property
    def rel_diff(self) -> float:
        return abs(self.vm.ppl - self.hf.ppl) / self.hf.ppl

    @property
    def max_nll_diff(self) -> float:
        return float(np.max(np.abs(np.asarray(self.vm.nll) - np.asarray(self.hf.nll))))

    @property
    def ok(self) -> bool:
        return self.rel_diff <= self.rtol

    def nll_diff_by_range(self, bounds: Sequence[int] = NLL_RANGES) -> list[dict]:
        """|NLL_vm - NLL_hf| per range of predicting positions [lo, hi) (``bounds`` cut them; the last range runs to
        the end): where along the text the two part (e.g. past the CUDA attention's staged length)."""
        d = np.abs(np.asarray(self.vm.nll) - np.asarray(self.hf.nll))
        cuts = sorted({0, *(int(b) for b in bounds if 0 < int(b) < len(d)), len(d)})
        return [{"positions": [lo, hi], "max": float(d[lo:hi].max()), "mean": float(d[lo:hi].mean()),
                 "argmax": lo + int(d[lo:hi].argmax())} for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]

    def to_json(self) -> dict:
        return {"ok": self.ok, "rtol": self.rtol, "rel_diff": self.rel_diff, "max_nll_diff": self.max_nll_diff,
                "nll_diff_by_range": self.nll_diff_by_range(), "vm": self.vm.to_json(), "hf": self.hf.to_json()}
