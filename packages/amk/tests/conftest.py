"""Test fixtures of the amk package: ``tiny_checkpoint(family)`` -> a checkpoint directory of a tiny
random-init model (see mosaic_amk.tiny_models), built once per session per family; ``cuda_device`` skips a GPU test
on a machine without cupy and a CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest
from mosaic_amk.tiny_models import make_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Factory: tiny_checkpoint(family) -> checkpoint dir, built once per session."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = make_checkpoint(tmp_path_factory.mktemp(f"ckpt-{name}"), name)
        return cache[name]

    return get


@pytest.fixture
def cuda_device():
    """Skip the test unless cupy imports and sees a CUDA device, and torch (where installed) sees it too (the GPU
    tests are also marked ``gpu``)."""
    import importlib.util

    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
        if importlib.util.find_spec("torch") is not None:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError("torch sees no CUDA device")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"needs cupy and a CUDA device ({type(exc).__name__}: {exc})")


@pytest.fixture
def same_generation():
    """check(want_vm, got_vm, prompt, n, steps_per_launch=1): both CudaVMs generate n tokens; the tokens must be equal
    and, one step per launch, every step's logits bit-identical (more steps per launch return no logits)."""
    import numpy as np

    def check(want_vm, got_vm, prompt, n, steps_per_launch=1):
        logits = steps_per_launch == 1
        want, want_logits = want_vm.generate(prompt, n, logits=logits, steps_per_launch=steps_per_launch)
        got, got_logits = got_vm.generate(prompt, n, logits=logits, steps_per_launch=steps_per_launch)
        assert got == want
        assert len(got_logits) == (n if logits else 0)
        for a, b in zip(got_logits, want_logits, strict=True):
            assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))

    return check
