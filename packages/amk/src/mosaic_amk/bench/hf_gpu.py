"""transformers on the GPU in bf16: the reference the CUDA VM is held to, and the baselines it races.

- :func:`load_bf16` loads a checkpoint directory (safetensors, eager attention) onto the GPU in bf16;
  :func:`random_model` builds a seeded random-init model of a named shape directly on the GPU (the same
  recipe as ``tiny_models.make_checkpoint``: HF init, then norms ``1 + 0.2 * randn``, biases ``0.5 * randn``).
- :func:`greedy` is transformers' own ``generate`` (greedy, exactly n tokens, raw logits);
  :func:`eager_forced` runs the same eager decode with the tokens forced (teacher forcing);
  :func:`attention` switches a loaded model between eager and SDPA attention (the parity controls).
- :func:`time_eager` times HF eager decode steps (model forward with a DynamicCache, one token a step);
  :func:`time_static_graph` captures one decode step with a StaticCache in a CUDA graph and replays it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from mosaic.errors import BadInput

# Real model dimensions (random weights). SmolLM2-135M's entry is tiny_models.SMOLLM2_135M.
SHAPES: dict[str, tuple[str, dict]] = {
    "smollm2-135m": ("LlamaConfig", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=100000.0), initializer_range=0.041666666666666664)),
    "smollm2-360m": ("LlamaConfig", dict(
        vocab_size=49152, hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
        num_key_value_heads=5, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=100000.0), initializer_range=0.02)),
    "tinyllama-1.1b": ("LlamaConfig", dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
        num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0), initializer_range=0.02)),
    "llama-3.2-1b": ("LlamaConfig", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=True, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=8192), initializer_range=0.02)),
}


def _quiet():
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def random_model(shape: str, seed: int = 0, **overrides):
    """A seeded random-init model of ``shape`` (a SHAPES key), built on the GPU in bf16, eager attention."""
    import torch
    import transformers

    _quiet()
    if shape not in SHAPES:
        raise BadInput(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    cls_name, kwargs = SHAPES[shape]
    cfg = getattr(transformers, cls_name)(**{**kwargs, **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                              attn_implementation="eager")
    with torch.no_grad():
        gen = torch.Generator(device="cuda").manual_seed(seed + 1)
        for pname, p in model.named_parameters():
            if pname.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen, device="cuda") * 0.5)
            elif "norm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen, device="cuda"))
    return model.eval()


def load_bf16(path: str | Path):
    """A checkpoint directory on the GPU in bf16 with eager attention (safetensors only, no remote code)."""
    import torch
    from transformers import AutoModelForCausalLM

    _quiet()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, local_files_only=True,
                                                     use_safetensors=True, trust_remote_code=False,
                                                     attn_implementation="eager")
    except Exception as exc:  # transformers raises many types for broken files
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BadInput(f"transformers could not load the checkpoint: {first[:300]}", str(path)) from None
    return model.to("cuda").eval()


def spec_of(model):
    """The ModelSpec of a loaded model (the importer's own checks: support rules, every tensor used)."""
    from mosaic_amk.importer import spec_from_hf

    # spec_from_hf reads rotary_emb.inv_freq with .numpy(): lend it the rotary module on the CPU
    rotary = model.model.rotary_emb
    device = rotary.inv_freq.device
    rotary.to("cpu")
    try:
        return spec_from_hf(model, None, getattr(model.config, "_name_or_path", "") or "<gpu model>")
    finally:
        rotary.to(device)


def greedy(model, prompts: Sequence[Sequence[int]], n_tokens: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """transformers' greedy ``generate`` in bf16 on the GPU, all prompts in one batch (they must have one
    length: no padding, so every row's attention mask is the batch-1 mask). Returns per prompt the
    ``n_tokens`` new tokens and a float32 array [n_tokens, vocab] of the logits they were chosen from."""
    import torch

    lens = {len(p) for p in prompts}
    if len(lens) != 1:
        raise BadInput("greedy(): the prompts of one batch must have one length")
    gen = model.generation_config
    gen.eos_token_id = None
    gen.pad_token_id = 0
    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=next(model.parameters()).device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_tokens,
                             min_new_tokens=n_tokens, do_sample=False, num_beams=1, output_logits=True,
                             return_dict_in_generate=True, generation_config=gen)
    n = ids.shape[1]
    tokens = out.sequences[:, n:].tolist()
    logits = torch.stack(out.logits, dim=1).float().cpu().numpy()  # [batch, steps, vocab]
    return tokens, [logits[b] for b in range(len(prompts))]


def eager_forced(model, prompts: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]]
                 ) -> tuple[list[list[int]], list[np.ndarray]]:
    """Teacher forcing with transformers' eager decode, all prompts in one batch (one length): the prompt in
    one forward (only the last position's logits, as ``generate`` computes them), then ``tokens[b][i]`` fed
    at step i + 1 with a DynamicCache, the attention mask grown by one each step, as ``generate`` does.
    Returns per prompt the argmax and the float32 logits [len(tokens[b]), vocab] at each generated
    position. With ``tokens`` = the model's own greedy tokens this is ``generate``'s own computation."""
    import torch
    from transformers import DynamicCache

    if len({len(p) for p in prompts}) != 1 or len({len(t) for t in tokens}) != 1 or len(prompts) != len(tokens):
        raise BadInput("eager_forced(): one prompt length, one token count, one token list per prompt")
    dev = next(model.parameters()).device
    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=dev)
    forced = torch.tensor([list(t) for t in tokens], dtype=torch.long, device=dev)
    n_tokens = forced.shape[1]
    cache = DynamicCache(config=model.config)
    mask = torch.ones_like(ids)
    steps = []
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1]
        steps.append(logits.float())
        for i in range(n_tokens - 1):
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits = model(input_ids=forced[:, i:i + 1], attention_mask=mask, past_key_values=cache,
                           use_cache=True, logits_to_keep=1).logits[:, -1]
            steps.append(logits.float())
        hist = torch.stack(steps, dim=1)  # [batch, steps, vocab]
        argmax = hist.argmax(-1).tolist()
    arr = hist.cpu().numpy()
    return argmax, [arr[b] for b in range(len(prompts))]


def attention(model, impl: str) -> None:
    """Switch a loaded model's attention implementation ("eager" or "sdpa") in place."""
    model.set_attn_implementation(impl)
    model.config._attn_implementation = impl


def time_eager(model, n_steps: int = 32, warmup: int = 4, prompt_token: int = 1) -> float:
    """ms per decode step of HF eager (forward of one token with a DynamicCache), CUDA events around
    ``n_steps`` steps after ``warmup``; the next token is the argmax, kept on the GPU."""
    import torch
    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        tok = torch.tensor([[prompt_token]], device="cuda")
        for _ in range(warmup):
            tok = model(input_ids=tok, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n_steps):
            tok = model(input_ids=tok, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        stop.record()
        stop.synchronize()
    return start.elapsed_time(stop) / n_steps


class StaticGraphDecoder:
    """One decode step of HF (StaticCache, eager attention) captured in a CUDA graph.

    transformers 5.x builds the eager attention mask with ``torch.tensor(0.0, device=...)`` (a host-to-device
    copy, which CUDA graph capture refuses) and its StaticCache layers keep their write position in a device
    tensor (``cumulative_length``) rather than reading ``cache_position``. So the step passes its own 4-D
    additive mask, built on the device from the device position tensor (``0`` for cached slots ``<= pos``,
    the dtype's minimum elsewhere: HF's own mask for one query at ``pos``), which transformers uses as-is,
    and :meth:`reset` rewinds both the position and every layer's ``cumulative_length``. ``graph=False``
    runs the same step without capture (the CPU tests check its tokens against ``generate``)."""

    def __init__(self, model, max_cache_len: int = 512, *, graph: bool = True):
        import torch
        from transformers import StaticCache

        if getattr(model.config, "sliding_window", None) and getattr(model.config, "use_sliding_window", True):
            raise BadInput("the static-cache CUDA-graph baseline builds a full-attention mask; this model has a "
                           "sliding window")
        self.model = model
        param = next(model.parameters())
        dev, dtype = param.device, param.dtype
        self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        self.tok = torch.ones((1, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((1,), dtype=torch.long, device=dev)
        self.kv_index = torch.arange(max_cache_len, device=dev)
        self.mask_zero = torch.zeros((), dtype=dtype, device=dev)
        self.mask_min = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=dev)
        self.max_cache_len = max_cache_len
        self.graph = None
        self.out = None
        with torch.no_grad():
            for _ in range(3):  # warm up outside capture (lazy cache allocation, cuBLAS handles)
                self.out = self._step()
            self.reset()
            if graph:
                torch.cuda.synchronize()
                self.graph = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s), torch.cuda.graph(self.graph, stream=s):
                    self.out = self._step()
                torch.cuda.current_stream().wait_stream(s)
                self.reset()  # the capture itself advanced nothing, but be explicit

    def reset(self) -> None:
        """Rewind to position 0 (the cache contents are overwritten as the positions are reached again)."""
        self.pos.zero_()
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.zero_()

    def _step(self):
        import torch

        m = torch.where(self.kv_index <= self.pos, self.mask_zero, self.mask_min)[None, None, None, :]
        logits = self.model(input_ids=self.tok, position_ids=self.pos[None], attention_mask=m,
                            past_key_values=self.cache, use_cache=True).logits
        tok = logits[:, -1].argmax(-1)
        self.tok.copy_(tok[:, None])  # feed the argmax back (inside the graph: no extra kernel per step)
        self.pos.add_(1)
        return logits[:, -1]

    def _advance(self) -> None:
        import torch

        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.no_grad():
                self.out = self._step()

    def decode(self, prompt: Sequence[int], n_tokens: int, forced: Sequence[int] | None = None
               ) -> tuple[list[int], np.ndarray]:
        """Greedy decode from position 0: the prompt fed one token per step (a decode-step prefill, as the
        CUDA VM does), then ``n_tokens`` tokens, each step's argmax fed back inside the step; with
        ``forced`` (the reference's ``n_tokens`` tokens) the steps read those instead (teacher forcing).
        Returns the argmax and the float32 logits [n_tokens, vocab] at each generated position."""
        import torch

        from mosaic_amk.parity import forced_steps

        n = len(prompt)
        if n + n_tokens - 1 > self.max_cache_len:
            raise ValueError(f"{n + n_tokens - 1} positions exceed the static cache ({self.max_cache_len})")
        if forced is not None and len(forced) != n_tokens:
            raise ValueError(f"decode: {len(forced)} forced tokens for {n_tokens} positions")
        seq = list(prompt) + (list(forced[:-1]) if forced is not None else [])
        self.reset()
        dev = self.tok.device
        hist = torch.empty((n_tokens, self.model.config.vocab_size), dtype=torch.float32, device=dev)
        toks = torch.empty((n_tokens,), dtype=torch.long, device=dev)
        for k, gen in forced_steps(n, n_tokens):
            if k < len(seq):
                self.tok.fill_(int(seq[k]))  # else: the previous step's argmax, already in self.tok
            self._advance()
            if gen is not None:
                hist[gen].copy_(self.out[0])
                toks[gen] = self.tok[0, 0]
        return toks.tolist(), hist.cpu().numpy()

    def run(self, n_steps: int) -> list[int]:
        """Replay (or, without a graph, run) ``n_steps`` steps from the current position; returns the tokens
        the steps produced (synchronises)."""
        out = []
        for _ in range(n_steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                import torch

                with torch.no_grad():
                    self._step()
            out.append(int(self.tok[0, 0]))
        return out

    def time(self, n_steps: int = 64, warmup: int = 4) -> float:
        import torch

        if self.graph is None:
            raise RuntimeError("StaticGraphDecoder.time needs the CUDA graph (graph=True)")
        if warmup + n_steps > self.max_cache_len:
            raise ValueError(f"{warmup + n_steps} steps exceed the static cache ({self.max_cache_len})")
        self.reset()
        self.tok.fill_(1)
        for _ in range(warmup):
            self.graph.replay()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n_steps):
            self.graph.replay()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / n_steps

