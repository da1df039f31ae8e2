"""Tiny random-init HF checkpoints of every supported family, built with transformers from a config with
seeded weights and saved with save_pretrained (safetensors). No hub access. Used by the tests (fixture
``tiny_checkpoint`` in packages/amk/tests/conftest.py) and by anything that needs real lowerings without
a real checkpoint (the audit): ``make_checkpoint(dir, family)`` or ``tiny_model(family)`` (a ModelSpec,
built once per process in a temp dir).
"""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path

# Each entry: transformers config class name, config kwargs. Dimensions are tiny but keep the features
# that distinguish the family (GQA ratio, tied/untied, head_dim override, rope scaling, bias, window).
_BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, initializer_range=0.2)

TINY_CONFIGS: dict[str, tuple[str, dict]] = {
    # Llama with GQA, untied embeddings and a head_dim override (heads * head_dim != hidden_size)
    "llama": ("LlamaConfig", dict(_BASE, head_dim=24, tie_word_embeddings=False)),
    # Llama 3.x: tied embeddings and llama3 rope scaling (SmolLM2/Llama-3.2 style)
    "llama3": ("LlamaConfig", dict(_BASE, tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))),
    # SmolLM2: Llama architecture, tied embeddings, 3:1 GQA, theta 100000
    "smollm2": ("LlamaConfig", dict(_BASE, num_attention_heads=6, num_key_value_heads=2, hidden_size=96,
                                    tie_word_embeddings=True, rope_parameters=dict(rope_type="default",
                                                                                   rope_theta=100000.0))),
    # TinyLlama: Llama, untied, 8:1 GQA (32 heads / 4 kv heads in the real one)
    "tinyllama": ("LlamaConfig", dict(_BASE, num_attention_heads=8, num_key_value_heads=1,
                                      tie_word_embeddings=False)),
    # Mistral with a sliding window shorter than the test sequences, so the window matters
    "mistral": ("MistralConfig", dict(_BASE, sliding_window=5, head_dim=16, tie_word_embeddings=False)),
    # Qwen2: q/k/v bias (nonzero: see make_checkpoint), tied embeddings
    "qwen2": ("Qwen2Config", dict(_BASE, tie_word_embeddings=True)),
}
TINY_FAMILIES = tuple(TINY_CONFIGS)

# SmolLM2-135M's real dimensions (random weights)
SMOLLM2_135M = ("LlamaConfig", dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
    rope_parameters=dict(rope_type="default", rope_theta=100000.0), initializer_range=0.041))


def make_checkpoint(directory: str | Path, name: str = "llama", seed: int = 0, config: tuple | None = None,
                    dtype: str = "float32", **overrides) -> Path:
    """Build a random-init model of a family (or an explicit (class name, kwargs) config) and save it."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    cls_name, kwargs = config or TINY_CONFIGS[name]
    cfg = getattr(transformers, cls_name)(**{**kwargs, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        for pname, p in model.named_parameters():
            if pname.endswith(".bias"):  # HF inits biases to zero: make them matter
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "norm" in pname:  # and norms to one
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
    out = Path(directory)
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    return out


# int8 weight-only variants (mosaic_amk.int8_checkpoint, the compressed-tensors layout the importer accepts): the
# family's tiny checkpoint, quantized; every projection's in-features must be a multiple of 32 (the overrides)
TINY_INT8: dict[str, tuple[str, dict]] = {"llama-int8": ("llama", dict(intermediate_size=128))}


@cache
def tiny_int8_model(name: str = "llama-int8", seed: int = 0):
    """The ModelSpec of a tiny int8 weight-only checkpoint (``TINY_INT8``: quantized projections)."""
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.int8_checkpoint import quantize

    family, overrides = TINY_INT8[name]
    with tempfile.TemporaryDirectory(prefix=f"amk-tiny-{name}-") as d:
        quantize(make_checkpoint(Path(d) / "f32", family, seed, **overrides), Path(d) / "int8")
        return import_checkpoint(Path(d) / "int8")


@cache
def tiny_model(name: str = "llama", seed: int = 0):
    """The ModelSpec of a tiny checkpoint of family ``name`` (built and imported once per process)."""
    from mosaic_amk.importer import import_checkpoint

    with tempfile.TemporaryDirectory(prefix=f"amk-tiny-{name}-") as d:
        return import_checkpoint(make_checkpoint(d, name, seed))
