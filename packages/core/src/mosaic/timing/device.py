"""Small device helpers through cuda-python (imported lazily): synchronise, flush L2, read clocks."""

from __future__ import annotations

import shutil
import subprocess

from mosaic.errors import MosaicError


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
    """SM/memory clocks, temperature and power as nvidia-smi reports them now (for the bundle)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {"error": "nvidia-smi not found"}
    fields = "clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw"
    try:
        out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"nvidia-smi: {exc}"}
    if out.returncode != 0:
        return {"error": out.stderr.strip()[:200]}
    values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(["sm_mhz", "mem_mhz", "max_sm_mhz", "temperature_c", "power_w"],
                    values, strict=False))


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
