"""checkpoints.round_weights_bf16: a checkpoint with every weight rounded to bf16 as the CUDA VM stores it
(launcher.bf16_round), kept in float32, so HF float32 on it is the reference of the VM's f32 mode (float32
arithmetic on bf16 weights). The real H200 run (results/2026-12-02/session9/B/amk) compared the VM against HF float32
on the unrounded dequantised GGUF and failed criterion (3) by exactly the rounding: the VM's 17.393100 is HF float32
on the rounded weights (17.393094); on the unrounded ones HF gives 17.371859."""

from __future__ import annotations

import numpy as np
import pytest
from mosaic.errors import BadInput
from mosaic_amk import checkpoints
from mosaic_amk.cuda.launcher import bf16_bits, bf16_round
from mosaic_amk.importer import import_checkpoint
from mosaic_amk.model import INV_FREQ


def _tensors(directory):
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_rounded_copy_holds_exactly_the_device_weights(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("llama")
    dest = tmp_path / "rounded"
    dest.mkdir()
    rec = checkpoints.round_weights_bf16(src, dest)
    before, after = _tensors(src), _tensors(dest)
    assert before.keys() == after.keys()
    for k, w in before.items():
        assert after[k].dtype == w.dtype == np.float32, k
        np.testing.assert_array_equal(after[k], bf16_round(w), err_msg=k)
        # what Launcher.bind uploads for a bf16 buffer is the same bits from either copy
        np.testing.assert_array_equal(bf16_bits(after[k]), bf16_bits(w), err_msg=k)
    assert rec["tensors"] == len(before) and rec["elements"] == sum(w.size for w in before.values())
    assert 0 < rec["changed"] <= rec["elements"]  # random float32 init: most values are not bf16 values
    assert rec["changed"] == sum(int(np.count_nonzero(bf16_round(w) != w)) for w in before.values())
    for f in src.iterdir():  # config, tokenizer, ...: copied byte for byte
        if f.is_file() and f.suffix != ".safetensors":
            assert (dest / f.name).read_bytes() == f.read_bytes(), f.name
    # the importer reads the rounded values (inv_freq is computed, not stored: unchanged)
    a, b = import_checkpoint(src), import_checkpoint(dest)
    np.testing.assert_array_equal(a.weights[INV_FREQ], b.weights[INV_FREQ])
    for name, w in a.weights.items():
        if name != INV_FREQ:
            np.testing.assert_array_equal(b.weights[name], bf16_round(np.asarray(w, np.float32)), err_msg=name)


def test_reference_vm_on_the_rounded_copy_matches_hf_float32_on_it(tiny_checkpoint, tmp_path):
    """The rounded copy is an ordinary checkpoint: HF float32 loads it and the ReferenceVM on its weights agrees with
    HF within the f32 criterion; on the unrounded weights HF computes another model."""
    from mosaic_amk.perplexity import PerplexityCheck, hf_perplexity, vm_perplexity

    src = tiny_checkpoint("llama")
    dest = tmp_path / "rounded"
    dest.mkdir()
    checkpoints.round_weights_bf16(src, dest)
    ids = list(range(3, 27))
    hf16, hf32 = hf_perplexity(dest, ids), hf_perplexity(src, ids)
    check = PerplexityCheck(vm_perplexity(import_checkpoint(dest), ids), hf16)
    assert check.ok and check.max_nll_diff < 1e-4, check.to_json()
    # the rounding changes the model (on the real checkpoint: rel 1.2e-3, beyond PPL_RTOL)
    assert np.max(np.abs(np.asarray(hf16.nll) - np.asarray(hf32.nll))) > 1e-5


def test_nll_diff_by_range_cuts_at_the_bounds():
    from mosaic_amk.perplexity import Perplexity, PerplexityCheck

    vm = Perplexity("vm", 7, (1.0, 1.0, 1.5, 1.0, 1.0, 3.0), 0.0)
    hf = Perplexity("hf", 7, (1.0, 1.0, 1.0, 1.0, 1.0, 1.0), 0.0)
    r = PerplexityCheck(vm, hf).nll_diff_by_range((2, 4, 99))
    assert [x["positions"] for x in r] == [[0, 2], [2, 4], [4, 6]]
    assert [x["max"] for x in r] == [0.0, 0.5, 2.0] and [x["argmax"] for x in r] == [0, 2, 5]
    assert r[2]["mean"] == pytest.approx(1.0)


def test_a_directory_without_safetensors_is_bad_input(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "dest").mkdir()
    with pytest.raises(BadInput, match="no \\*.safetensors"):
        checkpoints.round_weights_bf16(tmp_path / "src", tmp_path / "dest")


@pytest.mark.slow
def test_real_checkpoint_rounding_is_the_session9_criterion3_gap(smollm2_checkpoint):
    """On SmolLM2-135M (the dequantised Q4_1 GGUF) HF float32 on the rounded weights is 17.3931 over the shipped
    passage, the H200 CUDA VM's f32 17.393100 within 1e-6; the unrounded weights give 17.3719 (rel 1.2e-3, beyond
    PPL_RTOL). The ReferenceVM on the rounded weights agrees with HF float32 on them."""
    from mosaic_amk.perplexity import (
        PPL_RTOL,
        PerplexityCheck,
        hf_perplexity,
        passage_path,
        read_text,
        token_ids,
        vm_perplexity,
    )

    rounded = checkpoints.checkpoint("smollm2-135m", bf16_weights=True)
    ids = token_ids(rounded, read_text(passage_path()))
    assert len(ids) == 1145
    hf16, hf32 = hf_perplexity(rounded, ids), hf_perplexity(smollm2_checkpoint, ids)
    assert abs(hf16.ppl - 17.393100378274593) / hf16.ppl < 1e-6, hf16.ppl  # the H200 CUDA VM f32 (session 9)
    assert abs(hf16.ppl - hf32.ppl) / hf32.ppl > 10 * PPL_RTOL, (hf16.ppl, hf32.ppl)
    short = ids[:17]
    check = PerplexityCheck(vm_perplexity(import_checkpoint(rounded), short), hf_perplexity(rounded, short))
    assert check.ok and check.max_nll_diff < 1e-4, check.to_json()
