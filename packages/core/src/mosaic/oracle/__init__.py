"""The numerics oracle: a float64 reference per kernel family and guard bands from the number format.

``check(family, inputs, outputs, dtype)`` returns a :class:`Verdict`; ``numerics_pass(verdict)`` is the
gate of the acceptance rule. Inputs must be representable in ``dtype`` (the kernel's input format) and
outputs in ``out_dtype`` (default: ``dtype``); NaN and inf never pass, and an output element that was
never written (the capture poisons outputs with NaN before each run) fails as NaN. See
docs/oracle-and-timing.md for every guard-band formula and why.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mosaic.errors import BadInput, PluginError
from mosaic.oracle.formats import FORMATS, Format, fmt
from mosaic.oracle.verdict import CHUNK, Expectation, OutputReport, Verdict, compare, numerics_pass
from mosaic.records import Oracle

__all__ = ["check", "oracles", "numerics_pass", "Verdict", "OutputReport", "Expectation", "Format", "FORMATS"]


def oracles() -> dict[str, Oracle]:
    """Built-in oracles plus those plugins register through ``register_oracles``."""
    from mosaic.oracle import builtin
    from mosaic.plugins import host

    found: dict[str, Oracle] = {}

    def register(item: Oracle) -> None:
        found[item.family] = item

    builtin.register_oracles(register)
    h = host()
    for name, reg in h.registries["oracles"].items():
        if name in found:
            raise PluginError(f"oracle '{name}' is built into mosaic-core and registered again by {reg.distribution}")
        found[name] = reg.item
    return dict(sorted(found.items()))


def _as_float(name: str, value: np.ndarray, kinds: str = "f") -> np.ndarray:
    """The array, refused unless its dtype kind is in ``kinds``: a tensor must be floating point (an integer or
    boolean array is not a kernel's values); an optional parameter (a causal flag, a scale) may be any number."""
    arr = np.asarray(value)
    if arr.dtype.kind not in kinds:
        raise BadInput(f"array '{name}' has dtype {arr.dtype}; expected floating-point values (float16/32/64 "
                       "holding the kernel's format)", "inputs")
    return arr



def _first_unrepresentable(arr, fmt, chunk: int = CHUNK) -> tuple | None:
    """Index of the first element of ``arr`` that ``fmt`` cannot represent exactly, or None (checked ``chunk``
    elements at a time in memory order: whole-array float64 temporaries cost seconds at 10^8 elements)."""
    a = np.asarray(arr)
    flat = np.ravel(a)
    step = max(1, int(chunk))
    for lo in range(0, flat.size, step):
        bad = ~fmt.representable(flat[lo:lo + step])
        if bad.any():
            return tuple(int(i) for i in np.unravel_index(lo + int(np.argmax(bad)), a.shape))
    return None

def check(family: str, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], dtype: str,
          out_dtype: str | None = None, cache=None) -> Verdict:
    """Compare a kernel's outputs with the family's float64 reference. Raises BadInput for malformed input.

    ``cache``: a :class:`mosaic.oracle.cache.ReferenceCache`; the reference is then read from it when its
    verified key matches these inputs, else computed (float64, CPU) and stored; ``cache.last`` says which."""
    known = oracles()
    if family not in known:
        raise BadInput(f"no oracle for family '{family}'; known: {', '.join(known)}", "--family")
    fam = known[family].reference
    in_fmt, out_fmt = fmt(dtype), fmt(out_dtype or dtype)
    missing = [n for n in fam.inputs if n not in inputs]
    if missing:
        raise BadInput(f"{family} inputs lack {', '.join(missing)}; need {', '.join(fam.inputs)}"
                       + (f" (optional: {', '.join(fam.optional)})" if fam.optional else ""), "inputs")
    extra = sorted(set(inputs) - set(fam.inputs) - set(fam.optional))
    if extra:
        raise BadInput(f"{family} inputs have unknown array(s) {', '.join(extra)}", "inputs")
    ins = {n: _as_float(n, v, "f" if n in fam.inputs else "fiub") for n, v in inputs.items()}

    def valid_inputs() -> None:
        for n in fam.inputs:
            arr = ins[n]
            if not np.all(np.isfinite(arr)):
                raise BadInput(f"input '{n}' holds NaN or inf", "inputs")
            where = _first_unrepresentable(arr, in_fmt)
            if where is not None:
                raise BadInput(f"input '{n}' holds values not representable in {in_fmt.name}, first at {where}: "
                               f"{float(arr[where])!r}", "inputs")

    if cache is None:
        valid_inputs()
        expectations = None
    else:  # a hit skips valid_inputs: the entry was stored after it passed on the same bytes (the key hashes them)
        expectations = cache.expectations(family, fam, ins, in_fmt, out_fmt, validate=valid_inputs)
    missing = [n for n in fam.outputs if n not in outputs]
    if missing:
        raise BadInput(f"{family} output file lacks {', '.join(missing)}", "output")
    outs = {n: _as_float(n, outputs[n]) for n in fam.outputs}
    for n, arr in outs.items():
        where = _first_unrepresentable(arr, out_fmt)
        if where is not None:
            raise BadInput(f"output '{n}' holds values not representable in {out_fmt.name}, first at {where}: "
                           f"{float(arr[where])!r} (pass --out-dtype if the kernel writes another format)", "output")
    if expectations is None:
        expectations = fam(ins, in_fmt, out_fmt)
    reports = tuple(compare(n, outs[n], expectations[n]) for n in fam.outputs)
    failed = [r for r in reports if not r.passed]
    return Verdict(family, in_fmt.name, out_fmt.name, not failed, "; ".join(r.reason for r in failed), reports)
