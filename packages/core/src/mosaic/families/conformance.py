"""Does a family record hold together? The checks a family -- built in or from a plugin -- must pass before
capture and the loop can use it, run on the CPU on its example shape: the shape parses, the work is a
finite positive (FLOPs, bytes) pair, its oracle is registered, and for every format and distribution it
declares the generator is seeded (same seed, same bits; another seed, other bits), returns finite float32
arrays exactly representable in the format with the names the oracle takes, and a correct result (the
float64 reference rounded once to the format) passes the oracle. ``mosaic families --check`` runs it."""

from __future__ import annotations

import math
from collections.abc import Mapping

from mosaic.errors import MosaicError
from mosaic.records import Family

#: the shape checked when a family gives no ``example``: every dimension 8
DEFAULT_SIDE = 8


def example_shape(f: Family) -> dict[str, int]:
    return dict(f.example) if f.example else {d: DEFAULT_SIDE for d in f.dims}


def check_family(f: Family) -> list[str]:
    """Every problem found, one line each (an empty list: the family conforms)."""
    import numpy as np

    from mosaic.families import parse_shape
    from mosaic.oracle import check, oracles
    from mosaic.oracle.formats import fmt

    problems: list[str] = []
    try:
        shape = parse_shape(f.name, example_shape(f), "example")
    except MosaicError as exc:
        return [f"its example shape does not parse: {exc.line()}"]
    try:
        flops, nbytes = f.work(shape, 2.0)
        if not all(isinstance(x, int | float) and math.isfinite(x) and x >= 0 for x in (flops, nbytes)) \
                or flops + nbytes <= 0:
            problems.append(f"work({shape}) = ({flops!r}, {nbytes!r}) is not a finite positive (FLOPs, bytes) pair")
    except Exception as exc:  # noqa: BLE001 - a plugin's function: report, never crash
        problems.append(f"work({shape}) raised {type(exc).__name__}: {exc}")
    oracle = oracles().get(f.oracle)
    if oracle is None:
        problems.append(f"its oracle '{f.oracle}' is not registered (register_oracles)")
    if f.make_inputs is None:
        problems.append("it has no input generator (make_inputs), so capture cannot run it")
        return problems
    ref = oracle.reference if oracle is not None else None
    for dtype in f.dtypes or ("bf16",):
        for values in f.distributions or ("normal",):
            where = f"{dtype} {values}"
            try:
                one, again, other = (f.make_inputs(dict(shape), dtype, seed, values) for seed in (0, 0, 1))
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{where}: make_inputs raised {type(exc).__name__}: {exc}")
                continue
            if not isinstance(one, Mapping) or not one:
                problems.append(f"{where}: make_inputs returned {type(one).__name__}, not a mapping of arrays")
                continue
            if set(one) != set(again) or any(not np.array_equal(one[n], again[n]) for n in one):
                problems.append(f"{where}: the same seed gave different inputs")
            elif set(one) == set(other) and all(np.array_equal(one[n], other[n]) for n in one):
                problems.append(f"{where}: seeds 0 and 1 gave the same inputs")
            f_in = fmt(dtype)
            for name, arr in one.items():
                a = np.asarray(arr)
                if a.ndim == 0 and ref is not None and name in ref.optional:
                    continue  # a flag or a scalar parameter (attention's causal)
                if a.dtype != np.float32:
                    problems.append(f"{where}: input '{name}' is {a.dtype}, not float32")
                elif not np.isfinite(a).all():
                    problems.append(f"{where}: input '{name}' holds NaN or inf")
                elif not f_in.representable(a).all():
                    problems.append(f"{where}: input '{name}' holds values not representable in {dtype}")
            if ref is None or any(p.startswith(where + ":") for p in problems):
                continue
            missing, extra = set(ref.inputs) - set(one), set(one) - set(ref.inputs) - set(ref.optional)
            if missing or extra:
                problems.append(f"{where}: inputs {sorted(one)} are not what oracle '{f.oracle}' takes "
                                f"({', '.join(ref.inputs)}; optional {', '.join(ref.optional) or 'none'})")
                continue
            try:
                expect = ref(dict(one), f_in, f_in)
                correct = {n: f_in.round(e.expected).astype(np.float32) for n, e in expect.items()}
                verdict = check(f.oracle, one, correct, dtype)
                if not verdict.passed:
                    problems.append(f"{where}: the rounded float64 reference fails its own oracle: {verdict.reason}")
            except MosaicError as exc:
                problems.append(f"{where}: the oracle refuses these inputs: {exc.line()}")
    return problems
