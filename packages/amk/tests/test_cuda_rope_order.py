"""The blocked RoPE order on the H200 (rope_order.py): CUDA_DEFAULT (rope_order blocked) against its standard twin, the
same greedy tokens and, one step per launch, bit-identical logits, on the tiny models (head_dim 24: blocks that
straddle nothing), the Llama-3.2-1B and SmolLM2-135M shapes cut short; and the VM's fallback to the standard order
when the KV capacity outgrows the attention's staging. The CPU side is test_rope_order.py."""

from __future__ import annotations

import attrs
import pytest
from mosaic_amk.config import CUDA_DEFAULT

BLOCKED = attrs.evolve(CUDA_DEFAULT, rope_order="blocked")  # CUDA_DEFAULT
STANDARD = attrs.evolve(CUDA_DEFAULT, rope_order="standard")


@pytest.mark.gpu
@pytest.mark.parametrize("model_kind", ["tiny-llama", "tiny-qwen2", "tiny-smollm2", "llama-3.2-1b-2layers",
                                        "smollm2-135m-3layers"])
@pytest.mark.parametrize("steps_per_launch", [1, 8])
def test_blocked_whole_model_tokens_and_logits_equal(model_kind, steps_per_launch, cuda_device, gpu_model,
                                                     same_generation):
    from mosaic_amk.cuda import decode as D
    from mosaic_amk.cuda.cuda_vm import CudaVM

    _, spec, weights, gpu = gpu_model(model_kind)
    std = CudaVM(spec, STANDARD, gpu, weights=weights, max_positions=64)
    blk = CudaVM(spec, BLOCKED, gpu, weights=weights, max_positions=64)
    assert blk.config.rope_order == "blocked" and std.build_info.key == blk.build_info.key  # the same cubin
    q = [t for t in D.decode(blk.enc).tasks if t.op == "gemv_rope"]
    assert all(t.params["rope_block"] == 8 and t.params["row_start"] % 8 == 0 for t in q)
    assert len(q) > len([t for t in D.decode(std.enc).tasks if t.op == "gemv_rope"])  # more, shorter tasks
    same_generation(std, blk, [3, 17, 42, 5, 11], 40, steps_per_launch)


@pytest.mark.gpu
def test_blocked_falls_back_when_the_context_outgrows_the_staging(cuda_device, gpu_model, same_generation):
    """A KV capacity beyond the staging (2048 tokens at head_dim 64): the CudaVM runs the standard order (the same
    bits); the launcher refuses a blocked encoding that could reach an unstaged attention."""
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.cuda_vm import CudaVM
    from mosaic_amk.cuda.launcher import DeviceError, Launcher
    from mosaic_amk.lowering import lower

    _, spec, weights, gpu = gpu_model("smollm2-135m-3layers")
    vm = CudaVM(spec, BLOCKED, gpu, weights=weights, max_positions=2048)
    assert vm.config.rope_order == "standard"
    std = CudaVM(spec, STANDARD, gpu, weights=weights, max_positions=64)
    same_generation(std, vm, [3, 17, 42, 5], 12)
    big = attrs.evolve(BLOCKED, kv_max_tokens=2048)
    with pytest.raises(DeviceError, match="the staging holds"):
        Launcher(E.encode(lower(spec, big, gpu, 0)), str(vm.build_info.cubin), smem_bytes=big.smem_bytes)
