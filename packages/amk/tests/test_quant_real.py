"""The real SmolLM2-135M-Instruct GGUF read natively (gguf_weights.py: its 210 Q4_1 projections and the Q8_0 tied
embedding / LM head kept as blocks, each checked bit-equal to transformers' dequantised float32 on import), run by the
ReferenceVM's quantized arithmetic (quant.py) against HF eager float32 on the dequantised checkpoint: criterion (1)
on the first two parity prompts x 16 tokens (all 8 x 64 matched on the CPU, docs/amk.md "Quantized weights")."""

from __future__ import annotations

import pytest
from mosaic_amk.parity import PARITY_PROMPTS, float32_parity

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def native(smollm2_checkpoint):
    from mosaic_amk.checkpoints import gguf_path
    from mosaic_amk.importer import import_checkpoint

    return import_checkpoint(gguf_path())


def test_the_gguf_keeps_its_own_blocks(native):
    formats = native.quantized()
    assert sorted(set(formats.values())) == ["q4_1", "q8_0"]
    assert list(formats.values()).count("q4_1") == 210 and formats[native.embed_name] == "q8_0"
    assert native.tie_word_embeddings and native.lm_head_name == native.embed_name
    assert native.check_weights() == []


def test_native_q4_1_greedy_tokens_equal_hf_float32_on_the_dequantised_checkpoint(native, smollm2_checkpoint):
    from mosaic_amk.reference_vm import ReferenceVM

    result = float32_parity(smollm2_checkpoint, PARITY_PROMPTS[:2], 16, vm_generate=ReferenceVM(native).generate)
    print(result.table())
    assert result.ok and all(r.matched == 16 for r in result.rows), result.table()
    assert max(r.result.max_logit_error for r in result.rows) < 1e-3


def test_perplexity_command_with_the_gguf_weights(smollm2_checkpoint, capsys):
    """Criterion (3) on the passage's first 24 tokens: the VM on the GGUF's blocks, HF on the dequantised dir."""
    from mosaic.cli import main
    from mosaic_amk.checkpoints import gguf_path

    args = ["amk", "perplexity", "--model", str(smollm2_checkpoint), "--weights", str(gguf_path()), "--max-tokens", "24"]
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr()
    out = capsys.readouterr().out
    assert "criterion (3)" in out and "PASS" in out, out
