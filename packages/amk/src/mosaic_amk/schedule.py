"""The AMK schedule IR: an SM-level task DAG synchronised only by monotonic counters.

A :class:`Schedule` is what lowering produces, what the validator checks and what the VMs run. Its JSON
form (``{"format": "mosaic-amk-schedule", "version": 1, ...}``) is a public contract, documented in
docs/amk-schedule.md. Execution semantics, in one paragraph: counters start at zero; each SM walks its
queue (its tasks in task-list order); a task waits until every ``(counter, threshold)`` pair holds
(``counter >= threshold``, acquire), runs its op (reads ``inputs``, writes ``outputs``), then
increments exactly its ``signal`` counter by one (release).

The records validate *types* (and the dtype/kind vocabularies) at construction. Everything that
relates one part of a schedule to another (a buffer name that does not exist, a counter out of
bounds, a capacity overflow) is representable on purpose: finding those is the validator's job,
and the audit builds such schedules deliberately.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from mosaic import limits
from mosaic.errors import BadInput
from mosaic.fields import fail

FORMAT = "mosaic-amk-schedule"
VERSION = 1
DTYPES = ("bf16", "f32", "i8", "i4", "i32", "int8", "q8_0", "q4_1")  # the last three: quant.FORMATS (weights)
BUFFER_KINDS = ("weight", "activation", "kv_cache", "input", "output", "scratch")
# The VM's task-descriptor ABI (fixed slots): checked by the validator's `capacity` rule.
MAX_INPUTS = 8
MAX_OUTPUTS = 4
MAX_WAITS = 8
MAX_RANK = 4
# Physical bounds the validator's `capacity` rule checks (no GPU, no VM goes past them): SMs per GPU
# (an H200 has 132), counters, elements of one buffer (2**36 bf16 = 128 GiB) and a head's dimension
# (the CUDA VM's attention reads at most 512; 1024 leaves room for any real model).
MAX_SMS = 1024
MAX_COUNTERS = 2**24
MAX_ELEMENTS = 2**36
MAX_HEAD_DIM = 1024
# The page protocol (docs/amk-schedule.md "Pages"): per task at most this many page acquires, uses and releases (the
# descriptor's fixed slots), and a pool no larger than an SM's shared memory (sm_90: 227 KiB per block, opt-in).
MAX_PAGE_OPS = 8
MAX_POOL_BYTES = 232448
# bytes per element of each dtype as the device lays a row out; the block formats add per-block or per-row scales
# (row_bytes): int8 a float32 scale per row, q8_0 34 bytes per 32 elements, q4_1 20 bytes per 32
_ELEMENT_BYTES = {"bf16": 2, "f32": 4, "i8": 1, "i32": 4, "int8": 1}


class ScheduleFormatError(BadInput):
    """Not a schedule at all: not JSON, wrong format tag, wrong version, or (for ``load_schedule``)
    a structure the records cannot hold. Exit 2."""


def row_bytes(dtype: str, shape: tuple) -> int:
    """Bytes of one row (axis 0) of a buffer as the device stores it: what a page holding that row takes."""
    cols = 1
    for d in shape[1:]:
        cols *= d
    if dtype == "i4":
        return -(-cols // 2)
    if dtype == "q8_0":
        return -(-cols // 32) * 34
    if dtype == "q4_1":
        return -(-cols // 32) * 20
    return cols * _ELEMENT_BYTES[dtype] + (4 if dtype == "int8" else 0)


def _int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(inst, attribute, value, "an integer")


def _str(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str):
        fail(inst, attribute, value, "a string")


def _str_tuple(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple) or any(not isinstance(v, str) for v in value):
        fail(inst, attribute, value, "a list of buffer names (strings)")


def _int_tuple(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        fail(inst, attribute, value, "a list of integers")


def _choice(*allowed: str):
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in allowed:
            fail(inst, attribute, value, "one of " + ", ".join(allowed))

    return check


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


def _ranges(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _tuple(v) for k, v in value.items()}
    return value


def _ranges_check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    ok = isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, tuple) and len(v) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        for k, v in value.items())
    if not ok:
        fail(inst, attribute, value, "an object mapping buffer names to [lo, hi] row ranges")


def _params_check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, dict) or any(not isinstance(k, str) for k in value):
        fail(inst, attribute, value, "a JSON object with string keys")


@attrs.frozen
class Buffer:
    """A named tensor the VM allocates. ``kind`` says who owns it: ``weight`` and ``input`` are
    written before launch, ``kv_cache`` persists between launches, ``activation``/``scratch`` live
    for one launch, ``output`` is read back after it."""

    name: str = attrs.field(validator=_str)
    dtype: str = attrs.field(validator=_choice(*DTYPES))
    shape: tuple = attrs.field(converter=_tuple, validator=_int_tuple)
    kind: str = attrs.field(validator=_choice(*BUFFER_KINDS))

    @property
    def rows(self) -> int:
        """Extent of axis 0 (1 for a scalar), the axis that task ``ranges`` refer to."""
        return self.shape[0] if self.shape else 1

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "kind": self.kind}

    @classmethod
    def from_json(cls, data: Any) -> Buffer:
        return _build(cls, data, ("name", "dtype", "shape", "kind"), ())


@attrs.frozen
class Wait:
    """Block until ``counters[counter] >= threshold`` (an acquire load)."""

    counter: int = attrs.field(validator=_int)
    threshold: int = attrs.field(validator=_int)

    def to_json(self) -> dict:
        return {"counter": self.counter, "threshold": self.threshold}

    @classmethod
    def from_json(cls, data: Any) -> Wait:
        return _build(cls, data, ("counter", "threshold"), ())


def _waits(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(Wait.from_json(v) if isinstance(v, Mapping) else v for v in value)
    return value


def _waits_check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple) or any(not isinstance(v, Wait) for v in value):
        fail(inst, attribute, value, "a list of waits {counter, threshold}")


def _of(kind: type, what: str):
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, tuple) or any(not isinstance(v, kind) for v in value):
            fail(inst, attribute, value, what)

    return check


@attrs.frozen
class PagePool:
    """One SM's pool of shared-memory pages: ``count`` pages (ids ``0 .. count-1``) of ``page_bytes`` bytes each."""

    sm: int = attrs.field(validator=_int)
    count: int = attrs.field(validator=_int)
    page_bytes: int = attrs.field(validator=_int)

    def to_json(self) -> dict:
        return {"sm": self.sm, "count": self.count, "page_bytes": self.page_bytes}

    @classmethod
    def from_json(cls, data: Any) -> PagePool:
        return _build(cls, data, ("sm", "count", "page_bytes"), ())


def _rows_check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not (isinstance(value, tuple) and len(value) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in value)):
        fail(inst, attribute, value, "[lo, hi] rows of axis 0")


@attrs.frozen
class PageFill:
    """A page the SM's loader acquires and fills: rows ``[lo, hi)`` of axis 0 of ``buffer`` copied into page ``page``
    of the SM's pool, once every wait ``(counter, threshold)`` holds (what the loaded data, or the page's reuse,
    depends on). The loader walks the SM's queue ahead of the compute warps and waits on nothing else."""

    page: int = attrs.field(validator=_int)
    buffer: str = attrs.field(validator=_str)
    rows: tuple = attrs.field(converter=_tuple, validator=_rows_check)
    waits: tuple = attrs.field(default=(), converter=_waits, validator=_waits_check)

    def to_json(self) -> dict:
        out = {"page": self.page, "buffer": self.buffer, "rows": list(self.rows)}
        if self.waits:
            out["waits"] = [w.to_json() for w in self.waits]
        return out

    @classmethod
    def from_json(cls, data: Any) -> PageFill:
        return _build(cls, data, ("page", "buffer", "rows"), ("waits",))


def _fills(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(PageFill.from_json(v) if isinstance(v, Mapping) else v for v in value)
    return value


@attrs.frozen
class TaskPages:
    """A task's page operations: ``acquire``, the fills the SM's loader makes at this task's place in the SM's
    queue; ``use``, the pages the task reads (each holds rows of one of its inputs, read from the page instead of
    global memory); ``release``, the pages it gives back after it runs (their contents are undefined from then on)."""

    acquire: tuple = attrs.field(default=(), converter=_fills, validator=_of(PageFill, "a list of page fills"))
    use: tuple = attrs.field(default=(), converter=_tuple, validator=_int_tuple)
    release: tuple = attrs.field(default=(), converter=_tuple, validator=_int_tuple)

    def to_json(self) -> dict:
        out: dict = {}
        if self.acquire:
            out["acquire"] = [f.to_json() for f in self.acquire]
        if self.use:
            out["use"] = list(self.use)
        if self.release:
            out["release"] = list(self.release)
        return out

    @classmethod
    def from_json(cls, data: Any) -> TaskPages:
        return _build(cls, data, (), ("acquire", "use", "release"))


def _task_pages(value: Any) -> Any:
    return TaskPages.from_json(value) if isinstance(value, Mapping) else value


def _task_pages_check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, TaskPages):
        fail(inst, attribute, value, "an object {acquire, use, release}")


@attrs.frozen(eq=True, hash=False)
class Task:
    """One unit of work on one SM: wait -> op -> signal.

    ``ranges`` (optional, documented extra field) narrows the task's access to a buffer it names to
    rows ``[lo, hi)`` of axis 0; without an entry the task touches the whole buffer. Row-split GEMVs
    and the KV-cache append at one position use it, so writers of disjoint rows do not conflict.
    """

    id: int = attrs.field(validator=_int)
    op: str = attrs.field(validator=_str)
    sm: int = attrs.field(validator=_int)
    inputs: tuple = attrs.field(converter=_tuple, validator=_str_tuple)
    outputs: tuple = attrs.field(converter=_tuple, validator=_str_tuple)
    waits: tuple = attrs.field(converter=_waits, validator=_waits_check)
    signal: int = attrs.field(validator=_int)
    params: dict = attrs.field(factory=dict, validator=_params_check)
    ranges: dict = attrs.field(factory=dict, converter=_ranges, validator=_ranges_check)
    # the page protocol (optional): None for a task without page operations
    pages: TaskPages | None = attrs.field(default=None, converter=_task_pages, validator=_task_pages_check)

    def to_json(self) -> dict:
        out = {"id": self.id, "op": self.op, "sm": self.sm, "inputs": list(self.inputs),
               "outputs": list(self.outputs), "waits": [w.to_json() for w in self.waits],
               "signal": self.signal, "params": _jsonable(self.params)}
        if self.ranges:
            out["ranges"] = {k: list(v) for k, v in self.ranges.items()}
        if self.pages is not None:
            out["pages"] = self.pages.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any) -> Task:
        return _build(cls, data, ("id", "op", "sm", "inputs", "outputs", "waits", "signal", "params"),
                      ("ranges", "pages"))

    def range_of(self, buffer: str, rows: int) -> tuple[int, int]:
        """Rows of ``buffer`` this task touches (the whole extent unless ``ranges`` narrows it)."""
        return self.ranges.get(buffer, (0, rows))


def _buffers(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(Buffer.from_json(v) if isinstance(v, Mapping) else v for v in value)
    return value


def _tasks(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(Task.from_json(v) if isinstance(v, Mapping) else v for v in value)
    return value


def _pools(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(PagePool.from_json(v) if isinstance(v, Mapping) else v for v in value)
    return value


@attrs.frozen(eq=True, hash=False)
class Schedule:
    """A whole decode step: SM count, buffers, counter count, the task list (the global topological
    order; an SM's queue is its tasks in list order) and the buffers read back as results."""

    num_sms: int = attrs.field(validator=_int)
    buffers: tuple = attrs.field(converter=_buffers, validator=_of(Buffer, "a list of buffers"))
    num_counters: int = attrs.field(validator=_int)
    tasks: tuple = attrs.field(converter=_tasks, validator=_of(Task, "a list of tasks"))
    outputs: tuple = attrs.field(converter=_tuple, validator=_str_tuple)
    meta: dict = attrs.field(factory=dict, validator=_params_check)
    # the page protocol (optional): one pool per SM that has pages; empty for a schedule without pages
    page_pools: tuple = attrs.field(default=(), converter=_pools, validator=_of(PagePool, "a list of page pools"))

    def has_pages(self) -> bool:
        """Whether the schedule uses the page protocol (a pool, or a task with page operations)."""
        return bool(self.page_pools) or any(t.pages is not None for t in self.tasks)

    # ---- helpers -------------------------------------------------------------------------------
    def buffer_map(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.buffers}

    def producers(self) -> dict[int, list[Task]]:
        """counter -> the tasks that signal it, in list order."""
        out: dict[int, list[Task]] = {}
        for t in self.tasks:
            out.setdefault(t.signal, []).append(t)
        return out

    def producers_of(self, counter: int) -> list[Task]:
        return [t for t in self.tasks if t.signal == counter]

    def queues(self) -> dict[int, list[Task]]:
        """sm -> its queue (its tasks in list order)."""
        out: dict[int, list[Task]] = {}
        for t in self.tasks:
            out.setdefault(t.sm, []).append(t)
        return out

    def task_by_id(self) -> dict[int, Task]:
        return {t.id: t for t in self.tasks}

    # ---- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        out = {"format": FORMAT, "version": VERSION, "num_sms": self.num_sms,
               "buffers": [b.to_json() for b in self.buffers], "num_counters": self.num_counters,
               "tasks": [t.to_json() for t in self.tasks], "outputs": list(self.outputs)}
        if self.meta:
            out["meta"] = _jsonable(self.meta)
        if self.page_pools:
            out["page_pools"] = [p.to_json() for p in self.page_pools]
        return out

    def dumps(self, indent: int | None = None) -> str:
        return json.dumps(self.to_json(), indent=indent)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.dumps(indent=1) + "\n")
        return path

    @classmethod
    def from_json(cls, data: Any, where: str = "schedule") -> Schedule:
        """Strict: raises :class:`ScheduleFormatError` for a wrong tag/version or any structure the
        records cannot hold. (``validator.validate`` takes raw JSON too and reports such problems as
        ``malformed`` diagnostics instead.)"""
        check_header(data, where)
        body = {k: v for k, v in data.items() if k not in ("format", "version")}
        try:
            return _build(cls, body, ("num_sms", "buffers", "num_counters", "tasks", "outputs"),
                          ("meta", "page_pools"))
        except BadInput as exc:
            raise ScheduleFormatError(exc.what, where) from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def _build(cls: type, data: Any, required: tuple, optional: tuple):
    if not isinstance(data, Mapping):
        raise BadInput(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in required if k not in data]
    if missing:
        raise BadInput(f"{cls.__name__}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise BadInput(f"{cls.__name__}: unknown field(s) {', '.join(map(str, unknown))}")
    return cls(**{k: data[k] for k in (*required, *optional) if k in data})


def check_header(data: Any, where: str = "schedule") -> None:
    """Raise :class:`ScheduleFormatError` unless ``data`` is a JSON object tagged as a version-1 schedule."""
    if not isinstance(data, Mapping):
        raise ScheduleFormatError(f"not a schedule: expected a JSON object, got {type(data).__name__}", where)
    if data.get("format") != FORMAT:
        raise ScheduleFormatError(f"not a schedule: format tag is {data.get('format')!r}, expected {FORMAT!r}",
                                  where)
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):
        raise ScheduleFormatError(f"unsupported schedule version {version!r}; this reader supports {VERSION}",
                                  where)


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_depth(data: bytes) -> int:
    """The deepest bracket nesting of a valid JSON text (strings skipped), in C-speed passes over the bytes."""
    import numpy as np

    bare = np.frombuffer(_STRING.sub(b"", data), np.uint8)
    deepest = base = 0
    step = 1 << 24
    for k in range(0, len(bare), step):
        ch = bare[k:k + step]
        d = np.cumsum(((ch == 91) | (ch == 123)).astype(np.int8) - ((ch == 93) | (ch == 125)), dtype=np.int64)
        if len(d):
            deepest = max(deepest, int(d.max()) + base)
            base += int(d[-1])
    return deepest


def read_schedule_json(path: str | Path) -> dict:
    """Read a file as schedule JSON through ``mosaic.limits``: a regular file (never a device or FIFO) no
    larger than the ``text_bytes`` limit, nested no deeper than ``nesting_depth``, no integer longer than
    ``int_digits``, no NaN/Infinity, at most ``schedule_tasks`` tasks. The header is checked (exit 2 if
    wrong); the body is returned raw so the validator can report every structural problem in it."""
    where = str(path)
    raw = limits.read_bytes(path, "text_bytes", where)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ScheduleFormatError("not a schedule: not UTF-8 text", where) from None
    digits = limits.limit("int_digits")

    def bounded_int(s: str) -> int:
        if len(s.lstrip("-")) > digits:
            raise limits.refuse("int_digits", len(s.lstrip("-")), where)
        return int(s)

    def no_constant(name: str):
        raise ScheduleFormatError(f"not a schedule: {name} is not a JSON value", where)

    try:
        data = json.loads(text, parse_int=bounded_int, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise ScheduleFormatError(f"not a schedule: not JSON ({exc.msg} at line {exc.lineno})", where) from None
    except RecursionError:
        raise ScheduleFormatError("not a schedule: JSON nested too deeply", where) from None
    del text
    depth = json_depth(raw)  # after the parse: the text is valid JSON, so every string ends (linear regex)
    del raw
    if depth > limits.limit("nesting_depth"):
        raise limits.refuse("nesting_depth", depth, where)
    check_header(data, where)
    tasks = data.get("tasks")
    if isinstance(tasks, list) and len(tasks) > limits.limit("schedule_tasks"):
        raise limits.refuse("schedule_tasks", len(tasks), where)
    return data


def load_schedule(path: str | Path) -> Schedule:
    """Load a schedule file into records. Raises :class:`ScheduleFormatError` (exit 2) for anything
    that is not a well-typed version-1 schedule. It does not validate safety: call ``validate``."""
    return Schedule.from_json(read_schedule_json(path), str(path))
