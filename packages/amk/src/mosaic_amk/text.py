"""Text in, text out: a checkpoint's own tokenizer (and chat template) around the token-id commands.

``load_tokenizer(dir)`` reads the tokenizer saved in a checkpoint directory (local files only, no hub), or the one a
``.gguf`` file carries;
a directory without one is a ``NoTokenizer`` (a BadInput: one ``error:`` line, exit 2) that says to pass
token ids instead. ``encode`` tokenises a prompt as the model was trained to see it (``add_special_tokens``
as the tokenizer defines it), or, with ``chat=True``, as one user turn through the checkpoint's chat
template with the assistant's generation prompt appended. ``decode`` keeps special tokens, so what the
model generated is shown as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mosaic.errors import BadInput

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


class NoTokenizer(BadInput):
    """The checkpoint directory holds no tokenizer (or one transformers cannot load)."""


def has_tokenizer(model_dir: str | Path) -> bool:
    root = Path(model_dir)
    return any((root / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(model_dir: str | Path, *, hint: str = "pass token ids with --prompt-ids"):
    root = Path(model_dir)
    if root.suffix == ".gguf" and root.is_file():  # a GGUF file carries its tokenizer (transformers reads it)
        return _gguf_tokenizer(root, hint)
    if not root.is_dir():
        raise BadInput("not a checkpoint directory", str(root))
    if not has_tokenizer(root):
        raise NoTokenizer(f"checkpoint has no tokenizer ({' / '.join(TOKENIZER_FILES)}); {hint}", str(root))
    import transformers
    from transformers import AutoTokenizer

    transformers.utils.logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(root), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for broken tokenizer files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NoTokenizer(f"transformers could not load the checkpoint's tokenizer: {first[:200]}; {hint}",
                          str(root)) from None


def _gguf_tokenizer(path: Path, hint: str):
    import transformers
    from transformers import AutoTokenizer

    transformers.utils.logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a GGUF it cannot read
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NoTokenizer(f"transformers could not load the GGUF's tokenizer: {first[:200]}; {hint}",
                          str(path)) from None


def encode(tokenizer, text: str, *, chat: bool = False) -> list[int]:
    """Token ids of ``text`` (``chat``: one user message through the chat template + generation prompt)."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise BadInput("--chat: the checkpoint's tokenizer has no chat template")
        out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
    else:
        ids = tokenizer(text)["input_ids"]
    ids = [int(t) for t in ids]
    if not ids:
        raise BadInput(f"the prompt {text!r} encodes to no tokens")
    return ids


def decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode([int(t) for t in ids], skip_special_tokens=False)


def parse_ids(text: str, option: str = "--prompt-ids") -> list[int]:
    """``"1,2, 3"`` -> [1, 2, 3]; BadInput naming ``option`` otherwise."""
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise BadInput(f"{option} must be comma-separated token ids, got {text!r}") from None
    if not ids:
        raise BadInput(f"{option} needs at least one token id")
    return ids
