"""A :class:`mosaic.backend.Runnable` around one torch call: the yardsticks of attention, rmsnorm and
softmax (torch SDPA / cuDNN, flash-attn-4, torch's rms_norm and softmax). torch is imported only when one
is built; ``device="cpu"`` runs the same object without a GPU (tests of the contract)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mosaic.errors import MosaicError

TORCH_DTYPES = ("bf16", "f16", "f32")


def torch_dtype(dtype: str):
    import torch

    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]


class TorchCall:
    """``out = call(*tensors)`` on ``device``; ``output()`` returns ``{out_name: float32 array}``.

    ``names``: which inputs, in order, become the call's arguments (float32 arrays cast to ``dtype``).
    ``to_output``: turns the call's result into the output tensor (e.g. the first of a tuple, a transpose
    back to the family's layout); applied when the output is read, outside the timed launch."""

    def __init__(self, call: Callable[..., Any], inputs: Mapping[str, Any], names: Sequence[str], dtype: str,
                 out_name: str, device: str = "cuda", what: str = "yardstick",
                 to_output: Callable[[Any], Any] | None = None, arrange: Callable[[Any], Any] | None = None):
        if dtype not in TORCH_DTYPES:
            raise MosaicError(f"the {what} takes {'/'.join(TORCH_DTYPES)}, not {dtype}", "yardstick")
        missing = [n for n in names if n not in inputs]
        if missing:
            raise MosaicError(f"the {what} needs input(s) {', '.join(missing)}", "yardstick")
        import torch

        self.torch, self.device, self.call, self.out_name = torch, device, call, out_name
        td = torch_dtype(dtype)
        arrange = arrange or (lambda t: t)
        self.args = [arrange(torch.from_numpy(inputs[n]).to(device).to(td)).contiguous() for n in names]
        self.to_output = to_output or (lambda r: r)
        self.result: Any = None
        self.inference = torch.inference_mode()

    def launch(self) -> None:
        with self.inference:
            self.result = self.call(*self.args)

    def _out(self):
        return self.to_output(self.result) if self.result is not None else None

    def poison(self) -> None:
        out = self._out()
        if out is not None:
            with self.inference:
                out.fill_(float("nan"))

    def output(self) -> dict:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        out = self._out()
        if out is None:
            raise MosaicError(f"the {self.out_name} output was read before any launch", "yardstick")
        return {self.out_name: out.float().cpu().numpy()}

    def close(self) -> None:
        self.args = []
        self.result = None
