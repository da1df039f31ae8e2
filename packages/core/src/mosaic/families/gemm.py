"""GEMM (``c = a @ b``, ``m x n x k``, row-major): dimensions, seeded inputs, work, and the cuBLAS yardstick.

The float64 oracle is :mod:`mosaic.oracle.gemm`. The yardstick is ``torch.matmul(a, b, out=c)`` with
reduced-precision reductions turned off, so cuBLAS accumulates in fp32 like the kernels it is compared
with; torch is imported only when one is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mosaic.errors import MosaicError
from mosaic.families import inputs as dist
from mosaic.records import Family, Yardstick

DIMS = ("m", "n", "k")
CUBLAS = "cublas"  # the yardstick's language name (a library call, no lowering)
_DTYPES = ("bf16", "f16")
DTYPES = ("bf16", "f16", "f32")
DISTRIBUTIONS = ("normal", "int", "large", "equal-rows", "denormal")
FLOOR = "max(2*m*n*k / peak, e*(m*k + k*n + m*n) / bandwidth)"


def work(shape: Mapping[str, int], e: float) -> tuple[float, float]:
    """(FLOPs, bytes): 2 m n k; a, b read and c written once."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    return 2.0 * m * n * k, e * (m * k + k * n + m * n)


def make_inputs(shape: Mapping[str, int], dtype: str, seed: int, values: str) -> dict:
    """Seeded ``a`` (m x k) and ``b`` (k x n) as float32 arrays representable in ``dtype``.

    ``normal``: standard normal values rounded to the dtype (a realistic spread of magnitudes).
    ``int``: integers in [-4, 4], whose products and sums are exact in fp32 for K < 2^20, so the oracle
    demands a bit-exact result.
    ``large``: magnitudes 2^e..2^(e+1) with e the largest for which K products stay below a quarter of
    fp32's and the output format's range (e = 56 for bf16 at K = 4096; 0 for f16 there).
    ``equal-rows``: every row of ``a`` and of ``b`` one repeated value, so every row of ``c`` is one value.
    ``denormal``: ``a`` subnormal in the dtype, ``b`` integers in [-4, 4]: exact products in fp32's subnormal
    range; a kernel that flushes ``a`` to zero returns zeros and fails the bit-exact check.
    """
    import numpy as np

    from mosaic.oracle.formats import ACCUMULATOR, fmt

    m, n, k = (shape[d] for d in DIMS)
    rng = np.random.default_rng(seed)
    f = fmt(dtype)
    if values == "int":
        a = rng.integers(-4, 5, size=(m, k)).astype(np.float32)
        b = rng.integers(-4, 5, size=(k, n)).astype(np.float32)
    elif values == "large":
        e = dist.large_exponent(f, (ACCUMULATOR.emax, np.log2(k), 2), (f.emax, np.log2(k), 2))
        a, b = dist.magnitude(rng, (m, k), f, e), dist.magnitude(rng, (k, n), f, e)
    elif values == "equal-rows":
        a, b = dist.equal_rows(rng, (m, k), f), dist.equal_rows(rng, (k, n), f)
    elif values == "denormal":
        a, b = dist.subnormal(rng, (m, k), f), dist.small_ints(rng, (k, n))
    else:
        a = f.round(rng.standard_normal((m, k), dtype=np.float32)).astype(np.float32)
        b = f.round(rng.standard_normal((k, n), dtype=np.float32)).astype(np.float32)
    return {"a": a, "b": b}


class TorchMatmul:
    """``c = a @ b`` through torch (cuBLAS on ``device="cuda"``; ``"cpu"`` for tests of the contract)."""

    def __init__(self, inputs: Mapping[str, Any], dtype: str = "bf16", device: str = "cuda"):
        if dtype not in _DTYPES:
            raise MosaicError(f"the cuBLAS yardstick takes {'/'.join(_DTYPES)}, not {dtype}", "yardstick")
        import torch

        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        td = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
        self.torch, self.device = torch, device
        self.a = torch.from_numpy(inputs["a"]).to(device).to(td)
        self.b = torch.from_numpy(inputs["b"]).to(device).to(td)
        self.c = torch.empty((self.a.shape[0], self.b.shape[1]), dtype=td, device=device)

    def launch(self) -> None:
        self.torch.matmul(self.a, self.b, out=self.c)

    def poison(self) -> None:
        self.c.fill_(float("nan"))

    def output(self) -> dict:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        return {"c": self.c.float().cpu().numpy()}

    def close(self) -> None:
        self.a = self.b = self.c = None


def yardstick(inputs: Mapping[str, Any], dtype: str) -> TorchMatmul:
    """The cuBLAS yardstick on these inputs."""
    return TorchMatmul(inputs, dtype)


def runnable_factory(spec, gpu, inputs: Mapping[str, Any]) -> TorchMatmul:
    """``capture_in_process(..., runnable_factory=...)`` for a ``cublas`` spec."""
    return TorchMatmul(inputs, spec.dtype)


CUBLAS_YARDSTICK = Yardstick(
    CUBLAS, "torch.matmul(a, b, out=c): cuBLAS, fp32 accumulation (reduced-precision reductions off)", "torch",
    _DTYPES, lambda inputs, dtype, device="cuda": TorchMatmul(inputs, dtype, device), call="torch.matmul",
    title="cuBLAS")

FAMILY = Family("gemm", "c = a @ b, a (m x k), b (k x n), row-major", DIMS, work, floor=FLOOR, dtypes=DTYPES,
                distributions=DISTRIBUTIONS, make_inputs=make_inputs, oracle="gemm", yardsticks=(CUBLAS_YARDSTICK,),
                example={"m": 64, "n": 32, "k": 128})
