"""Test fixtures of the amk package: ``tiny_checkpoint(family)`` -> a checkpoint directory of a tiny
random-init model (see mosaic_amk.tiny_models), built once per session per family."""

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
