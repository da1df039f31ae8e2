"""CudaVM: greedy generation with the persistent megakernel, one launch per decode step.

``CudaVM(model, config, gpu, weights=...)`` lowers the decode step, gates it through the validator
(refused unless ``unsafe``), encodes it once (position is a launch argument), binds the weights by
pointer and keeps the KV cache on the device between launches. Prefill runs the decode-step schedule
once per prompt token, as the ReferenceVM does. The token of step k feeds step k+1 on the device (no
host round trip between launches): step k reads ``seq[k]`` and, from the last prompt position on,
writes its argmax to ``seq[k + 1]``.

Position coverage: the schedule is lowered and validated at position 0 and at the last position a
generation reaches; both must have the same ``structure_key`` (everything but the position parameter
and the KV-slot/attention ranges), which is what lets one encoding serve every step. Positions in
between are not lowered one by one (docs/amk-cuda.md says why that is sound for this lowering and what
it assumes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
from mosaic.errors import BadInput
from mosaic.records import GpuTarget

from mosaic_amk.config import ScheduleConfig
from mosaic_amk.cuda import encode as E
from mosaic_amk.cuda.build import build as build_vm
from mosaic_amk.cuda.build import config_defines
from mosaic_amk.cuda.launcher import Launcher, gate, staged_tokens
from mosaic_amk.lowering import LOGITS, kv_capacity, lower
from mosaic_amk.model import ModelSpec


def cuda_config(config: ScheduleConfig, max_positions: int) -> ScheduleConfig:
    """The config with a KV capacity the VM can hold: kv_max_tokens = max_positions rounded up to a page
    when the config leaves it at 0 (the model's max_position_embeddings, e.g. 131072, would not fit the
    attention micro-kernel's score buffer)."""
    if config.kv_max_tokens:
        return config
    page = config.kv_page_tokens
    return attrs.evolve(config, kv_max_tokens=-(-max_positions // page) * page)


def staged_rope_order(model: ModelSpec, config: ScheduleConfig) -> tuple[ScheduleConfig, str | None]:
    """(``config``, None), or (it with ``rope_order`` standard, why) when it is blocked and the VM would not stage
    every attention: no ``attention_stage``, a task's heads spanning KV groups, or a KV capacity (kv_max_tokens, set)
    beyond what the staging holds in ``smem_bytes`` (launcher.staged_tokens). The VM reads blocked K rows only
    staged; the two orders give the same bits, so only the speed of the q/k/v stage changes."""
    if config.rope_order != "blocked":
        return config, None
    rep = model.num_heads // model.num_kv_heads
    heads = config.attention_q_heads_per_task or rep * config.attention_kv_heads_per_task
    if not config.attention_stage:
        why = "attention_stage is off"
    elif heads > rep:
        why = f"an attention task holds {heads} query heads, more than one KV group ({rep})"
    else:
        most = staged_tokens(model.head_dim, heads, config.threads_per_block, config.smem_bytes)
        cap = kv_capacity(model, config)
        if cap <= most:
            return config, None
        why = f"the KV capacity ({cap} tokens) is more than the attention's staging holds ({most})"
    return attrs.evolve(config, rope_order="standard"), (
        f"rope_order blocked -> standard: {why}; the same tokens and logits, a slower q/k/v stage")


SHORT_K = 1024  # kernels/gemv_rows.cuh: a GEMV row of at most SHORT_CH = 128 chunks of 8 takes the short-row paths


def short_rows_defines(model: ModelSpec) -> tuple[str, ...]:
    """AMK_SHORT_ROWS=0 when no GEMV of the model has rows of at most SHORT_K (hidden size, attention width,
    intermediate size): the short-row paths would never run, and their code costs about 1% on the Llama-3.2-1B shape
    (H200: 0.971 vs 0.961 ms/token, interleaved; the same bits either way)."""
    ks = (model.hidden_size, model.q_dim, model.intermediate_size)
    return () if min(ks) <= SHORT_K else ("AMK_SHORT_ROWS=0",)


def quant_defines(model: ModelSpec) -> tuple[str, ...]:
    """AMK_QUANT=1 when the model holds a quantized weight (quant.QuantizedTensor: int8, Q8_0, Q4_1): the build with
    the quantized GEMV and embedding paths. The bf16 build leaves them out (their registers made the
    AMK_WEIGHT_PRELOAD=8 + AMK_ATT_STAGE=1 build spill 20 bytes)."""
    from mosaic_amk.quant import QuantizedTensor

    return ("AMK_QUANT=1",) if any(isinstance(w, QuantizedTensor) for w in model.weights.values()) else ()


@attrs.define
class CudaVM:
    model: ModelSpec
    config: ScheduleConfig
    gpu: GpuTarget
    weights: Mapping[str, Any] | None = None
    mode: str = "hf-bf16"
    unsafe: bool = False
    timeout_s: float = 1.0
    max_positions: int = 1024
    trace: bool = False  # build with AMK_TRACE and keep the last step's per-task timestamps (bench/trace.py)
    extra_defines: tuple = ()  # more build defines (build.py's allowed list; e.g. AMK_SHORT_ROWS=0 in the GPU tests)
    launcher: Launcher | None = None
    enc: E.Encoded | None = None
    validations: dict = attrs.field(factory=dict)  # position -> ValidationResult
    build_info: Any = None
    note: str | None = None  # why the config run differs from the one asked for (staged_rope_order), or None
    capacity: int = attrs.field(default=0, init=False)
    _seq: Any = attrs.field(default=None, init=False)
    _dummy: Any = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.config, self.note = staged_rope_order(self.model, cuda_config(self.config, self.max_positions))
        self.capacity = kv_capacity(self.model, self.config)
        s0 = lower(self.model, self.config, self.gpu, 0)
        self.validations[0] = gate(s0, self.unsafe)
        self.enc = E.encode(s0, prefetch_max_bytes=self.config.prefetch_max_bytes)
        # weight_preload / weight_stream are build variants of the VM (AMK_WEIGHT_PRELOAD, AMK_WSTREAM): 0 builds
        # the default cubin; the stream's ring comes on top of smem_bytes
        defines = config_defines(self.config) + (("AMK_TRACE=1",) if self.trace else ()) + short_rows_defines(self.model)
        defines += quant_defines(self.model)
        defines += tuple(self.extra_defines)
        self.build_info = build_vm(self.config.threads_per_block, defines=defines)
        self.launcher = Launcher(self.enc, str(self.build_info.cubin), threads=self.config.threads_per_block,
                                 smem_bytes=self.config.smem_bytes, ring_bytes=self.config.ring_bytes(),
                                 mode=self.mode, timeout_s=self.timeout_s,
                                 prefetch_depth=self.config.prefetch_depth, wait_mode=self.config.wait_mode,
                                 signal_mode=self.config.signal_mode, prefetch_mode=self.config.prefetch_mode,
                                 trace=self.trace)
        self.launcher.bind(self.weights if self.weights is not None else self.model.weights)
        self._seq = None
        self._dummy = self.launcher.cp.zeros(4, self.launcher.cp.int32)

    # ----------------------------------------------------------------------------------- positions
    def cover(self, last_position: int) -> None:
        """Lower and gate the schedule at ``last_position``; its structure must equal position 0's."""
        if last_position >= self.capacity:
            raise BadInput(f"position {last_position} outside the KV cache (capacity {self.capacity}; raise "
                           "kv_max_tokens)")
        if last_position in self.validations:
            return
        s = lower(self.model, self.config, self.gpu, last_position)
        self.validations[last_position] = gate(s, self.unsafe)
        if E.structure_key(s) != self.enc.structure_key:
            raise E.EncodeError(f"the schedule at position {last_position} differs from position 0 beyond the "
                                "position parameter (e.g. sm_policy least_loaded places attention by context "
                                "length); the CUDA VM needs a position-invariant structure (round_robin)")

    # ----------------------------------------------------------------------------------- generation
    def _steps(self, prompt: Sequence[int], n_tokens: int):
        cp = self.launcher.cp
        if not prompt:
            raise BadInput("the prompt needs at least one token")
        bad = [t for t in prompt if not 0 <= int(t) < self.model.vocab_size]
        if bad:
            raise BadInput(f"token ids outside the vocabulary (0 .. {self.model.vocab_size - 1}): {bad[:5]}")
        n = len(prompt)
        self.cover(n + n_tokens - 2 if n_tokens > 0 else n - 1)
        seq = cp.zeros(n + n_tokens + 1, cp.int32)
        seq[:n] = cp.asarray(np.asarray(prompt, np.int32))
        self._seq = seq
        base = seq.data.ptr
        for k in range(n + n_tokens - 1):
            out = base + 4 * (k + 1) if k >= n - 1 else self._dummy.data.ptr
            yield k, base + 4 * k, out

    def generate(self, prompt: Sequence[int], n_tokens: int, *, logits: bool = True, steps_per_launch: int = 1
                 ) -> tuple[list[int], list[np.ndarray]]:
        """Greedy decode ``n_tokens`` tokens after ``prompt``; returns them and (if ``logits``) the logits
        each was chosen from (float32 numpy arrays). Without logits, the generation steps run
        ``steps_per_launch`` at a time in one launch (the prompt steps one per launch)."""
        cp, lz = self.launcher.cp, self.launcher
        n = len(prompt)
        lz.reset_kv()
        lz.clear_abort()
        hist = cp.empty((n_tokens, self.model.vocab_size), cp.float32) if logits else None
        steps = list(self._steps(prompt, n_tokens))
        k = 0
        while k < len(steps):
            _, tin, tout = steps[k]
            m = 1 if (logits or k < n - 1) else max(1, min(steps_per_launch, len(steps) - k))
            lz.launch(position=k, token_in=tin, token_out=tout, n_steps=m, token_stride=4)
            if logits and k >= n - 1:
                hist[k - (n - 1)] = lz.array(LOGITS)
            k += m
        lz.check()
        tokens = [int(t) for t in cp.asnumpy(self._seq[n:n + n_tokens])]
        return tokens, ([row for row in cp.asnumpy(hist)] if logits else [])

    def forced(self, prompt: Sequence[int], tokens: Sequence[int]) -> tuple[list[int], list[np.ndarray]]:
        """Teacher forcing: the same launches as :meth:`generate` (one step per launch), but every step reads
        ``prompt + tokens[:-1]`` (``tokens``: another decoder's ``n`` tokens) and writes its argmax to its own
        slot instead of feeding it back. Returns the VM's argmax and logits at each of the ``n`` generated
        positions (``parity.forced_steps`` is the step plan)."""
        from mosaic_amk.parity import forced_steps

        cp, lz = self.launcher.cp, self.launcher
        n, m = len(prompt), len(tokens)
        if m < 1:
            raise BadInput("teacher forcing needs at least one token")
        full = list(prompt) + list(tokens[:-1])
        steps = list(self._steps(full, 1))  # validates the ids, covers the last position, uploads seq
        plan = forced_steps(n, m)
        assert len(steps) == len(plan), (len(steps), len(plan))
        lz.reset_kv()
        lz.clear_abort()
        hist = cp.empty((m, self.model.vocab_size), cp.float32)
        outs = cp.full(m, -1, cp.int32)
        for (k, tin, _), (pos, gen) in zip(steps, plan, strict=True):
            assert k == pos
            tout = outs.data.ptr + 4 * gen if gen is not None else self._dummy.data.ptr
            lz.launch(position=k, token_in=tin, token_out=tout, n_steps=1, token_stride=4)
            if gen is not None:
                hist[gen] = lz.array(LOGITS)
        lz.check()
        return [int(t) for t in cp.asnumpy(outs)], [row for row in cp.asnumpy(hist)]

    def time_decode(self, n_steps: int = 64, *, warmup: int = 4, skip_ops: int = 0,
                    prefetch_depth: int | None = None, prompt_token: int = 1, steps_per_launch: int = 0) -> float:
        """Milliseconds per decode step, CUDA events around ``n_steps`` decode steps at positions
        ``warmup .. warmup + n_steps - 1`` (each step's token feeds the next on the device), run
        ``steps_per_launch`` steps per launch (0: all in one launch; 1: one launch per step)."""
        cp, lz = self.launcher.cp, self.launcher
        lz.reset_kv()
        lz.clear_abort()
        steps = list(self._steps([prompt_token], warmup + n_steps))
        per = n_steps if steps_per_launch <= 0 else steps_per_launch
        kw = dict(skip_ops=skip_ops, prefetch_depth=prefetch_depth, token_stride=4)
        if warmup:
            k, tin, tout = steps[0]
            lz.launch(position=k, token_in=tin, token_out=tout, n_steps=warmup, **kw)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for i in range(warmup, warmup + n_steps, per):
            k, tin, tout = steps[i]
            lz.launch(position=k, token_in=tin, token_out=tout, n_steps=min(per, warmup + n_steps - i), **kw)
        stop.record()
        stop.synchronize()
        lz.check()
        return cp.cuda.get_elapsed_time(start, stop) / n_steps


def weights_from_torch(model, spec: ModelSpec) -> dict[str, Any]:
    """The VM's weight arrays straight from a transformers model on the GPU (no copy): every state-dict
    tensor of the ModelSpec by name, plus ``rope.inv_freq`` (float32, from the ModelSpec, which took it
    from the model)."""
    from mosaic_amk.model import INV_FREQ

    state = dict(model.state_dict())
    out: dict[str, Any] = {}
    for name in spec.weights:
        if name == INV_FREQ:
            out[name] = spec.weights[name]
            continue
        t = state.get(name)
        if t is None:
            raise BadInput(f"the model has no tensor {name}")
        out[name] = t.detach().contiguous()
    return out
