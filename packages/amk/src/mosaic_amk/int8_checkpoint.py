"""int8 weight-only checkpoints: read (into a ModelSpec whose projections are quant.QuantizedTensor int8) and write.

The accepted ``quantization_config`` is compressed-tensors' W8A16 layout in its ``int-quantized`` format, the one
llm-compressor saves: ``quant_method "compressed-tensors"``, ``format "int-quantized"``, one config group targeting
``Linear`` whose ``weights`` are ``num_bits 8``, ``type "int"``, ``symmetric true``, ``strategy "channel"``, with no
``input_activations`` / ``output_activations`` (weights only). Each quantized projection ``X.weight`` is stored as
int8 ``[out, in]`` with ``X.weight_scale`` (``[out, 1]`` or ``[out]``, any float dtype; the float32 scale is used);
every other tensor (embeddings, norms, an untied lm_head named in ``ignore``) is a float tensor. Anything else is
refused by the importer's support rule with one line (:func:`int8_config_problem`).

The tensors are read with safetensors directly (transformers would need the compressed-tensors package to load this
format); the config is loaded by transformers (``LlamaConfig`` etc. from config.json, the quantization_config set
aside) and the RoPE frequencies come from transformers' own rope initialisation, checked against the importer's.

``quantize(src, dest)`` writes such a checkpoint from an ordinary one (per-row symmetric int8, quant.quantize_int8),
with ``dequantized(dest2)`` writing the float32 checkpoint HF runs for comparison (scale * q per element).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from mosaic.errors import BadInput

from mosaic_amk.model import INV_FREQ, ModelSpec
from mosaic_amk.quant import QuantizedTensor, quantize_int8

PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")

CONFIG = {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
          "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                        "weights": {"num_bits": 8, "type": "int", "symmetric": True,
                                                    "strategy": "channel", "dynamic": False}}},
          "ignore": ["lm_head"]}


def int8_config_problem(q: Any) -> str | None:
    """Why ``q`` (a config's quantization_config) is not the accepted int8 weight-only layout, or None."""
    if not isinstance(q, Mapping):
        return "not a mapping"
    if q.get("format") != "int-quantized":
        return f"format {q.get('format')!r} (only int-quantized)"
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or len(groups) != 1:
        return "exactly one config group is read"
    g = next(iter(groups.values()))
    if not isinstance(g, Mapping):
        return "the config group is not a mapping"
    w = g.get("weights")
    if not isinstance(w, Mapping):
        return "the group quantizes no weights"
    want = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    bad = [f"{k} {w.get(k)!r}" for k, v in want.items() if w.get(k) != v]
    if bad:
        return f"weights {', '.join(bad)} (only 8-bit symmetric int per channel)"
    if g.get("input_activations") or g.get("output_activations"):
        return "activations are quantized (only weight-only)"
    if w.get("dynamic"):
        return "dynamic weight quantization"
    return None


def _float(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def import_int8(root: Path, cfg: Mapping[str, Any]) -> ModelSpec:
    """A ModelSpec of an int8 weight-only checkpoint directory (module docstring)."""
    from safetensors.numpy import load_file
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mosaic_amk.importer import _check_files, _rope_params, _windows, reference_inv_freq

    _check_files(root)
    state: dict[str, np.ndarray] = {}
    for f in sorted(root.glob("*.safetensors")):
        try:
            state.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own error types for a damaged file
            raise BadInput(f"cannot read {f.name}: {str(exc)[:200]}", str(root)) from None
    plain = {k: v for k, v in cfg.items() if k != "quantization_config"}
    try:
        hf_cfg = AutoConfig.for_model(**plain)
    except Exception as exc:
        raise BadInput(f"transformers could not read config.json: {str(exc)[:200]}", str(root)) from None
    weights: dict[str, Any] = {}
    used = set()
    for name, arr in state.items():
        if name.endswith(".weight_scale") or name in used:
            continue
        base = name[:-len(".weight")] if name.endswith(".weight") else None
        scale = state.get(f"{base}.weight_scale") if base else None
        if arr.dtype == np.int8:
            if scale is None:
                raise BadInput(f"int8 tensor {name} has no {base}.weight_scale", str(root))
            s = _float(scale).reshape(-1)
            if arr.ndim != 2 or s.shape != (arr.shape[0],):
                raise BadInput(f"{name} {list(arr.shape)} with scale {list(np.shape(scale))}: expected a 2-D "
                               "weight and one scale per row", str(root))
            weights[name] = QuantizedTensor("int8", tuple(arr.shape), np.ascontiguousarray(arr), s)
            used.add(f"{base}.weight_scale")
        elif scale is not None:
            raise BadInput(f"{name} is {arr.dtype} with a weight_scale: int8 codes expected", str(root))
        elif arr.dtype.kind == "f":
            weights[name] = _float(arr)
        else:
            raise BadInput(f"tensor {name} is {arr.dtype}: only float tensors and int8 weights", str(root))
    stray = sorted(k for k in state if k.endswith(".weight_scale") and k not in used)
    if stray:
        raise BadInput(f"scale {stray[0]} belongs to no int8 weight", str(root))
    tied = bool(getattr(hf_cfg, "tie_word_embeddings", False))
    if tied:
        weights.pop("lm_head.weight", None)
    nh = int(hf_cfg.num_attention_heads)
    head_dim = int(getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // nh)
    rope = _rope_params(cfg)
    try:
        hf_inv, scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg, "cpu") if rope["rope_type"] != "default" \
            else _default_rope(hf_cfg)
    except Exception as exc:
        raise BadInput(f"transformers' rope initialisation failed: {str(exc)[:200]}", str(root)) from None
    hf_inv = np.asarray(hf_inv.detach().float().numpy() if hasattr(hf_inv, "detach") else hf_inv, np.float32)
    ours = reference_inv_freq(head_dim, rope)
    if hf_inv.shape != ours.shape or not np.allclose(hf_inv, ours, rtol=1e-5, atol=0):
        raise BadInput(f"rope {rope['rope_type']!r}: transformers' inverse frequencies differ from the importer's",
                       str(root))
    weights[INV_FREQ] = hf_inv
    n_layers = int(hf_cfg.num_hidden_layers)
    has = lambda n: n in weights  # noqa: E731
    spec = ModelSpec(
        family=cfg["model_type"], vocab_size=int(hf_cfg.vocab_size), hidden_size=int(hf_cfg.hidden_size),
        intermediate_size=int(hf_cfg.intermediate_size), num_layers=n_layers, num_heads=nh,
        num_kv_heads=int(getattr(hf_cfg, "num_key_value_heads", None) or nh), head_dim=head_dim,
        rms_norm_eps=float(hf_cfg.rms_norm_eps), max_position_embeddings=int(hf_cfg.max_position_embeddings),
        tie_word_embeddings=tied, rope_type=rope["rope_type"], attention_scaling=float(scaling),
        qkv_bias=has("model.layers.0.self_attn.q_proj.bias"), o_bias=has("model.layers.0.self_attn.o_proj.bias"),
        mlp_bias=has("model.layers.0.mlp.gate_proj.bias"), layer_windows=_windows(cfg, n_layers), weights=weights)
    problems = spec.check_weights()
    if problems:
        from mosaic_amk.importer import UnsupportedModel

        raise UnsupportedModel(str(root), problems[:8])
    return spec


def _default_rope(hf_cfg):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if "default" in ROPE_INIT_FUNCTIONS:
        return ROPE_INIT_FUNCTIONS["default"](hf_cfg, "cpu")
    from transformers import LlamaConfig  # noqa: F401  (transformers 5: the default init lives on the model class)
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rot = LlamaRotaryEmbedding(hf_cfg)
    return rot.inv_freq, getattr(rot, "attention_scaling", 1.0)


def quantize(src: str | Path, dest: str | Path, *, dequantized: str | Path | None = None) -> dict:
    """Write ``dest``: the checkpoint ``src`` with every projection (PROJECTIONS) per-row int8 (the accepted layout);
    with ``dequantized``, also the float32 checkpoint of scale * q (what HF runs as the reference). Returns a summary."""
    import shutil

    from safetensors.numpy import load_file, save_file

    src, dest = Path(src), Path(dest)
    if dest.exists():
        raise BadInput("output exists", str(dest))
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("quantization_config"):
        raise BadInput("the source checkpoint is already quantized", str(src))
    state: dict[str, np.ndarray] = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    out, deq = {}, {}
    n_q = 0
    for name, arr in state.items():
        if any(name.endswith(f"{p}.weight") for p in PROJECTIONS):
            qt = quantize_int8(_float(arr))
            out[name] = qt.codes
            out[name[:-len(".weight")] + ".weight_scale"] = qt.scales.reshape(-1, 1)
            deq[name] = qt.dequantize()
            n_q += 1
        else:
            out[name] = arr
            deq[name] = _float(arr)
    for directory, tensors, qcfg in ((dest, out, CONFIG), (Path(dequantized) if dequantized else None, deq, None)):
        if directory is None:
            continue
        directory.mkdir(parents=True)
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        c = dict(cfg)
        if qcfg:
            c["quantization_config"] = qcfg
        (directory / "config.json").write_text(json.dumps(c, indent=2) + "\n")
        for f in src.iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
                shutil.copy2(f, directory / f.name)
    return {"quantized": n_q, "tensors": len(state)}
