"""Import a HuggingFace Llama-family checkpoint directory (config.json + safetensors) into a ModelSpec.

The checkpoint is loaded through transformers itself (``local_files_only``, ``use_safetensors``, no
remote code, no pickle), so the weights the ReferenceVM runs are exactly the ones HF eager runs. Support
is a rule table: every rule that finds something this importer does not implement adds a line, and
the import fails listing all of them. Nothing is accepted that would then disagree with eager: every
tensor of the loaded state dict must be consumed, none may be missing or re-initialised, and the RoPE
inverse frequencies HF computed are checked against this module's own computation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from mosaic import limits
from mosaic.errors import BadInput

from mosaic_amk.model import INV_FREQ, ModelSpec

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModel(BadInput):
    """A well-formed checkpoint whose architecture uses something this importer does not implement."""

    def __init__(self, path: str, reasons: list[str]):
        self.reasons = list(reasons)
        super().__init__("unsupported model: " + "; ".join(self.reasons), path)


# ----------------------------------------------------------------------------------- support rule table

def _rope_params(cfg: Mapping[str, Any]) -> dict:
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rp = dict(rp) if isinstance(rp, Mapping) else {}
    if "type" in rp and "rope_type" not in rp:
        rp["rope_type"] = rp["type"]
    rp.setdefault("rope_type", "default")
    rp.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    return rp


def _r_model_type(cfg):
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        return f"model_type {mt!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
    return None


def _r_activation(cfg):
    act = cfg.get("hidden_act", "silu")
    return None if act == "silu" else f"hidden_act {act!r} (only silu: SwiGLU MLP)"


def _r_rope(cfg):
    rp = _rope_params(cfg)
    if rp["rope_type"] not in SUPPORTED_ROPE_TYPES:
        return f"rope_type {rp['rope_type']!r} (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
    prf = rp.get("partial_rotary_factor", 1.0)
    if not _number(prf) or float(prf) != 1.0:
        return f"partial_rotary_factor {prf!r} (only full rotary embeddings: 1.0)"
    return None


QUANT_SUPPORTED = ("int8 weight-only (compressed-tensors int-quantized: 8-bit symmetric int, strategy channel, "
                   "no activation quantization) or a .gguf file's own Q8_0 / Q4_1 blocks")


def _r_quantized(cfg):
    q = cfg.get("quantization_config")
    if not q:
        return None
    from mosaic_amk.int8_checkpoint import int8_config_problem

    method = q.get("quant_method", "?") if isinstance(q, Mapping) else q
    method = getattr(method, "value", method)  # transformers' QuantizationMethod enum
    if method == "gguf":  # transformers' record of a GGUF file it loaded (gguf_weights.import_gguf reads its blocks)
        return None
    problem = int8_config_problem(q) if method == "compressed-tensors" else "not an accepted method"
    return None if problem is None else f"quantization_config {method!r}: {problem} (supported: {QUANT_SUPPORTED})"


def _r_layer_types(cfg):
    types = cfg.get("layer_types") or ()
    if not isinstance(types, list | tuple):
        return f"layer_types {types!r} (must be a list of full_attention / sliding_attention)"
    bad = sorted({repr(k) if not isinstance(k, str) else k for k in types} - {"full_attention", "sliding_attention"})
    return None if not bad else f"layer_types {bad} (only full_attention and sliding_attention)"


def _r_tp(cfg):
    tp = cfg.get("pretraining_tp", 1)
    return None if tp in (1, None) else f"pretraining_tp {tp} (only 1)"


def _r_gqa(cfg):
    nh, nkv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    if isinstance(nh, int) and isinstance(nkv, int) and nkv and nh % nkv:
        return f"num_attention_heads {nh} not a multiple of num_key_value_heads {nkv}"
    return None


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _r_finite(cfg):
    """Every number of the config (top level and rope parameters) finite: a NaN rms_norm_eps imports silently
    otherwise and every logit is NaN."""
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    items = [*cfg.items(), *((f"rope_scaling.{k}", v) for k, v in (rp.items() if isinstance(rp, Mapping) else ()))]
    bad = [f"{k} {v!r}" for k, v in items if isinstance(v, float) and not math.isfinite(v)]
    return None if not bad else f"{', '.join(bad)} (must be finite numbers)"


SUPPORT_RULES: tuple[tuple[str, Callable[[Mapping[str, Any]], str | None]], ...] = (
    ("model-type", _r_model_type), ("activation", _r_activation), ("rope", _r_rope),
    ("quantized", _r_quantized), ("layer-types", _r_layer_types), ("pretraining-tp", _r_tp), ("gqa", _r_gqa),
    ("finite", _r_finite),
)


def unsupported_reasons(cfg: Mapping[str, Any]) -> list[str]:
    """Every reason the config cannot be imported (empty when it is supported); a rule that meets a value of
    the wrong type reports it as its reason instead of raising."""
    out = []
    for name, rule in SUPPORT_RULES:
        try:
            r = rule(cfg)
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
            r = f"{name}: a config value of the wrong type ({type(exc).__name__}: {str(exc)[:120]})"
        if r:
            out.append(r)
    return out


# ------------------------------------------------------------------------------------------------ rope

def reference_inv_freq(head_dim: int, rope: Mapping[str, Any]) -> np.ndarray:
    """RoPE inverse frequencies computed independently of transformers (float64, rounded to float32)."""
    base = float(rope["rope_theta"])
    inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    kind = rope["rope_type"]
    if kind == "linear":
        inv = inv / float(rope["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old = float(rope["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


# ---------------------------------------------------------------------------------------------- import

def _read_config(root: Path) -> dict:
    if not root.is_dir():
        raise BadInput("not a checkpoint directory", str(root))
    path = root / "config.json"
    if not path.is_file():
        raise BadInput("checkpoint has no config.json", str(root))
    where = str(path)
    data = limits.read_bytes(path, "json_bytes", where)  # a regular file of bounded size
    digits = limits.limit("int_digits")

    def bounded_int(text: str) -> int:
        if len(text.lstrip("-")) > digits:
            raise limits.refuse("int_digits", len(text.lstrip("-")), where)
        return int(text)

    try:  # NaN/Infinity parse (as transformers reads them) and are refused by the `finite` support rule
        cfg = json.loads(data.decode("utf-8"), parse_int=bounded_int)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"config.json is not valid JSON: {exc}", where) from None
    except RecursionError:
        raise BadInput("config.json is not valid JSON: nested too deeply", where) from None
    limits.check_tree(cfg, where)
    if not isinstance(cfg, dict):
        raise BadInput("config.json is not a JSON object", str(path))
    return cfg


def _check_files(root: Path) -> None:
    if not list(root.glob("*.safetensors")):
        pickled = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        extra = f"; found {', '.join(pickled)} (pickle checkpoints are never loaded)" if pickled else ""
        raise BadInput("checkpoint has no *.safetensors weights" + extra, str(root))


def _windows(cfg: Mapping[str, Any], n_layers: int) -> tuple[int, ...]:
    """Per-layer attention window as HF applies it (0 = full): Mistral windows every layer when
    sliding_window is set; Qwen2 windows the layers whose layer_types entry is sliding_attention."""
    sw = cfg.get("sliding_window")
    if cfg.get("model_type") == "mistral":
        return tuple([int(sw) if sw else 0] * n_layers)
    types = cfg.get("layer_types") or ["full_attention"] * n_layers
    return tuple(int(sw) if (t == "sliding_attention" and sw) else 0 for t in types)


def load_hf(path: str | Path, *, eager: bool = True):
    """Load the checkpoint with transformers (float32, CPU, eager attention, safetensors only).
    Returns (model, loading_info). Raises BadInput with one line on any failure."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    root = Path(path)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(root), dtype=torch.float32, local_files_only=True, use_safetensors=True,
            trust_remote_code=False, attn_implementation="eager" if eager else None, output_loading_info=True,
            ignore_mismatched_sizes=True)  # reported below from loading_info, naming the tensors
    except Exception as exc:  # transformers raises many types for broken files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInput(f"transformers could not load the checkpoint: {first[:300]}", str(root)) from None
    model.eval()
    return model, info


def import_checkpoint(path: str | Path) -> ModelSpec:
    """Read a checkpoint directory (or a ``.gguf`` file: its Q8_0 / Q4_1 blocks kept, gguf_weights.py; or a directory
    of int8 weight-only tensors, int8_checkpoint.py) into a ModelSpec, or raise UnsupportedModel / BadInput."""
    root = Path(path)
    if root.suffix == ".gguf" and root.is_file():  # the GGUF's Q8_0 / Q4_1 blocks read natively
        from mosaic_amk.gguf_weights import import_gguf

        return import_gguf(root)
    cfg = _read_config(root)
    reasons = unsupported_reasons(cfg)
    if reasons:
        raise UnsupportedModel(str(root), reasons)
    q = cfg.get("quantization_config")
    if q:
        method = q.get("quant_method") if isinstance(q, Mapping) else q
        if method == "gguf":
            raise BadInput("config.json records a GGUF file: pass the .gguf file itself as the model", str(root))
        from mosaic_amk.int8_checkpoint import import_int8

        return import_int8(root, cfg)
    _check_files(root)
    model, info = load_hf(root)
    return spec_from_hf(model, info, str(root))


def spec_from_hf(model, info: Mapping[str, Any] | None = None, where: str = "<model>") -> ModelSpec:
    """Build a ModelSpec from a loaded transformers model, checking that every tensor is accounted for."""
    c = model.config
    cfg = c.to_dict()
    reasons = unsupported_reasons(cfg)
    if reasons:
        raise UnsupportedModel(where, reasons)
    tied = bool(getattr(c, "tie_word_embeddings", False))
    problems = []
    if info:
        missing = [k for k in info.get("missing_keys", ()) if not (tied and k == "lm_head.weight")]
        if missing:
            problems.append(f"checkpoint lacks {len(missing)} tensor(s), e.g. {sorted(missing)[0]}")
        if info.get("unexpected_keys"):
            problems.append(f"checkpoint has {len(info['unexpected_keys'])} tensor(s) the model does not use, "
                            f"e.g. {sorted(info['unexpected_keys'])[0]}")
        if info.get("mismatched_keys"):
            problems.append(f"checkpoint has {len(info['mismatched_keys'])} tensor(s) of the wrong shape, "
                            f"e.g. {sorted(map(str, info['mismatched_keys']))[0]}")
    if problems:
        raise BadInput("bad checkpoint: " + "; ".join(problems), where)

    state = {k: v.detach().to("cpu").float().numpy().copy() for k, v in model.state_dict().items()}
    if tied:
        state.pop("lm_head.weight", None)
    n_layers = int(c.num_hidden_layers)
    nh = int(c.num_attention_heads)
    head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // nh)
    family = cfg["model_type"]
    has = lambda name: name in state  # noqa: E731
    qkv_bias = has("model.layers.0.self_attn.q_proj.bias")
    rope = _rope_params(cfg)
    rotary = model.model.rotary_emb
    hf_inv = rotary.inv_freq.detach().float().numpy().copy()
    ours = reference_inv_freq(head_dim, rope)
    if hf_inv.shape != ours.shape or not np.allclose(hf_inv, ours, rtol=1e-5, atol=0):
        raise UnsupportedModel(where, [f"rope {rope['rope_type']!r}: transformers' inverse frequencies differ "
                                       f"from this importer's (max rel err "
                                       f"{float(np.max(np.abs(hf_inv - ours) / np.abs(ours))):.3g})"])
    state[INV_FREQ] = hf_inv.astype(np.float32)
    spec = ModelSpec(
        family=family, vocab_size=int(c.vocab_size), hidden_size=int(c.hidden_size),
        intermediate_size=int(c.intermediate_size), num_layers=n_layers, num_heads=nh,
        num_kv_heads=int(getattr(c, "num_key_value_heads", None) or nh), head_dim=head_dim,
        rms_norm_eps=float(c.rms_norm_eps), max_position_embeddings=int(c.max_position_embeddings),
        tie_word_embeddings=tied, rope_type=rope["rope_type"],
        attention_scaling=float(getattr(rotary, "attention_scaling", 1.0)),
        qkv_bias=qkv_bias, o_bias=has("model.layers.0.self_attn.o_proj.bias"),
        mlp_bias=has("model.layers.0.mlp.gate_proj.bias"), layer_windows=_windows(cfg, n_layers), weights=state)
    problems = spec.check_weights()
    if problems:
        # a tensor the model holds that this ModelSpec would not run: accepting it would disagree with eager
        raise UnsupportedModel(where, problems[:8] + ([f"... {len(problems) - 8} more"] if len(problems) > 8 else []))
    return spec
