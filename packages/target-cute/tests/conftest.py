import pytest

pytest.importorskip(
    "cutlass.cute",
    reason="the CuTe tests need nvidia-cutlass-dsl (Python >= 3.12): run them in .venv312 (make test does)")
