"""GPU detection: which registered :class:`GpuTarget` is the device cuda-python sees."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from mosaic.records import GpuTarget


@attrs.frozen
class DetectedDevice:
    index: int
    name: str
    compute_capability: tuple
    sm_count: int
    target: GpuTarget | None

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "compute_capability": list(self.compute_capability),
                "sm_count": self.sm_count, "target": self.target.name if self.target else None}


@attrs.frozen
class Detection:
    """The outcome of probing: the devices found, or why none could be probed."""

    devices: tuple = ()
    reason: str = ""


def probe_devices() -> tuple[list[tuple[str, tuple[int, int], int]], str]:
    """(name, compute capability, SM count) of every CUDA device, through cuda-python's runtime API.

    Returns ``([], reason)`` when cuda-python is missing or no driver/device answers.
    """
    try:
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]
    except ImportError:
        try:
            from cuda import cudart  # type: ignore[import-not-found,no-redef]  # cuda-python < 12.6
        except ImportError:
            return [], "cuda-python is not installed (pip install 'mosaic-core[gpu]')"
    err, count = cudart.cudaGetDeviceCount()
    if int(err) != 0 or count == 0:
        return [], f"no CUDA device visible (cudaGetDeviceCount: {err!s}, count {count})"
    found = []
    for index in range(count):
        err, prop = cudart.cudaGetDeviceProperties(index)
        if int(err) != 0:
            return found, f"cudaGetDeviceProperties({index}) failed: {err!s}"
        name = prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name)
        found.append((name.rstrip("\x00"), (prop.major, prop.minor), prop.multiProcessorCount))
    return found, ""


def detect(targets: Iterable[GpuTarget], probe=probe_devices) -> Detection:
    """Match every visible device against the registered records by name, compute capability and SM count."""
    targets = list(targets)
    devices, reason = probe()
    out = []
    for index, (name, cc, sms) in enumerate(devices):
        match = next((t for t in targets if t.matches(name, cc, sms)), None)
        out.append(DetectedDevice(index, name, tuple(cc), sms, match))
    return Detection(tuple(out), reason)
