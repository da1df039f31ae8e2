"""GPU detection: which registered :class:`GpuTarget` is the device cuda-python sees."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from mosaic.fields import one_of
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


def detect(targets: Iterable[GpuTarget], probe=None) -> Detection:
    """Match every visible device against the registered records by name, compute capability and SM count.
    ``probe``: what lists the devices (default :func:`probe_devices`, looked up when called)."""
    targets = list(targets)
    devices, reason = (probe or probe_devices)()
    out = []
    for index, (name, cc, sms) in enumerate(devices):
        match = next((t for t in targets if t.matches(name, cc, sms)), None)
        out.append(DetectedDevice(index, name, tuple(cc), sms, match))
    return Detection(tuple(out), reason)


#: the GPU record a command uses when ``--gpu`` is not given and no CUDA device is visible (the previews and
#: the CPU-only commands lower for it; the shipped reference bundles were captured on it)
DEFAULT_GPU = "h200"


@attrs.frozen
class GpuChoice:
    """The GPU record a command uses and why: ``how`` is ``"given"`` (``--gpu`` or a campaign's ``gpu``),
    ``"detected"`` (the first visible CUDA device's record) or ``"default"`` (:data:`DEFAULT_GPU`, no device)."""

    name: str
    how: str = attrs.field(validator=one_of("given", "detected", "default"))
    provenance: str
    device: DetectedDevice | None = None

    def line(self) -> str:
        """``h100-sxm (detected: NVIDIA H100 80GB HBM3)``, ``h200 (--gpu)``, ``h200 (default; no GPU visible: ...)``."""
        return f"{self.name} ({self.provenance})"

    def to_json(self) -> dict:
        return {"gpu": self.name, "gpu_provenance": self.provenance, "gpu_how": self.how,
                "device": self.device.to_json() if self.device else None}


def _device_text(d: DetectedDevice) -> str:
    return f"{d.name}, sm_{d.compute_capability[0]}{d.compute_capability[1]}, {d.sm_count} SMs"


def resolve_gpu(value: str | None, targets=None, *, on_device: bool = True, where: str = "--gpu",
                probe=None) -> GpuChoice:
    """The GPU record for a command's ``--gpu`` option (``value``; None when the user named none).

    The detected device is the first visible CUDA device (cudart honours ``CUDA_VISIBLE_DEVICES``), matched
    to a registered record by :func:`detect` (``probe``: as there). ``targets``: name -> GpuTarget, or GpuTargets (default: the
    installed plugins'). ``on_device``: the command runs on that device, so a named record that is not the
    device's is a :class:`~mosaic.errors.BadInput`; a command that only lowers or runs on the CPU
    (``on_device=False``) takes a named record as asked (an offline use of that record). A named record on a
    device that matches no registered record is taken as asked (the user vouches for it).

    Without ``value``: the detected device's record; :data:`DEFAULT_GPU` when no device is visible (saying
    why); a BadInput naming ``mosaic gpus`` when the device matches no registered record.
    """
    from mosaic.errors import BadInput

    if targets is None:
        from mosaic.plugins import host

        targets = host().items("gpus")
    targets = dict(targets) if isinstance(targets, dict) else {t.name: t for t in targets}
    known = ", ".join(sorted(targets)) or "none installed (pip install mosaic-gpu-hopper)"
    if value is not None and value not in targets:
        raise BadInput(f"unknown gpu '{value}'; known: {known} (see mosaic gpus)", where)
    detection = detect(targets.values(), probe=probe)
    device = detection.devices[0] if detection.devices else None
    if value is not None:
        if device is None or (device.target is not None and device.target.name == value):
            return GpuChoice(value, "given", where, device)
        if device.target is None:  # the user vouches for a device no record describes
            return GpuChoice(value, "given", f"{where}; the detected {_device_text(device)} matches no registered "
                                             "record", device)
        if on_device:
            raise BadInput(f"GPU record '{value}' is not the detected device 0 ({_device_text(device)}: record "
                           f"'{device.target.name}'); name '{device.target.name}' or leave the GPU out to use the "
                           "detected one", where)
        return GpuChoice(value, "given", f"{where}; not the detected {device.name} (record '{device.target.name}'): "
                                         "this command does not run on it", device)
    if device is None:
        if DEFAULT_GPU not in targets:
            raise BadInput(f"no GPU is visible ({detection.reason}) and the default GPU record '{DEFAULT_GPU}' is "
                           f"not registered; known: {known}; name one with --gpu", where)
        return GpuChoice(DEFAULT_GPU, "default", f"default; no GPU visible: {detection.reason}")
    if device.target is None:
        raise BadInput(f"the detected device 0 ({_device_text(device)}) matches no registered GPU record "
                       f"(known: {known}); see mosaic gpus, or name a record with --gpu", where)
    return GpuChoice(device.target.name, "detected", f"detected: {device.name}", device)
