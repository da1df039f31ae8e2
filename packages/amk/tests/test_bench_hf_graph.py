"""The HF static-cache decode step that the bench captures in a CUDA graph, run on the CPU without capture:
its greedy tokens equal transformers' own ``generate``, and the step creates no tensor from host data
(``aten.lift_fresh``: what transformers' eager mask does with ``torch.tensor(0.0, device=...)``, a
host-to-device copy that CUDA graph capture refuses, the H200 failure this decoder fixes)."""

from __future__ import annotations

import pytest
import torch
from mosaic.errors import BadInput
from mosaic_amk.bench.hf_gpu import StaticGraphDecoder
from mosaic_amk.tiny_models import make_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, StaticCache


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def _model(tmp_path, family):
    ck = make_checkpoint(tmp_path / family, family)
    return AutoModelForCausalLM.from_pretrained(str(ck), dtype=torch.float32, attn_implementation="eager").eval()


def _hf_tokens(model, n):
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id = None, 0
    gen.max_new_tokens = gen.min_new_tokens = n
    gen.do_sample = False
    out = model.generate(torch.tensor([[1]]), generation_config=gen)
    return out[0, 1:].tolist()


@pytest.mark.parametrize("family", ["llama", "smollm2"])
def test_static_step_matches_generate_and_copies_nothing_from_the_host(tmp_path, family):
    model = _model(tmp_path, family)
    want = _hf_tokens(model, 10)
    dec = StaticGraphDecoder(model, max_cache_len=24, graph=False)
    dec.tok.fill_(1)
    with torch.no_grad(), _Ops() as log:
        dec._step()
    assert "aten.lift_fresh.default" not in log.ops
    dec.reset()
    dec.tok.fill_(1)
    assert dec.run(10) == want
    dec.reset()  # a second sequence after reset(): the cache position rewinds too
    dec.tok.fill_(1)
    assert dec.run(10) == want


def test_transformers_own_mask_would_copy_from_the_host(tmp_path):
    """The failure mode is real: without our mask, transformers builds one from host data."""
    model = _model(tmp_path, "llama")
    cache = StaticCache(config=model.config, max_cache_len=8)
    with torch.no_grad(), _Ops() as log:
        model(input_ids=torch.ones((1, 1), dtype=torch.long), position_ids=torch.zeros((1, 1), dtype=torch.long),
              past_key_values=cache, use_cache=True)
    assert "aten.lift_fresh.default" in log.ops


def test_sliding_window_models_are_refused(tmp_path):
    with pytest.raises(BadInput, match="sliding window"):
        StaticGraphDecoder(_model(tmp_path, "mistral"), max_cache_len=16, graph=False)
