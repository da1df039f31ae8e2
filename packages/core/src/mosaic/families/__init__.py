"""Kernel families: one :class:`~mosaic.records.Family` record per family -- its dimensions and shape
parser, seeded input generators (formats, seeds, value distributions including adversarial ones), the
name of its float64 oracle (:mod:`mosaic.oracle`), FLOP and byte counts (the physical floor on a
GpuTarget) and its yardsticks -- in a registry that plugins extend through ``register_families``.

:func:`registry` is the built-ins (:mod:`mosaic.families.builtin`, one module per family beside it:
``gemm``, ``attention``, ``rmsnorm``, ``softmax``) plus every plugin's; :func:`get` finds one by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mosaic.errors import BadInput, MosaicError, PluginError
from mosaic.families.floor import DTYPE_BYTES, dtype_bytes, floor_ns
from mosaic.families.inputs import DISTRIBUTIONS
from mosaic.records import Family, Yardstick

YARDSTICK = "cublas"  # the GEMM yardstick's language name (a library call, no lowering); see yardsticks()

__all__ = ["YARDSTICK", "DTYPE_BYTES", "DISTRIBUTIONS", "Family", "Yardstick", "registry", "get",
           "providers", "dtype_bytes", "dims", "parse_shape", "input_generator", "make_inputs", "physical_floor_ns",
           "first_yardstick", "yardstick_names", "yardstick_runnable", "YardstickUnavailable", "yardstick_problem",
           "run_yardstick", "flops"]

_CACHE: dict[int, tuple[Any, dict[str, Family], dict[str, str]]] = {}


def _collect() -> tuple[dict[str, Family], dict[str, str]]:
    from mosaic.families import builtin
    from mosaic.plugins import host

    h = host()
    cached = _CACHE.get(id(h))
    if cached is not None and cached[0] is h:
        return cached[1], cached[2]
    found: dict[str, Family] = {}
    owner: dict[str, str] = {}

    def register(item: Family) -> None:
        if not isinstance(item, Family):
            raise PluginError(f"mosaic-core registered a {type(item).__name__} where register_families takes a "
                              "Family")
        found[item.name] = item
        owner[item.name] = "mosaic-core"

    builtin.register_families(register)
    for name, reg in h.registries["families"].items():
        if name in found:
            raise PluginError(f"family '{name}' is built into mosaic-core and registered again by "
                              f"{reg.distribution}")
        found[name] = reg.item
        owner[name] = reg.distribution
    _CACHE.clear()
    _CACHE[id(h)] = (h, dict(sorted(found.items())), owner)
    return _CACHE[id(h)][1], owner


def registry() -> dict[str, Family]:
    """Every family: the built-ins plus those plugins register through ``register_families``, by name."""
    return dict(_collect()[0])


def providers() -> dict[str, str]:
    """family name -> the distribution that registered it (``mosaic-core`` for the built-ins)."""
    return dict(_collect()[1])


def get(name: str) -> Family | None:
    """The family called ``name``, or None."""
    return _collect()[0].get(name)


def optional_default(family: Family, shape: Mapping[str, int], name: str):
    """The value of the optional shape entry ``name`` when ``shape`` leaves it out: the value the family's
    ``canonical`` drops (it drops exactly the optional entries that hold their default), tried among 0, 1 and
    the shape's own values (attention: ``causal`` 0, ``kv_heads`` = ``heads``); None when none is dropped."""
    if family.canonical is None:
        return None
    for value in (0, 1, *shape.values()):
        try:
            if name not in family.canonical({**shape, name: value}):
                return value
        except (ValueError, KeyError, TypeError):
            continue
    return None


def full_shape(family: str, shape: Mapping[str, int]) -> dict:
    """``shape`` with every optional entry of ``family`` filled in (its default where the canonical shape dropped
    it), so a kernel file's operand may name ``kv_heads`` (and a knob ``causal``) whatever the shape holds."""
    out = dict(shape)
    fam = get(family)
    for name in (getattr(fam, "optional_dims", None) or {}) if fam is not None else ():
        if name not in out:
            value = optional_default(fam, out, name)
            if value is not None:
                out[name] = value
    return out


def _known() -> str:
    return ", ".join(_collect()[0])


def dims(family: str) -> tuple[str, ...] | None:
    """The family's dimension names in ``--shape AxBxC`` order (None for a family nobody registered)."""
    f = get(family)
    return f.dims if f is not None else None


MAX_DIM = 2**40  # one problem dimension (a bound on hostile shapes, far above any kernel's)
MAX_SHAPE_TEXT = 200  # characters of a shape written as text


def parse_shape(family: str, shape: Any, where: str = "--shape") -> dict[str, int]:
    """``4096x4096x4096`` (dimension order of the family), ``m=4096,n=4096,k=4096`` or a mapping; a family's
    optional dimensions (attention's ``kv_heads``, ``causal``) only by name. Returns the canonical shape
    (optional dimensions that hold their default are dropped)."""
    if isinstance(shape, str) and len(shape) > MAX_SHAPE_TEXT:
        raise BadInput(f"a shape of {len(shape):,} characters is over the limit of {MAX_SHAPE_TEXT}", where)
    f = get(family)
    if isinstance(shape, Mapping):
        out = dict(shape)
    elif isinstance(shape, str) and "=" in shape:
        out = {}
        for part in shape.split(","):
            name, _, value = part.partition("=")
            out[name.strip()] = _int(value, where)
    elif isinstance(shape, str) and re.fullmatch(r"\d+(x\d+)*", shape.strip().lower()):
        values = [_int(v, where) for v in shape.strip().lower().split("x")]
        if f is None:
            raise BadInput(f"family '{family}' has no default dimension order; write the shape as name=value,...",
                           where)
        names = f.dims
        if len(values) != len(names):
            raise BadInput(f"{family} shape needs {len(names)} dimensions ({'x'.join(names)}), got {shape!r}", where)
        out = dict(zip(names, values, strict=True))
    else:
        raise BadInput(f"shape {shape!r} is not AxBxC, name=value,... or a table", where)
    optional = set(f.optional_dims) if f is not None else set()
    for k, v in out.items():
        low = 0 if k in optional else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            what = "a non-negative" if low == 0 else "a positive"
            raise BadInput(f"shape dimension {str(k)[:40]}={_show(v)} must be {what} integer", where)
        if v > MAX_DIM:
            raise BadInput(f"shape dimension {str(k)[:40]}={_show(v)} is over the limit of 2**40", where)
    if f is not None:
        missing, extra = set(f.dims) - set(out), set(out) - set(f.dims) - optional
        if missing or extra:
            more = f" (optional: {', '.join(f.optional_dims)})" if f.optional_dims else ""
            raise BadInput(f"{family} shape needs dimensions {', '.join(f.dims)}{more}; got {', '.join(sorted(out))}",
                           where)
        if f.canonical is not None:
            try:
                out = dict(f.canonical(out))
            except ValueError as exc:
                raise BadInput(str(exc), where) from None
        zero = sorted(k for k, v in out.items() if v < 1)
        if zero:
            raise BadInput(f"{family} shape dimension {zero[0]}={out[zero[0]]} must be a positive integer", where)
    return out


def _int(text: str, where: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise BadInput(f"shape value {text[:40]!r} is not an integer", where) from None


def _show(v: Any) -> str:
    text = repr(v) if not isinstance(v, int) or abs(v) < 10**30 else f"<an integer of {len(str(abs(v)))} digits>"
    return text if len(text) <= 60 else text[:57] + "..."


def input_generator(spec, values: str) -> Family:
    """The family of ``spec`` once it is known to generate ``spec.dtype`` inputs from distribution ``values``;
    raises BadInput (one line) otherwise. ``mosaic capture`` asks before it starts a child."""
    f = get(spec.family)
    if f is None:
        raise BadInput(f"unknown family '{spec.family}'; known: {_known()}", "--family")
    if f.make_inputs is None:
        raise BadInput(f"capture has no input generator for family '{spec.family}' yet", "--family")
    if f.distributions and values not in f.distributions:
        raise BadInput(f"family '{spec.family}' has no value distribution '{values}'; it has: "
                       f"{', '.join(f.distributions)}", "--values")
    if f.dtypes and spec.dtype not in f.dtypes:
        raise BadInput(f"family '{spec.family}' generates inputs in {', '.join(f.dtypes)}, not {spec.dtype}",
                       "--dtype")
    return f


def make_inputs(spec, seed: int, values: str) -> dict:
    """Seeded inputs for ``spec``'s family, as float32 arrays representable in ``spec.dtype``, drawn from the
    distribution ``values`` (``normal``, ``int``, ``large``, ``equal-rows``, ``denormal``: see
    :mod:`mosaic.families.inputs` and each family's ``make_inputs``)."""
    return input_generator(spec, values).make_inputs(dict(spec.shape), spec.dtype, seed, values)


def physical_floor_ns(family: str, shape: Mapping[str, int], dtype: str, gpu) -> float:
    """max(flops / peak, bytes / bandwidth) for the problem on the GPU record (0 when the family is unknown)."""
    f = get(family)
    return 0.0 if f is None else floor_ns(f, shape, dtype, gpu)


def flops(family: str, shape: Mapping[str, int], dtype: str) -> float | None:
    """The problem's floating-point operations (the family's ``work``; what a TFLOP/s figure divides by);
    None for a family nobody registered here."""
    f = get(family)
    return None if f is None else float(f.work(dict(shape), dtype_bytes(dtype))[0])


class YardstickUnavailable(MosaicError):
    """A yardstick whose library is not installed here (its import failed): recorded, never a crash."""

    #: what a capture records of it (``capture.summary.error_code``) so the campaign names why it has no figure
    code = "unavailable"


def yardstick_problem(yard: Yardstick, dtype: str) -> str | None:
    """Why ``yard`` cannot run a ``dtype`` problem (a format it does not take), or None: asked before any
    process is started for it."""
    if yard.dtypes and dtype not in yard.dtypes:
        return f"the {yard.name} yardstick takes {', '.join(yard.dtypes)}, not {dtype}"
    return None


def run_yardstick(yard: Yardstick, inputs: Mapping[str, Any], dtype: str, device: str = "cuda"):
    """``yard``'s Runnable on these inputs; :class:`YardstickUnavailable` (one line naming what to install) when
    its library does not import here."""
    try:
        return yard.runnable(inputs, dtype, device)
    except ImportError as exc:
        raise YardstickUnavailable(f"the {yard.name} yardstick needs {yard.library}, which does not import here "
                                   f"({type(exc).__name__}: {exc})", "yardstick") from None


def yardstick_names() -> set[str]:
    """The name of every family's every yardstick (each one's KernelSpec ``language``)."""
    return {y.name for f in _collect()[0].values() for y in f.yardsticks}


def first_yardstick(family: str) -> Yardstick:
    """The yardstick a campaign of ``family`` times beside its candidates: the family's first (cuBLAS for
    GEMM). Raises MosaicError for a family with none."""
    f = get(family)
    if f is None or not f.yardsticks:
        raise MosaicError(f"family '{family}' has no yardstick" if f is not None else
                          f"unknown family '{family}'; known: {_known()}", "yardstick")
    return f.yardsticks[0]


def yardstick_runnable(spec, inputs: Mapping[str, Any], device: str = "cuda"):
    """The Runnable of ``spec``'s family's yardstick named ``spec.language`` (``cublas`` for GEMM) on these
    inputs."""
    f = get(spec.family)
    y = f.yardstick(spec.language) if f is not None else None
    if y is None:
        covers = ", ".join(n for n, x in _collect()[0].items() if x.yardstick(spec.language) is not None)
        has = ", ".join(x.name for x in f.yardsticks) if f is not None else ""
        raise MosaicError(f"the {spec.language} yardstick covers {covers or 'no family'}, not {spec.family}"
                          + (f" (whose yardsticks are {has})" if has else ""), "yardstick")
    return run_yardstick(y, inputs, spec.dtype, device)
