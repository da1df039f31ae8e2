"""The record every kernel family fills in (one module per family beside this one) and the facts all share."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

#: bytes per element of each number format (the physical floor's memory traffic)
DTYPE_BYTES = {"f64": 8, "f32": 4, "tf32": 4, "f16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "i8": 1,
               "i4": 0.5, "i32": 4}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (2 for a format the table does not know)."""
    return DTYPE_BYTES.get(dtype, 2)


@attrs.frozen
class Family:
    """What core knows about one kernel family.

    ``dims``: the dimension names, in the order ``--shape AxBxC`` lists them. ``work(shape, e)``: the
    problem's (FLOPs, bytes moved) for elements of ``e`` bytes, from which the physical floor follows.
    ``make_inputs(shape, dtype, seed, values)``: seeded inputs for a capture (None: capture cannot generate
    them yet). ``yardstick(inputs, dtype)``: a library Runnable timed beside the candidates (None: none)."""

    name: str
    dims: tuple[str, ...]
    work: Callable[[Mapping[str, int], float], tuple[float, float]]
    make_inputs: Callable | None = None
    yardstick: Callable | None = None
