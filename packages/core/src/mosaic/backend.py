"""The contract between core and a kernel-language plugin.

A plugin's :class:`~mosaic.records.Language` carries a ``backend`` object with these methods. Core's
capture runs them in a child process (one kernel per process, with a timeout), so a crash or hang
in a backend kills only that process.

* ``knobs(family)`` -> the attrs knob class for a family; ``knobs_cls(**spec.knobs)`` validates a
  configuration at construction (a bad value raises ``RecordError`` naming the field and allowed values).
* ``lower(spec, gpu, workdir)`` -> :class:`Lowered`: compiles for ``gpu.arch`` with no GPU present;
  raises :class:`Unbuildable` (recorded and stepped over by the loop, never a crash) when the
  configuration cannot be built or does not fit the GpuTarget's budgets.
* ``prepare(spec, gpu, workdir, inputs)`` -> :class:`Runnable`: on a GPU, loads the kernel and places
  the inputs on the device; ``launch()`` enqueues exactly one run of the kernel (asynchronous, no
  synchronisation, no allocation — the timer brackets launches with CUPTI), ``output()`` copies the
  result to host as float32 numpy arrays, ``poison()`` fills the outputs with NaN before a run so an
  element that is never written cannot pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs
import numpy as np

from mosaic.errors import MosaicError
from mosaic.records import GpuTarget, KernelSpec, ResourceUsage


class Unbuildable(MosaicError):
    """A configuration that cannot be built (compile error, budget overflow). Recorded, stepped over."""

    exit_code = 1


@attrs.frozen
class Lowered:
    """What lowering produced: paths to the artifacts (any may be None) and the assembler's figures."""

    kernel_name: str
    ptx: Path | None = None
    cubin: Path | None = None
    sass: Path | None = None
    ptxas_log: Path | None = None
    source: Path | None = None
    resources: ResourceUsage | None = None
    toolchain: dict = attrs.field(factory=dict)
    notes: tuple = ()


@runtime_checkable
class Runnable(Protocol):
    def launch(self) -> None: ...

    def output(self) -> dict[str, np.ndarray]: ...

    def poison(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class LanguageBackend(Protocol):
    def knobs(self, family: str) -> type: ...

    def lower(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path) -> Lowered: ...

    def prepare(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path, inputs: dict[str, Any]) -> Runnable: ...
