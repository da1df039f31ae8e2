"""The profiled launch of ``capture --profile``'s child: one warm launch, then one launch between
``cuProfilerStart`` and ``cuProfilerStop`` (what Nsight Compute, run with ``--profile-from-start off``, replays)."""

from __future__ import annotations

import ctypes

from mosaic.errors import MosaicError


def _cuda_profiler(start: bool) -> None:
    """``cuProfilerStart``/``Stop`` in the primary context of device 0 (the one the languages' runtimes use),
    made current on this thread for the call."""
    lib = ctypes.CDLL("libcuda.so.1")
    dev, ctx, old = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    for name, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), 0)),
                       ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev)),
                       ("cuCtxPushCurrent_v2", (ctx,)),
                       ("cuProfilerStart" if start else "cuProfilerStop", ()),
                       ("cuCtxPopCurrent_v2", (ctypes.byref(old),)),
                       ("cuDevicePrimaryCtxRelease_v2", (dev,))):
        rc = getattr(lib, name)(*args)
        if rc != 0:
            raise MosaicError(f"{name} failed with CUDA error {rc}")


def profiled_launch(runnable, log: list[str]) -> dict:
    """The child's work under ncu: one warm launch (its output read back, so it finished), then one launch in
    the profiler's range. -> the capture summary."""
    runnable.poison()
    runnable.launch()
    runnable.output()
    _cuda_profiler(True)
    try:
        runnable.launch()
        runnable.output()  # reads back: the launch has finished inside the range
    finally:
        _cuda_profiler(False)
    log.append("profiled: one warm launch, then one launch between cuProfilerStart and cuProfilerStop")
    return {"profiled_launches": 1}
