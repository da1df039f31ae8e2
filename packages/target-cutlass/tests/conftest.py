"""Shared skips of the target-cutlass tests: ``cutlass_build`` skips a test without nvcc or the CUTLASS headers
(pip's nvidia-cutlass, or $MOSAIC_CUTLASS_INCLUDE), naming which is missing."""

import shutil

import pytest


@pytest.fixture
def cutlass_build():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc (CUDA 12.3+) is not on PATH")
    try:
        from mosaic_target_cutlass.build import cutlass_include

        cutlass_include()
    except Exception as exc:  # noqa: BLE001 -- ToolMissing or an import error: skip, saying which
        pytest.skip(f"CUTLASS headers not found ({type(exc).__name__})")
