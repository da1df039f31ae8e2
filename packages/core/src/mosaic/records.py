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
from mosaic.fields import (
    NAME_RE,
    dim3,
    fail,
    name_field,
    non_negative_int,
    one_of,
    positive,
    sm_arch,
    to_dim3,
)

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
    #: the key of the cause row this row is a consequence of (``mosaic.lift.causes``); "" for a cause
    cause: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    #: expected share of the candidate's time gap the row explains (a cause's includes its symptoms')
    cost: float = attrs.field(default=0.0, converter=float)


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


#: which way a source rewrite moves a concept: ``gain`` makes the candidate show a concept the reference shows
#: (exact ``expf`` -> ``__expf`` when the reference's exp is approximate), ``lose`` removes one only the candidate shows
REWRITE_SIDES = ("gain", "lose")


@attrs.frozen
class Rewrite:
    """A mechanical source rewrite of one catalog concept in one language (``register_rewrites``).

    ``apply(text) -> text`` edits a kernel file's source (Python through :mod:`ast`, C++ through a
    comment- and string-safe edit of the named construct) and raises :class:`mosaic.rewrites.NotApplicable`
    when the file has nothing it edits. ``rows`` are the diff row keys whose difference it targets; ``side``
    says whether it gives the candidate the reference's form of the concept or takes the candidate's away.
    """

    rewrite: str = attrs.field(validator=name_field)
    language: str = attrs.field(validator=name_field)
    concept: str = attrs.field(validator=name_field)
    rows: tuple = attrs.field(converter=tuple)
    side: str = attrs.field(validator=one_of(*REWRITE_SIDES))
    summary: str = attrs.field(validator=attrs.validators.instance_of(str))
    apply: Any = attrs.field(eq=False, repr=False)
    #: the form tokens of the row's value this rewrite produces / removes (``exp.form``: ``approx``)
    forms: tuple = attrs.field(default=(), converter=tuple)

    @property
    def name(self) -> str:
        return f"{self.rewrite}@{self.language}"

    def to_json(self) -> dict:
        return {"name": self.name, "rewrite": self.rewrite, "language": self.language, "concept": self.concept,
                "rows": list(self.rows), "side": self.side, "forms": list(self.forms), "summary": self.summary}


#: the public exploit families ``mosaic trust`` covers (seeds/mosaicist.txt's "the harness cannot be gamed"):
#: name -> what the candidate does; :mod:`mosaic.trust` says which run where
EXPLOIT_KINDS = (
    "side-stream", "lazy-output", "timer-patch", "replayed-output", "inputs-in-place", "bad-output",
    "precision-downgrade", "partial-work", "closed-form", "seed-answer", "hard-coded-shape", "library-fallback",
    "library-call", "timed-fast-path", "super-batching", "cache-warming", "uninitialised-smem", "data-race",
    "writes-campaign", "control",
)


@attrs.frozen
class Exploit:
    """An adversarial kernel file of one exploit family (``register_exploits``): submitted to the numerics gate
    the way an agent's source candidate is, it must be rejected; ``kind="control"`` is an honest kernel the gate
    must pass (a gate that rejects everything proves nothing)."""

    exploit: str = attrs.field(validator=name_field)
    kind: str = attrs.field(validator=one_of(*EXPLOIT_KINDS))
    language: str = attrs.field(validator=name_field)
    family: str = attrs.field(validator=name_field)
    path: str = attrs.field(validator=attrs.validators.instance_of(str))
    summary: str = attrs.field(validator=attrs.validators.instance_of(str))
    dtype: str = "bf16"
    shape: Mapping = attrs.field(factory=dict, converter=dict)  # the campaign's shape (the family's example if empty)
    knobs: Mapping = attrs.field(factory=dict, converter=dict)
    needs: str = attrs.field(default="cpu", validator=one_of("cpu", "gpu"))

    @property
    def name(self) -> str:
        return f"{self.exploit}@{self.language}"

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "language": self.language, "family": self.family,
                "path": self.path, "summary": self.summary, "dtype": self.dtype, "shape": dict(self.shape),
                "knobs": dict(self.knobs), "needs": self.needs}


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


def _names(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A tuple of distinct lower-case names (dimension, distribution or yardstick names)."""
    if not isinstance(value, tuple) or not all(isinstance(v, str) and NAME_RE.match(v) for v in value) \
            or len(set(value)) != len(value):
        fail(inst, attribute, value, "a tuple of distinct lower-case names")


def _dtypes(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple) or any(v not in DTYPES for v in value):
        fail(inst, attribute, value, f"a tuple of formats from {', '.join(DTYPES)}")


def _callable_or_none(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not callable(value):
        fail(inst, attribute, value, "a callable or None")


@attrs.frozen
class Yardstick:
    """A library implementation of a family, timed beside the candidates (declared data plus one callable).

    ``name`` is what users, the journal and the yardstick's KernelSpec (as its ``language``) call it:
    ``cublas``, ``torch-sdpa``, ``flash-attn-4``. ``library`` is the distribution that provides it (what to
    install). ``runnable(inputs, dtype, device="cuda")`` returns a :class:`mosaic.backend.Runnable` on the
    family's inputs; it imports its library only when called and runs on the GPU (torch ones also run on
    ``device="cpu"`` for tests of the contract). ``requires`` says what else it needs (``sm_90a or sm_100a``); ``call`` is the function it times (the name its KernelSpec records), ``title`` how reports name it.
    """

    name: str = attrs.field(validator=name_field)
    summary: str = attrs.field(validator=attrs.validators.instance_of(str))
    library: str = attrs.field(validator=attrs.validators.instance_of(str))
    dtypes: tuple = attrs.field(converter=tuple, validator=_dtypes)
    runnable: Any = attrs.field(eq=False, validator=_callable_or_none)
    requires: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    call: str = attrs.field(default="", validator=attrs.validators.instance_of(str))  # e.g. torch.matmul
    title: str = attrs.field(default="", validator=attrs.validators.instance_of(str))  # e.g. cuBLAS (reports)

    def to_json(self) -> dict:
        return {"name": self.name, "summary": self.summary, "library": self.library, "dtypes": list(self.dtypes),
                "requires": self.requires, "call": self.call, "title": self.title or self.name}


@attrs.frozen
class Family:
    """One kernel family (``register_families``): what core needs to generate, check and judge its kernels.

    ``dims``: the dimension names in the order ``--shape AxBxC`` lists them; ``optional_dims``: more shape
    entries a shape may carry (name -> what it means and its default, e.g. attention's ``kv_heads``).
    ``canonical(shape)`` (optional) checks the relations between dimensions and drops optional ones that
    equal their default, raising ``ValueError`` with a readable message. ``work(shape, e)`` -> (FLOPs, bytes
    moved) for elements of ``e`` bytes: the physical floor is ``max(flops / peak, bytes / bandwidth)`` on a
    :class:`GpuTarget`, and ``floor`` says it as a formula. ``make_inputs(shape, dtype, seed, values)`` ->
    float32 arrays holding values of ``dtype`` (None: capture cannot generate inputs), for the formats in
    ``dtypes`` and the value distributions named in ``distributions``. ``oracle``: the name of its float64
    reference in the oracle registry (``register_oracles``). ``yardsticks``: the libraries timed beside it.
    ``example``: a small shape (default: every dimension 8) that ``mosaic families --check`` tries.
    """

    name: str = attrs.field(validator=name_field)
    summary: str = attrs.field(validator=attrs.validators.instance_of(str))
    dims: tuple = attrs.field(converter=tuple, validator=_names)
    work: Any = attrs.field(eq=False, validator=_callable_or_none)
    floor: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    optional_dims: Mapping = attrs.field(factory=dict, converter=_to_dict)
    canonical: Any = attrs.field(default=None, eq=False, validator=_callable_or_none)
    dtypes: tuple = attrs.field(default=(), converter=tuple, validator=_dtypes)
    distributions: tuple = attrs.field(default=(), converter=tuple, validator=_names)
    make_inputs: Any = attrs.field(default=None, eq=False, validator=_callable_or_none)
    oracle: str = attrs.field(default=attrs.Factory(lambda self: self.name, takes_self=True),
                              validator=name_field)
    yardsticks: tuple = attrs.field(default=(), converter=tuple)
    example: Mapping = attrs.field(factory=dict, converter=_to_dict)  # a small shape for checks and docs

    @dims.validator
    def _dims(self, attribute, value):
        if not value:
            fail(self, attribute, value, "at least one dimension name")

    @optional_dims.validator
    def _optional(self, attribute, value):
        if not isinstance(value, dict) or not all(isinstance(k, str) and NAME_RE.match(k) and isinstance(v, str)
                                                  for k, v in value.items()) or set(value) & set(self.dims):
            fail(self, attribute, value, "a mapping of dimension name (not one of dims) to its description")

    @yardsticks.validator
    def _yardsticks(self, attribute, value):
        if not all(isinstance(y, Yardstick) for y in value) or len({y.name for y in value}) != len(value):
            fail(self, attribute, value, "a tuple of Yardstick records with distinct names")

    @work.validator
    def _work(self, attribute, value):
        if value is None:
            fail(self, attribute, value, "a callable work(shape, element_bytes) -> (flops, bytes)")

    def yardstick(self, name: str) -> Yardstick | None:
        """The yardstick called ``name`` (None: the family has none of that name)."""
        return next((y for y in self.yardsticks if y.name == name), None)
