"""A GGUF checkpoint's own weight blocks, read natively into a ModelSpec (Q8_0 and Q4_1 stay quantized).

``import_gguf(path)`` loads the file through transformers (``gguf_file=``, dequantised to float32: the config, the
float tensors, the RoPE frequencies, and the reference every quantized tensor is checked against), then replaces each
Q8_0 / Q4_1 tensor by the GGUF's raw blocks (gguf's reader, :func:`mosaic_amk.quant.from_gguf_blocks`), mapped to
its state-dict name and, for q and k, with llama.cpp's row permutation undone (whole rows move with their blocks).
Every replaced tensor must dequantise (quant.py's step 1) to exactly transformers' float32 values, bit for bit, or
the import fails naming it: so the native model is the same model HF runs, only stored and read as blocks.

Tensor types other than F32, F16, Q8_0 and Q4_1 are refused with one line (they are not read natively, and a
dequantised copy would not be what the brief calls native).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from mosaic.errors import BadInput

from mosaic_amk.model import ModelSpec
from mosaic_amk.quant import QuantizedTensor, from_gguf_blocks

NATIVE = {"Q8_0": "q8_0", "Q4_1": "q4_1"}
FLOAT = ("F32", "F16")

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight", "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}


def hf_name(gguf_name: str) -> str | None:
    """The state-dict name of a llama GGUF tensor (None for a tensor this mapping does not know)."""
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    m = _LAYER.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores q / k rows permuted per head (convert_hf_to_gguf's ``permute``); this is the inverse
    transformers applies (modeling_gguf_pytorch_utils' reverse permute), on the first axis only."""
    dim = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, dim, 2, *rows.shape[1:]).swapaxes(2, 1).reshape(rows.shape)


def native_tensors(path: str | Path, num_heads: int, num_kv_heads: int) -> dict[str, QuantizedTensor]:
    """The Q8_0 / Q4_1 tensors of a llama GGUF as QuantizedTensors under their state-dict names; raises BadInput
    (one line) for a tensor type that is neither read natively nor float."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError, struct errors, ... for a damaged file
        raise BadInput(f"not a readable GGUF file: {str(exc)[:200] or type(exc).__name__}", str(path)) from None
    out: dict[str, QuantizedTensor] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind in FLOAT:
            continue
        if kind not in NATIVE:
            raise BadInput(f"GGUF tensor {t.name} is {kind}: the AMK VMs read F32, F16, Q8_0 and Q4_1", str(path))
        name = hf_name(t.name)
        if name is None:
            raise BadInput(f"GGUF tensor {t.name} ({kind}) has no state-dict name in this importer", str(path))
        cols, rows = (int(d) for d in t.shape)  # GGUF lists dimensions fastest first
        raw = np.asarray(t.data).reshape(rows, -1)
        if ".attn_q." in t.name:
            raw = unpermute_rows(raw, num_heads)
        elif ".attn_k." in t.name:
            raw = unpermute_rows(raw, num_kv_heads)
        out[name] = from_gguf_blocks(NATIVE[kind], raw, (rows, cols))
    return out


def load_hf_gguf(path: Path):
    """transformers' dequantised float32 model of a GGUF file (CPU, eager attention)."""
    import importlib.util

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise BadInput(f"reading a GGUF needs the {needed!r} package (pip install {needed})", str(path))
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                     attn_implementation="eager")
    except Exception as exc:  # transformers raises many types for a file it cannot read
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInput(f"transformers could not load the GGUF: {first[:300]}", str(path)) from None
    return model.eval()


def import_gguf(path: str | Path) -> ModelSpec:
    """A ModelSpec of a llama GGUF with its Q8_0 / Q4_1 tensors kept as the file's blocks (module docstring)."""
    from mosaic_amk.importer import spec_from_hf

    path = Path(path)
    if not path.is_file():
        raise BadInput("no such GGUF file", str(path))
    model = load_hf_gguf(path)
    spec = spec_from_hf(model, None, str(path))
    native = native_tensors(path, spec.num_heads, spec.num_kv_heads)
    weights = dict(spec.weights)
    for name, qt in native.items():
        ref = weights.get(name)
        if ref is None:
            raise BadInput(f"GGUF tensor {name} is not a tensor of the model transformers loaded", str(path))
        got = qt.dequantize()
        if got.shape != ref.shape or not np.array_equal(got.view(np.uint32), ref.view(np.uint32)):
            bad = int(np.sum(got != ref)) if got.shape == ref.shape else -1
            raise BadInput(f"GGUF tensor {name}: its {qt.format} blocks do not dequantise to transformers' float32 "
                           f"values ({bad} elements differ)", str(path))
        weights[name] = qt
    import attrs

    return attrs.evolve(spec, weights=weights)
