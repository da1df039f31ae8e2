"""ModelSpec: the architecture of a Llama-family decoder and its weights as numpy float32 arrays.

A weight may also be a :class:`mosaic_amk.quant.QuantizedTensor` (int8 per row, GGUF Q8_0 / Q4_1 blocks): the
GEMVs and the embedding read it natively (quant.py's arithmetic). Weight names are the checkpoint's own state-dict names (``model.layers.3.self_attn.q_proj.weight``), plus
``rope.inv_freq`` (the RoPE inverse frequencies after any rope scaling, shape ``[head_dim // 2]``). With
tied embeddings there is no ``lm_head.weight``: the LM head reads ``model.embed_tokens.weight``.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from mosaic.fields import fail, one_of, positive

FAMILIES = ("llama", "mistral", "qwen2")
INV_FREQ = "rope.inv_freq"


def _weights(inst, attribute, value) -> None:
    from mosaic_amk.quant import QuantizedTensor

    if not isinstance(value, dict) or not all(
            isinstance(k, str) and ((isinstance(v, np.ndarray) and v.dtype == np.float32)
                                    or isinstance(v, QuantizedTensor)) for k, v in value.items()):
        fail(inst, attribute, "<...>", "a dict of name to float32 numpy array (or quant.QuantizedTensor)")


def _finite_positive(inst, attribute, value) -> None:
    positive(inst, attribute, value)
    if not math.isfinite(value):
        fail(inst, attribute, value, "a finite positive number")


def _finite(inst, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        fail(inst, attribute, value, "a finite number")


@attrs.frozen(eq=False)
class ModelSpec:
    """A decoder-only Llama-family model: RMSNorm, RoPE attention with GQA, SwiGLU MLP."""

    family: str = attrs.field(validator=one_of(*FAMILIES))
    vocab_size: int = attrs.field(validator=positive)
    hidden_size: int = attrs.field(validator=positive)
    intermediate_size: int = attrs.field(validator=positive)
    num_layers: int = attrs.field(validator=positive)
    num_heads: int = attrs.field(validator=positive)
    num_kv_heads: int = attrs.field(validator=positive)
    head_dim: int = attrs.field(validator=positive)
    rms_norm_eps: float = attrs.field(validator=_finite_positive)
    max_position_embeddings: int = attrs.field(validator=positive)
    tie_word_embeddings: bool
    rope_type: str = "default"
    attention_scaling: float = attrs.field(default=1.0, validator=_finite)
    qkv_bias: bool = False  # Qwen2, or Llama attention_bias
    o_bias: bool = False  # Llama attention_bias
    mlp_bias: bool = False  # Llama mlp_bias
    layer_windows: tuple = attrs.field(default=(), converter=tuple)  # per layer: 0 = full attention
    weights: dict = attrs.field(factory=dict, validator=_weights, repr=False)

    @num_kv_heads.validator
    def _gqa(self, attribute, value):
        if self.num_heads % value:
            fail(self, attribute, value, f"a divisor of num_heads ({self.num_heads})")

    @head_dim.validator
    def _hd(self, attribute, value):
        if value % 2:
            fail(self, attribute, value, "even (rotate-half RoPE)")

    @layer_windows.validator
    def _windows(self, attribute, value):
        if value and (len(value) != self.num_layers or not all(isinstance(w, int) and w >= 0 for w in value)):
            fail(self, attribute, value, f"{self.num_layers} non-negative ints (0 = full attention)")

    def window(self, layer: int) -> int:
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def embed_name(self) -> str:
        return "model.embed_tokens.weight"

    @property
    def lm_head_name(self) -> str:
        return self.embed_name if self.tie_word_embeddings else "lm_head.weight"

    def layer(self, i: int, name: str) -> str:
        """State-dict name of a layer tensor, e.g. layer(0, 'self_attn.q_proj.weight')."""
        return f"model.layers.{i}.{name}"

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight this architecture needs, with its shape."""
        h, inter, v = self.hidden_size, self.intermediate_size, self.vocab_size
        shapes: dict[str, tuple[int, ...]] = {self.embed_name: (v, h), "model.norm.weight": (h,),
                                              INV_FREQ: (self.head_dim // 2,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (v, h)
        for i in range(self.num_layers):
            lay = lambda n, i=i: self.layer(i, n)  # noqa: E731
            shapes[lay("input_layernorm.weight")] = (h,)
            shapes[lay("post_attention_layernorm.weight")] = (h,)
            for proj, out in (("q_proj", self.q_dim), ("k_proj", self.kv_dim), ("v_proj", self.kv_dim)):
                shapes[lay(f"self_attn.{proj}.weight")] = (out, h)
                if self.qkv_bias:
                    shapes[lay(f"self_attn.{proj}.bias")] = (out,)
            shapes[lay("self_attn.o_proj.weight")] = (h, self.q_dim)
            if self.o_bias:
                shapes[lay("self_attn.o_proj.bias")] = (h,)
            for proj, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
                shapes[lay(f"mlp.{proj}.weight")] = shape
                if self.mlp_bias:
                    shapes[lay(f"mlp.{proj}.bias")] = shape[:1]
        return shapes

    def check_weights(self) -> list[str]:
        """Problems with ``weights`` against ``expected_shapes`` (missing, extra, wrong shape, NaN or inf)."""
        want = self.expected_shapes()
        problems = [f"missing tensor {n}" for n in want if n not in self.weights]
        problems += [f"unexpected tensor {n}" for n in self.weights if n not in want]
        problems += [f"{n} has shape {list(self.weights[n].shape)}, expected {list(s)}"
                     for n, s in want.items() if n in self.weights and self.weights[n].shape != s]
        problems += [f"{n} holds NaN or inf" for n, w in self.weights.items()
                     if isinstance(w, np.ndarray) and not np.isfinite(w).all()]  # a QuantizedTensor checks its own
        return problems

    def quantized(self) -> dict[str, str]:
        """The quantized weights: name -> format (quant.FORMATS); empty for a float32 model."""
        return {n: w.format for n, w in self.weights.items() if not isinstance(w, np.ndarray)}

    def num_params(self) -> int:
        return sum(int(w.size) for n, w in self.weights.items() if n != INV_FREQ)
