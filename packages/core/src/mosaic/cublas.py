"""cuBLAS as a Runnable: the yardstick every capture and campaign times in the same run.

``torch.matmul(a, b, out=c)`` with reduced-precision reductions turned off, so cuBLAS accumulates in fp32
like the kernels it is compared with. torch is imported only when one is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mosaic.errors import MosaicError

CUBLAS = "cublas"
_DTYPES = ("bf16", "f16")


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


def runnable_factory(spec, gpu, inputs: Mapping[str, Any]) -> TorchMatmul:
    """``capture_in_process(..., runnable_factory=...)`` for a ``cublas`` spec."""
    return TorchMatmul(inputs, spec.dtype)
