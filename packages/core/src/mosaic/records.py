"""The attrs records that flow through Mosaicist.

Values are frozen and validated at construction by the public validators of :mod:`mosaic.fields`: a bad
field raises :class:`~mosaic.errors.RecordError` whose message names the record, the field, the value and
what is allowed. Every record converts to and from plain JSON (``to_json`` / ``from_json``) so bundles and
reports never need pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mosaic.errors import RecordError
from mosaic.fields import dim3, fail, name_field, non_negative_int, one_of, positive, sm_arch, to_dim3

LAYERS = ("launch", "instruction", "control", "sequence", "numerics", "machine")
EDIT_CLASSES = ("knob", "rewrite")
DTYPES = ("f64", "f32", "tf32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i8", "i4", "i32")
TIMING_SOURCES = ("cupti", "cuda-events")


def _to_dict(value: Any) -> Any:
    """A mapping (or anything ``dict()`` takes) as a dict; anything else unchanged, for the validator to refuse."""
    try:
        return dict(value)
    except (TypeError, ValueError):
        return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, frozenset):
        return sorted(value)
    return value


class JsonRecord:
    """Mixin: plain-JSON round trip that goes through the validators on the way in."""

    def to_json(self) -> dict:
        return {a.name: _jsonable(getattr(self, a.name)) for a in attrs.fields(type(self))}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]):
        if not isinstance(data, Mapping):
            raise RecordError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RecordError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            return cls(**data)
        except TypeError as exc:  # a missing required field
            raise RecordError(f"{cls.__name__}: {exc}") from None


@attrs.frozen
class GpuTarget(JsonRecord):
    """One GPU model: what lowering checks, occupancy and roofline guards need to know.

    Figures come from datasheets or ``cudaGetDeviceProperties`` readings; the record that defines them
    cites which in a comment. Memory sizes are bytes, bandwidth GB/s (1e9 B/s), throughput TFLOP/s dense.
    """

    name: str = attrs.field(validator=name_field)
    display_name: str = attrs.field(validator=attrs.validators.instance_of(str))
    arch: str = attrs.field(validator=sm_arch)
    compute_capability: tuple = attrs.field(converter=tuple)
    sm_count: int = attrs.field(validator=positive)
    smem_per_sm: int = attrs.field(validator=positive)
    smem_per_block: int = attrs.field(validator=positive)
    regs_per_sm: int = attrs.field(validator=positive)
    l2_bytes: int = attrs.field(validator=positive)
    hbm_bandwidth_gbs: float = attrs.field(validator=positive)
    memory_bytes: int = attrs.field(validator=positive)
    peak_bf16_tflops: float = attrs.field(validator=positive)
    peak_fp8_tflops: float = attrs.field(validator=positive)
    max_cluster_size: int = attrs.field(validator=positive)
    max_regs_per_thread: int = attrs.field(default=255, validator=positive)
    max_threads_per_sm: int = attrs.field(default=2048, validator=positive)
    max_threads_per_block: int = attrs.field(default=1024, validator=positive)
    max_blocks_per_sm: int = attrs.field(default=32, validator=positive)
    reg_alloc_unit: int = attrs.field(default=256, validator=positive)
    smem_reserved_per_block: int = attrs.field(default=1024, validator=non_negative_int)
    device_names: tuple = attrs.field(default=(), converter=tuple)

    @compute_capability.validator
    def _cc(self, attribute, value):
        if len(value) != 2 or not all(isinstance(v, int) and v >= 0 for v in value):
            fail(self, attribute, value, "(major, minor) integers, e.g. (9, 0)")

    @smem_per_block.validator
    def _smem_block(self, attribute, value):
        if value > self.smem_per_sm:
            fail(self, attribute, value, f"<= smem_per_sm ({self.smem_per_sm})")

    def matches(self, device_name: str, cc: tuple[int, int], sm_count: int) -> bool:
        """True when a device reported by the driver is this record (name, compute capability, SM count)."""
        lowered = device_name.lower()
        named = any(n.lower() in lowered for n in self.device_names) if self.device_names else False
        return named and tuple(cc) == self.compute_capability and sm_count == self.sm_count


@attrs.frozen
class KernelSpec(JsonRecord):
    """What a kernel computes and how it is configured: family, problem shape, dtype, language, knobs."""

    family: str = attrs.field(validator=name_field)
    shape: Mapping = attrs.field(converter=_to_dict)
    dtype: str = attrs.field(validator=one_of(*DTYPES))
    language: str = attrs.field(validator=name_field)
    knobs: Mapping = attrs.field(factory=dict, converter=_to_dict)
    name: str = attrs.field(default="", validator=attrs.validators.instance_of(str))

    @shape.validator
    def _shape(self, attribute, value):
        if not isinstance(value, dict):
            fail(self, attribute, value, "a mapping of dimension name to positive integer, e.g. {'m': 4096}")
        for k, v in value.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or v < 1:
                fail(self, attribute, value, "a mapping of dimension name to positive integer, e.g. {'m': 4096}")

    @knobs.validator
    def _knobs(self, attribute, value):
        if not isinstance(value, dict):
            fail(self, attribute, value, "a mapping of knob name to a JSON scalar or list")
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, str | int | float | bool | list | tuple | type(None)):
                fail(self, attribute, value, "a mapping of knob name to a JSON scalar or list")

    def __hash__(self) -> int:  # dict fields: hash the JSON form
        return hash(repr(sorted(self.to_json().items())))


@attrs.frozen
class LaunchRecord(JsonRecord):
    """How a kernel was launched, as the CUPTI activity record (or the cubin, or events) reported it."""

    kernel_name: str = attrs.field(validator=attrs.validators.instance_of(str))
    grid: tuple = attrs.field(converter=to_dim3, validator=dim3)
    block: tuple = attrs.field(converter=to_dim3, validator=dim3)
    cluster: tuple = attrs.field(default=(1, 1, 1), converter=to_dim3, validator=dim3)
    static_smem: int = attrs.field(default=0, validator=non_negative_int)
    dynamic_smem: int = attrs.field(default=0, validator=non_negative_int)
    registers_per_thread: int = attrs.field(default=0, validator=non_negative_int)
    local_mem_per_thread: int = attrs.field(default=0, validator=non_negative_int)
    source: str = attrs.field(default="cupti", validator=one_of("cupti", "cuda-events", "cubin", "driver"))

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


@attrs.frozen
class ResourceUsage(JsonRecord):
    """What the assembler reported for one kernel (ptxas -v / the cubin's attributes)."""

    registers: int = attrs.field(validator=non_negative_int)
    static_smem: int = attrs.field(default=0, validator=non_negative_int)
    spill_stores: int = attrs.field(default=0, validator=non_negative_int)
    spill_loads: int = attrs.field(default=0, validator=non_negative_int)
    stack_frame: int = attrs.field(default=0, validator=non_negative_int)
    constant_bytes: int = attrs.field(default=0, validator=non_negative_int)


@attrs.frozen
class Discrepancy(JsonRecord):
    """One ranked difference between two fingerprints; each row points at an edit."""

    layer: str = attrs.field(validator=one_of(*LAYERS))
    key: str = attrs.field(validator=attrs.validators.instance_of(str))
    reference: Any
    candidate: Any
    rank: int = attrs.field(validator=positive)
    edit: str = attrs.field(validator=one_of(*EDIT_CLASSES))
    where: str = attrs.field(default="kernel", validator=attrs.validators.instance_of(str))
    why: str = attrs.field(default="", validator=attrs.validators.instance_of(str))


@attrs.frozen
class Language:
    """A kernel language a plugin provides (``register_languages``).

    ``families`` lists the kernel families it can build (``gemm``, ...); ``capabilities`` names what works
    where (``"cpu-lowering"``, ``"gpu-capture"``, ``"interpreter"``, ...), so a missing ability is stated,
    not silently skipped. ``backend`` is the object that builds and captures (see ``hookspecs``); it is
    ``None`` until the plugin implements it.
    """

    name: str = attrs.field(validator=name_field)
    summary: str = attrs.field(validator=attrs.validators.instance_of(str))
    families: tuple = attrs.field(default=(), converter=tuple)
    capabilities: frozenset = attrs.field(default=frozenset(), converter=frozenset)
    backend: Any = attrs.field(default=None, eq=False)
    #: bundle directories the plugin ships: captures of its kernels on a GPU, the reference that
    #: ``mosaic run`` diffs against on a machine without one (matched by the manifest's kernel and gpu)
    references: tuple = attrs.field(default=(), converter=lambda v: tuple(str(x) for x in v), eq=False)


@attrs.frozen
class Construct:
    """One concept of the construct catalog as written in one language (``register_constructs``)."""

    concept: str = attrs.field(validator=name_field)
    language: str = attrs.field(validator=name_field)
    expression: str = attrs.field(validator=attrs.validators.instance_of(str))
    analogue: str = attrs.field(default="direct", validator=one_of("direct", "partial", "none"))
    notes: str = ""

    @property
    def name(self) -> str:
        return f"{self.concept}@{self.language}"


@attrs.frozen
class Oracle:
    """A float64 reference for one kernel family (``register_oracles``)."""

    family: str = attrs.field(validator=name_field)
    summary: str = attrs.field(validator=attrs.validators.instance_of(str))
    reference: Any = attrs.field(eq=False)

    @property
    def name(self) -> str:
        return self.family


@attrs.frozen
class Proposer:
    """A source of edits for the convergence loop (``register_proposers``)."""

    name: str = attrs.field(validator=name_field)
    summary: str = attrs.field(validator=attrs.validators.instance_of(str))
    factory: Any = attrs.field(eq=False)
