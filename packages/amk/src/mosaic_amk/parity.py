"""Parity against transformers: HF's own eager greedy generation in float32 on CPU, compared token by
token and logit by logit with the ReferenceVM's greedy decode of the same checkpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    model, _ = load_hf(path, eager=True)
    return hf_greedy_with(model, prompt, n_tokens)


def hf_greedy_with(model, prompt: Sequence[int], n_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """``hf_greedy`` with a model already loaded (any dtype/device: logits come back as float32 numpy)."""
    import torch

    gen = model.generation_config
    gen.eos_token_id = None
    gen.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.tensor([list(prompt)], dtype=torch.long, device=model.device),
                             max_new_tokens=n_tokens,
                             min_new_tokens=n_tokens, do_sample=False, num_beams=1, output_logits=True,
                             return_dict_in_generate=True, generation_config=gen)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, [step[0].float().cpu().numpy() for step in out.logits]


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


# ------------------------------------------------------------------------------------------------------------
# Where and why two bf16 greedy decoders differ: ulps, near-ties, teacher forcing.
#
# Logits are compared as bf16 values (a float32 array is first rounded to bf16, round to nearest even, as
# torch's ``.to(torch.bfloat16)``). Distances are counted in bf16 steps: ``bf16_key`` maps every bf16 value
# to an integer that grows by one from each representable value to the next (+0 and -0 share 0), so
# ``key(a) - key(b)`` is the number of bf16 ulps from b to a, exact across binades. A top-2 margin of 0 is an
# exact tie in bf16 (argmax takes the first index, as ``torch.argmax`` does).
#
# A disagreement at a position where the reference's logit of its own token exceeds the other decoder's
# choice by at most ``k`` ulps is a *near-tie*: the other decoder's logits are within a few ulps of the
# reference's everywhere (different float32 summation order, then bf16 rounding at every layer), and a few
# ulps of error in the difference of two logits is enough to swap them. A larger gap is *decisive*: the
# measured logit error does not explain it. ``k`` is a fixed, stated threshold (DEFAULT_NEAR_TIE_ULPS);
# every comparison also records the measured error in the difference of the reference's top two logits
# (``pair_error_ulps``) over all positions, so a run shows whether ``k`` covers the error it measured.

DEFAULT_NEAR_TIE_ULPS = 4


def _bf16_bits(a) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint32 holding 16 bits), round to nearest even; NaN refused."""
    x = np.ascontiguousarray(np.asarray(a, np.float32))
    if np.isnan(x).any():
        raise ValueError("bf16: NaN logits")
    u = x.view(np.uint32)
    # no uint32 overflow for non-NaN input: the largest pattern, -inf 0xFF800000, plus 0x8000 fits
    t = u >> np.uint32(16)
    t &= np.uint32(1)
    t += np.uint32(0x7FFF)
    t += u
    t >>= np.uint32(16)
    return t


def _key_of_bits(bits: np.ndarray) -> np.ndarray:
    b = bits.astype(np.int32)
    mag = b & 0x7FFF
    return np.where(b & 0x8000, -mag, mag)


def _float_of_bits(bits: np.ndarray) -> np.ndarray:
    return (bits << np.uint32(16)).view(np.float32)


def bf16_key(a) -> np.ndarray:
    """Ordered integer keys of the bf16 values of ``a`` (float32 rounded to nearest even bf16 first):
    consecutive bf16 values have consecutive keys; +0 and -0 are both 0. NaN is refused."""
    return _key_of_bits(_bf16_bits(a)).reshape(np.shape(a))


def to_bf16(a) -> np.ndarray:
    """float32 values rounded to bf16 (nearest even) and back to float32 (NaN refused)."""
    return _float_of_bits(_bf16_bits(a)).reshape(np.shape(a))


def ulps_between(a, b) -> np.ndarray:
    """Signed distance ``a - b`` in bf16 ulps (elementwise)."""
    return bf16_key(a) - bf16_key(b)


def top2(logits: np.ndarray) -> tuple[int, int]:
    """Indices of the largest and second-largest bf16 logit (ties: the first index, as torch.argmax)."""
    x = to_bf16(logits).astype(np.float64)
    i1 = int(np.argmax(x))
    x[i1] = -np.inf
    return i1, int(np.argmax(x))


def first_argmax(logits: np.ndarray) -> int:
    return int(np.argmax(to_bf16(logits)))


@attrs.frozen
class Disagreement:
    """One position where the other decoder's argmax differs from the reference's token."""

    position: int  # generated-token index
    ref_token: int
    other_token: int
    margin_ulps: int  # reference's top-1 minus top-2 logit, bf16 ulps
    gap_ulps: int | None  # reference's logit of its token minus its logit of the other's token, bf16 ulps
    gap: float | None  # the same in logit units (None: the other token is outside the vocabulary)
    near_tie: bool  # gap_ulps <= k

    def to_json(self) -> dict:
        return attrs.asdict(self)


def disagreement(position: int, ref_logits: np.ndarray, ref_token: int, other_token: int,
                 k: int = DEFAULT_NEAR_TIE_ULPS) -> Disagreement:
    ref = to_bf16(ref_logits)
    i1, i2 = top2(ref)
    margin = int(ulps_between(ref[i1], ref[i2]))
    if not 0 <= int(other_token) < ref.size:
        return Disagreement(int(position), int(ref_token), int(other_token), margin, None, None, False)
    gap_ulps = int(ulps_between(ref[ref_token], ref[other_token]))
    return Disagreement(int(position), int(ref_token), int(other_token), margin, gap_ulps,
                        float(ref[ref_token] - ref[other_token]), gap_ulps <= k)


@attrs.frozen
class FreeRun:
    """Free-running greedy decoding of one prompt by two decoders: each feeds back its own tokens."""

    n_tokens: int
    first_mismatch: int | None
    at_mismatch: Disagreement | None  # margins at the first mismatch (the reference's logits there)
    max_logit_error: float | None  # max |other - ref| over the logits up to and including the first mismatch

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None

    def to_json(self) -> dict:
        return {"ok": self.ok, "n_tokens": self.n_tokens, "first_mismatch": self.first_mismatch,
                "at_mismatch": self.at_mismatch.to_json() if self.at_mismatch else None,
                "max_logit_error": self.max_logit_error}


def free_run(ref_tokens: Sequence[int], ref_logits: Sequence[np.ndarray], other_tokens: Sequence[int],
             other_logits: Sequence[np.ndarray] | None = None, k: int = DEFAULT_NEAR_TIE_ULPS) -> FreeRun:
    """Compare two free-running generations of one prompt (the reference's logits give the margins)."""
    if len(ref_tokens) != len(other_tokens):
        raise ValueError(f"free_run: {len(ref_tokens)} reference tokens vs {len(other_tokens)} other tokens")
    first = next((i for i, (a, b) in enumerate(zip(ref_tokens, other_tokens, strict=True)) if a != b), None)
    at = None if first is None else disagreement(first, ref_logits[first], ref_tokens[first], other_tokens[first], k)
    err = None
    if other_logits is not None and len(other_logits):
        upto = len(ref_tokens) if first is None else first + 1
        err = max(float(np.max(np.abs(to_bf16(o) - to_bf16(r))))
                  for o, r in zip(other_logits[:upto], ref_logits[:upto], strict=True))
    return FreeRun(len(ref_tokens), first, at, err)


@attrs.frozen
class Forced:
    """Teacher forcing of one prompt: the other decoder reads the reference's own sequence (prompt + the
    reference's greedy tokens), so every generated position is compared on the same history."""

    positions: int
    disagreements: tuple  # of Disagreement
    max_abs_error: float  # max |other - ref| over every position's whole logit vector
    bit_equal_fraction: float  # fraction of logit elements equal in bf16
    top2_max_ulps: int  # max |other - ref| in bf16 ulps at the reference's top-2 tokens (not over the vocab:
    # logits near 0 have tiny ulps, so that maximum is large for any two implementations)
    pair_error_ulps: tuple  # per position |(ref[t1] - ref[t2]) - (other[t1] - other[t2])| in ulps (t1, t2: ref top-2)
    argmax_inconsistent: int  # positions where the other's argmax is not the first argmax of its own logits

    @property
    def near_ties(self) -> int:
        return sum(d.near_tie for d in self.disagreements)

    @property
    def decisive(self) -> int:
        return sum(not d.near_tie for d in self.disagreements)

    def to_json(self) -> dict:
        return {"positions": self.positions, "disagreements": [d.to_json() for d in self.disagreements],
                "near_ties": self.near_ties, "decisive": self.decisive, "max_abs_error": self.max_abs_error,
                "bit_equal_fraction": self.bit_equal_fraction, "top2_max_ulps": self.top2_max_ulps,
                "pair_error_ulps": list(self.pair_error_ulps), "argmax_inconsistent": self.argmax_inconsistent}


def forced(ref_tokens: Sequence[int], ref_logits: Sequence[np.ndarray], other_argmax: Sequence[int],
           other_logits: Sequence[np.ndarray], k: int = DEFAULT_NEAR_TIE_ULPS) -> Forced:
    """Compare the other decoder's teacher-forced argmax and logits with the reference's, position by
    position (``other_*[i]``: the step that read the reference's sequence up to generated token i - 1)."""
    n = len(ref_tokens)
    if not (len(ref_logits) == len(other_argmax) == len(other_logits) == n):
        raise ValueError(f"forced: lengths differ (tokens {n}, ref logits {len(ref_logits)}, other argmax "
                         f"{len(other_argmax)}, other logits {len(other_logits)})")
    if n == 0:
        return Forced(0, (), 0.0, 1.0, 0, (), 0)
    rb = _bf16_bits(np.stack([np.asarray(x, np.float32) for x in ref_logits]))  # [n, vocab]
    ob = _bf16_bits(np.stack([np.asarray(x, np.float32) for x in other_logits]))
    if rb.shape != ob.shape:
        raise ValueError(f"forced: logits shapes differ: {rb.shape} vs {ob.shape}")
    equal = int(np.count_nonzero(rb == ob))
    r, o = _float_of_bits(rb), _float_of_bits(ob)
    max_abs = float(np.max(np.abs(o - r)))
    rows = np.arange(n)
    t1 = np.argmax(r, axis=1)
    saved = r[rows, t1].copy()
    r[rows, t1] = -np.inf
    t2 = np.argmax(r, axis=1)
    r[rows, t1] = saved
    d1 = _key_of_bits(ob[rows, t1]) - _key_of_bits(rb[rows, t1])  # ulps at the reference's top two
    d2 = _key_of_bits(ob[rows, t2]) - _key_of_bits(rb[rows, t2])
    pair = np.abs(d2 - d1)
    other = np.asarray(other_argmax, np.int64)
    inconsistent = int(np.count_nonzero(other != np.argmax(o, axis=1)))
    dis = tuple(disagreement(i, r[i], int(ref_tokens[i]), int(other[i]), k)
                for i in np.flatnonzero(other != np.asarray(ref_tokens, np.int64)))
    top2_ulps = int(max(np.max(np.abs(d1)), np.max(np.abs(d2))))
    return Forced(n, dis, max_abs, equal / rb.size, top2_ulps, tuple(int(p) for p in pair), inconsistent)


def forced_steps(prompt_len: int, n_tokens: int) -> list[tuple[int, int | None]]:
    """The steps of teacher forcing ``n_tokens`` positions after a prompt of ``prompt_len`` tokens, over
    ``seq = prompt + forced[:n_tokens - 1]``: step k reads ``seq[k]`` at position k; from k = prompt_len - 1
    on it yields the logits of generated token ``k - (prompt_len - 1)`` (None: a prefill step)."""
    if prompt_len < 1 or n_tokens < 1:
        raise ValueError("forced_steps: the prompt and the generation need at least one token each")
    return [(k, k - (prompt_len - 1) if k >= prompt_len - 1 else None) for k in range(prompt_len + n_tokens - 1)]


def teacher_force(step, prompt: Sequence[int], tokens: Sequence[int]) -> tuple[list[int], list[np.ndarray]]:
    """Run ``step(token, position) -> (argmax, logits)`` (e.g. ``ReferenceVM.step``, after its reset) over
    ``prompt + tokens[:-1]``; returns the argmax and logits at each of the ``len(tokens)`` generated positions."""
    seq = list(prompt) + list(tokens[:-1])
    argmax, logits = [], []
    for k, gen in forced_steps(len(prompt), len(tokens)):
        res = step(int(seq[k]), k)
        tok, lg = (res.token, res.logits) if hasattr(res, "token") else res
        if gen is not None:
            argmax.append(int(tok))
            logits.append(np.array(lg, np.float32, copy=True))
    return argmax, logits


def quantiles(values: Sequence[int]) -> dict:
    """p50 / p99 / max of a list of integers (None when empty)."""
    if not len(values):
        return {"n": 0, "p50": None, "p99": None, "max": None}
    v = np.asarray(values, np.float64)
    return {"n": int(v.size), "p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
            "max": int(v.max())}


@attrs.frozen
class ContenderParity:
    """One decoder against the reference over all prompts of one shape: free-running and teacher-forced."""

    name: str
    free: tuple = ()  # FreeRun per prompt
    forced: tuple = ()  # Forced per prompt (empty: not run)
    k: int = DEFAULT_NEAR_TIE_ULPS
    errors: tuple = ()  # "stage: message" for parts that failed (the rest is still reported)

    def summary(self) -> dict:
        s: dict = {"name": self.name, "k_ulps": self.k, "errors": list(self.errors)}
        if self.free:
            mism = [f for f in self.free if not f.ok]
            s["free"] = {"prompts": len(self.free), "exact": len(self.free) - len(mism),
                         "first_mismatch": [f.first_mismatch for f in self.free],
                         "gap_ulps_at_first_mismatch": [f.at_mismatch.gap_ulps for f in mism],
                         "margin_ulps_at_first_mismatch": [f.at_mismatch.margin_ulps for f in mism],
                         "first_mismatch_near_ties": sum(f.at_mismatch.near_tie for f in mism),
                         "first_mismatch_decisive": sum(not f.at_mismatch.near_tie for f in mism)}
        if self.forced:
            pair = [p for f in self.forced for p in f.pair_error_ulps]
            gaps = [d.gap_ulps for f in self.forced for d in f.disagreements if d.gap_ulps is not None]
            s["forced"] = {"prompts": len(self.forced), "positions": sum(f.positions for f in self.forced),
                           "disagreements": sum(len(f.disagreements) for f in self.forced),
                           "near_ties": sum(f.near_ties for f in self.forced),
                           "decisive": sum(f.decisive for f in self.forced),
                           "gap_ulps_of_disagreements": quantiles(gaps),
                           "max_abs_error": max(f.max_abs_error for f in self.forced),
                           "top2_max_ulps": max(f.top2_max_ulps for f in self.forced),
                           "bit_equal_fraction": float(np.mean([f.bit_equal_fraction for f in self.forced])),
                           "pair_error_ulps": quantiles(pair),
                           "pair_error_within_k": (sum(p <= self.k for p in pair) / len(pair)) if pair else None,
                           "argmax_inconsistent": sum(f.argmax_inconsistent for f in self.forced)}
        return s

    def to_json(self) -> dict:
        return {**self.summary(), "free_per_prompt": [f.to_json() for f in self.free],
                "forced_per_prompt": [f.to_json() for f in self.forced]}


@attrs.frozen
class ShapeParity:
    """Every decoder against one reference for one model shape (issue 8: the CUDA VM and HF's own variants
    against HF eager bf16 greedy, batch 1)."""

    shape: str
    reference: str
    prompts: int
    tokens: int
    prompt_len: int
    k: int
    contenders: tuple  # ContenderParity
    notes: tuple = ()
    errors: tuple = ()
    seconds: dict = attrs.field(factory=dict)

    def to_json(self) -> dict:
        return {"shape": self.shape, "reference": self.reference, "prompts": self.prompts, "tokens": self.tokens,
                "prompt_len": self.prompt_len, "k_ulps": self.k, "notes": list(self.notes),
                "errors": list(self.errors), "seconds": dict(self.seconds),
                "contenders": {c.name: c.to_json() for c in self.contenders}}


def _gaps(s: dict) -> str:
    free = s.get("free")
    if not free or not free["gap_ulps_at_first_mismatch"]:
        return "-"
    return ",".join("?" if g is None else str(g) for g in free["gap_ulps_at_first_mismatch"])


def format_table(shapes: Sequence[ShapeParity]) -> str:
    """One line per (shape, decoder): free-running exact prompts and the reference's gap (bf16 ulps) at each
    first mismatch; teacher-forced disagreements split into near-ties (gap <= k) and DECISIVE; bf16 bit-equal
    logits; the error in the reference's top-2 difference (p99 / max ulps) and the share within k."""
    head = (f"{'shape':<15} {'decoder':<22} {'free':>5}  {'gap@1st mismatch (ulps)':<24} {'TF pos':>6} "
            f"{'near':>5} {'DECISIVE':>8} {'bit-eq':>7} {'pair p99/max':>12} {'<=k':>6} {'argmax!':>7}")
    lines = [head, "-" * len(head)]
    for sp in shapes:
        for c in sp.contenders:
            s = c.summary()
            free = s.get("free")
            fx = f"{free['exact']}/{free['prompts']}" if free else "-"
            tf = s.get("forced")
            if tf:
                pe = tf["pair_error_ulps"]
                pair = f"{pe['p99']:.0f}/{pe['max']}" if pe["n"] else "-"
                within = f"{tf['pair_error_within_k']:.3f}" if tf["pair_error_within_k"] is not None else "-"
                cols = (f"{tf['positions']:>6} {tf['near_ties']:>5} {tf['decisive']:>8} "
                        f"{tf['bit_equal_fraction']:>7.4f} {pair:>12} {within:>6} {tf['argmax_inconsistent']:>7}")
            else:
                cols = f"{'-':>6} {'-':>5} {'-':>8} {'-':>7} {'-':>12} {'-':>6} {'-':>7}"
            gaps = _gaps(s)
            lines.append(f"{sp.shape:<15} {c.name:<22} {fx:>5}  {gaps[:24]:<24} {cols}"
                         + (f"  ERR: {'; '.join(c.errors)[:80]}" if c.errors else ""))
        for e in sp.errors:
            lines.append(f"{sp.shape:<15} ERROR {e[:120]}")
    lines.append(f"k = {shapes[0].k if shapes else DEFAULT_NEAR_TIE_ULPS} bf16 ulps; gap = reference logit of its "
                 "token minus of the other's token; DECISIVE must be 0 for a correct VM")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# The parity criterion, decided before the runs (docs/amk.md "The parity criterion"), on a real checkpoint:
# (1) float32: the VM's float32 greedy tokens equal HF eager float32's for the 8 PARITY_PROMPTS x 64 tokens;
# (2) bf16: teacher-forced over HF eager bf16's own greedy tokens, every argmax disagreement of the VM is a
#     near-tie within the envelope measured between HF's own bf16 variants in the same run (near_tie_criterion),
#     zero decisive disagreements;
# (3) teacher-forced perplexity equal to HF's within 1e-4 relative in float32 (mosaic_amk.perplexity).

PARITY_PROMPTS = (  # fixed: real English and code, encoded with the checkpoint's tokenizer (no chat template)
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colors are",
    "Water boils at 100 degrees Celsius because",
    "import numpy as np\n\n# multiply two matrices\n",
    "Here is a short list of tips for a healthy breakfast:\n1.",
    "The theory of relativity, proposed by Albert Einstein,",
)
PARITY_TOKENS = 64


@attrs.frozen
class PromptParity:
    prompt: str
    prompt_ids: tuple
    result: ParityResult

    @property
    def matched(self) -> int:
        """Generated tokens equal to HF's before the first mismatch."""
        r = self.result
        return len(r.hf_tokens) if r.first_mismatch is None else r.first_mismatch

    def to_json(self) -> dict:
        return {"prompt": self.prompt, "prompt_ids": list(self.prompt_ids), "matched": self.matched,
                **self.result.to_json()}


@attrs.frozen
class Float32Parity:
    """Criterion (1): every prompt's free-running greedy tokens equal, all ``n_tokens`` of them."""

    rows: tuple  # PromptParity
    n_tokens: int
    seconds: dict = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.result.ok for r in self.rows)

    def table(self) -> str:
        lines = [f"{'#':>2} {'prompt ids':>10} {'matched':>9} {'first mismatch':>14} {'max |logit err|':>15}  prompt"]
        for i, r in enumerate(self.rows):
            fm = "-" if r.result.first_mismatch is None else str(r.result.first_mismatch)
            lines.append(f"{i:>2} {len(r.prompt_ids):>10} {r.matched:>4}/{self.n_tokens:<4} {fm:>14} "
                         f"{r.result.max_logit_error:>15.3g}  {r.prompt[:40]!r}")
        ok = sum(r.result.ok for r in self.rows)
        lines.append(f"criterion (1) float32: {ok}/{len(self.rows)} prompts x {self.n_tokens} tokens equal to HF "
                     f"eager float32: {'PASS' if self.ok else 'FAIL'}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"criterion": "float32-greedy", "ok": self.ok, "n_tokens": self.n_tokens,
                "prompts": [r.to_json() for r in self.rows], "seconds": dict(self.seconds)}


def float32_parity(model_dir: str | Path, prompts: Sequence[str] = PARITY_PROMPTS, n_tokens: int = PARITY_TOKENS,
                   config=None, gpu=None, vm_generate=None) -> Float32Parity:
    """Criterion (1) on the CPU: the ReferenceVM (or ``vm_generate(ids, n) -> (tokens, logits)``) against HF
    eager float32 greedy ``generate``, prompt by prompt (one VM, its schedules shared between prompts)."""
    import time

    from mosaic_amk.text import encode, load_tokenizer

    tokenizer = load_tokenizer(model_dir, hint="the parity prompts are text")
    t0 = time.perf_counter()
    if vm_generate is None:
        from mosaic_amk.importer import import_checkpoint
        from mosaic_amk.reference_vm import ReferenceVM

        vm = ReferenceVM(import_checkpoint(model_dir), config, gpu)
        vm_generate = vm.generate
    model, _ = load_hf(model_dir, eager=True)
    t_load = time.perf_counter() - t0
    rows, t_vm, t_hf = [], 0.0, 0.0
    for text in prompts:
        ids = encode(tokenizer, text)
        t = time.perf_counter()
        tokens, logits = vm_generate(ids, n_tokens)
        t_vm += time.perf_counter() - t
        t = time.perf_counter()
        hf = hf_greedy_with(model, ids, n_tokens)
        t_hf += time.perf_counter() - t
        rows.append(PromptParity(text, tuple(ids), compare(tokens, logits, *hf)))
    return Float32Parity(tuple(rows), n_tokens, {"load": round(t_load, 2), "vm": round(t_vm, 2),
                                                 "hf": round(t_hf, 2)})


def variant_envelope(runs: Sequence[Forced]) -> int:
    """The envelope of HF's own bf16 variants against the reference, in bf16 ulps: the largest error any
    variant made in the difference of the reference's top-two logits, or in the gap of any token pair it
    flipped (0 when the variants are bit-identical to the reference)."""
    pair = [p for f in runs for p in f.pair_error_ulps]
    gaps = [d.gap_ulps for f in runs for d in f.disagreements if d.gap_ulps is not None]
    return int(max([0, *pair, *gaps]))


@attrs.frozen
class NearTieVerdict:
    """Criterion (2) for one decoder: its teacher-forced disagreements with the reference, judged against
    the envelope of HF's own variants."""

    envelope_ulps: int
    variants: tuple  # (name, tuple of Forced per prompt) of each HF variant against the reference
    candidate: tuple  # Forced per prompt, judged with k = envelope_ulps

    @property
    def positions(self) -> int:
        return sum(f.positions for f in self.candidate)

    @property
    def disagreements(self) -> int:
        return sum(len(f.disagreements) for f in self.candidate)

    @property
    def near_ties(self) -> int:
        return sum(f.near_ties for f in self.candidate)

    @property
    def decisive(self) -> int:
        return sum(f.decisive for f in self.candidate)

    @property
    def ok(self) -> bool:
        return self.decisive == 0

    def line(self) -> str:
        var = ", ".join(f"{n}: {sum(len(f.disagreements) for f in fs)} flips" for n, fs in self.variants)
        return (f"criterion (2) bf16: {self.positions} teacher-forced positions, {self.disagreements} argmax "
                f"disagreements, {self.near_ties} near-ties (<= {self.envelope_ulps} ulps, the envelope of {var}), "
                f"{self.decisive} decisive: {'PASS' if self.ok else 'FAIL'}")

    def to_json(self) -> dict:
        return {"criterion": "bf16-near-tie", "ok": self.ok, "envelope_ulps": self.envelope_ulps,
                "positions": self.positions, "disagreements": self.disagreements, "near_ties": self.near_ties,
                "decisive": self.decisive, "variants": {n: [f.to_json() for f in fs] for n, fs in self.variants},
                "candidate": [f.to_json() for f in self.candidate]}


def near_tie_criterion(reference: Sequence[tuple], variants: Mapping[str, Sequence[tuple]],
                       candidate: Sequence[tuple]) -> NearTieVerdict:
    """Criterion (2). ``reference``: per prompt (greedy tokens, logits) of HF eager bf16; ``variants``: per HF
    variant name, per prompt (argmax, logits) teacher-forced over the reference's tokens (e.g. batch > 1,
    static cache + CUDA graph); ``candidate``: the same for the decoder under test. A candidate disagreement
    is a near-tie when the reference's logit of its token exceeds its logit of the candidate's choice by at
    most the envelope (``variant_envelope``); anything else (or a token outside the vocabulary) is decisive."""
    if not variants:
        raise ValueError("near_tie_criterion: the envelope needs at least one HF variant")
    n = len(reference)
    if len(candidate) != n or any(len(v) != n for v in variants.values()):
        raise ValueError("near_tie_criterion: every decoder needs one run per reference prompt")
    var = tuple((name, tuple(forced(r[0], r[1], v[0], v[1]) for r, v in zip(reference, runs, strict=True)))
                for name, runs in variants.items())
    k = variant_envelope([f for _, fs in var for f in fs])
    cand = tuple(forced(r[0], r[1], c[0], c[1], k) for r, c in zip(reference, candidate, strict=True))
    return NearTieVerdict(k, var, cand)
