"""Small device helpers through cuda-python (imported lazily): synchronise, flush L2, read clocks."""

from __future__ import annotations

from mosaic.errors import MosaicError
from mosaic.timing.throttle import sample_power


class TimingError(MosaicError):
    """The device could not be timed (no driver, a failed launch, records that do not add up)."""

    exit_code = 1


def cudart():
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found]
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[import-not-found,no-redef]
        except ImportError:
            raise TimingError("cuda-python is not installed (pip install 'mosaic-core[gpu]')") from None
    return runtime


def _ok(result, what: str):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise TimingError(f"{what} failed: {err!s}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def synchronize() -> None:
    _ok(cudart().cudaDeviceSynchronize(), "cudaDeviceSynchronize")


class L2Flush:
    """Overwrite a buffer of twice the L2 size before each timed run, so no run finds its inputs in L2.

    It is a cudaMemsetAsync on the legacy default stream (the stream kernels are launched on), which
    CUPTI reports as a memset, not a kernel, so it never enters a kernel's device time.
    """

    description = "cudaMemsetAsync of 2 x L2 bytes on the default stream before every run"

    def __init__(self, l2_bytes: int):
        self.nbytes = 2 * int(l2_bytes)
        self._rt = cudart()
        self._ptr = _ok(self._rt.cudaMalloc(self.nbytes), "cudaMalloc (L2 flush buffer)")
        self._value = 0

    def __call__(self) -> None:
        self._value = (self._value + 1) & 0xFF
        _ok(self._rt.cudaMemsetAsync(self._ptr, self._value, self.nbytes, 0), "cudaMemsetAsync (L2 flush)")

    def close(self) -> None:
        if self._ptr is not None:
            self._rt.cudaFree(self._ptr)
            self._ptr = None


def gpu_clocks() -> dict:
    """SM/memory clocks, temperature and power as nvidia-smi reports them now (for the bundle), on the device
    the process sees first (``CUDA_VISIBLE_DEVICES``): the same one query as the per-round sample
    (``timing.throttle.sample_power``); ``{"error": why}`` when nvidia-smi cannot answer."""
    s = sample_power()
    if s.state != "known":
        return {"error": s.reason}
    values = (("sm_mhz", s.sm_mhz), ("mem_mhz", s.mem_mhz), ("max_sm_mhz", s.max_sm_mhz),
              ("temperature_c", s.temperature_c), ("power_w", s.power_w))
    return {k: f"{v:g}" for k, v in values if v is not None}


class Serialized:
    """A Runnable whose every run is alone on the device: synchronise, launch, synchronise.

    jax launches on its own (non-blocking) stream while the L2 flush and CUTLASS use the default stream, so
    without this a flush or the other kernel of an A B pair could overlap a timed kernel. CUPTI's device
    time of the kernel is unaffected by the host round trips. Capture and the live timing sessions both
    time through it."""

    description = "device synchronised before and after every launch"

    def __init__(self, inner):
        self.inner = inner

    def launch(self) -> None:
        synchronize()
        self.inner.launch()
        synchronize()
