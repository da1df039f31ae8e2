"""Text in, text out (mosaic_amk.text): `mosaic amk generate --prompt TEXT [--chat]` through the checkpoint's
tokenizer, `--prompt-ids` for ids, one-line errors when there is no tokenizer."""

from __future__ import annotations

import json

import pytest
from mosaic.cli import main
from mosaic.errors import BadInput
from mosaic_amk.text import parse_ids


def run_ok(argv):
    """`mosaic ARGV` through mosaic.cli.main, which always exits: expect exit 0."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0


def test_parse_ids():
    assert parse_ids("1, 2,3,") == [1, 2, 3]
    with pytest.raises(BadInput, match="comma-separated token ids"):
        parse_ids("1,x")
    with pytest.raises(BadInput, match="at least one token id"):
        parse_ids(",")


@pytest.mark.slow
def test_generate_text_prompt_is_encoded_and_the_output_decoded(smollm2_checkpoint, capsys):
    run_ok(["amk", "generate", "--model", str(smollm2_checkpoint), "--prompt", "The capital of France is",
          "--tokens", "4", "--check-hf"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "7042,30,198,198"
    assert out[1] == "text: ' Paris.\\n\\n'"
    assert out[2] == "hf eager: 7042,30,198,198" and out[3].startswith("check-hf: match")
    run_ok(["amk", "generate", "--model", str(smollm2_checkpoint), "--prompt-ids", "504,3575,282,4649,314",
          "--tokens", "4", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert got["tokens"] == [7042, 30, 198, 198]  # ids in, ids out: no text, only the record it lowered for
    assert set(got) == {"tokens", "gpu", "gpu_provenance"}


@pytest.mark.slow
def test_generate_chat_applies_the_chat_template(smollm2_checkpoint, capsys):
    run_ok(["amk", "generate", "--model", str(smollm2_checkpoint), "--prompt", "What is 2+2?", "--chat",
          "--tokens", "3", "--json"])
    got = json.loads(capsys.readouterr().out)
    ids = got["prompt_ids"]
    # SmolLM2's template: a default system turn, the user turn, then the assistant's generation prompt
    assert ids[0] == 1 and ids[-4:] == [1, 520, 9531, 198] and len(got["tokens"]) == 3
    assert isinstance(got["text"], str) and got["text"]


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "hello"], "checkpoint has no tokenizer"),
    (["--prompt", "hello", "--chat"], "checkpoint has no tokenizer"),
    (["--prompt", "hello", "--prompt-ids", "1"], "exactly one of --prompt TEXT and --prompt-ids"),
    ([], "exactly one of --prompt TEXT and --prompt-ids"),
    (["--prompt-ids", "1,2", "--chat"], "--chat applies the chat template to --prompt TEXT"),
])
def test_generate_text_errors_are_one_line(tiny_checkpoint, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["amk", "generate", "--model", str(tiny_checkpoint("llama")), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
