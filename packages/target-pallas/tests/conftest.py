import pytest

jax = pytest.importorskip(
    "jax", minversion="0.11.2",
    reason="the Pallas tests need jax >= 0.11.2 (Python >= 3.12): run them in .venv312 (make test does)")
