"""Core's own oracles, written as a ``register_oracles`` hook implementation.

Core cannot advertise an entry point of its own (with only mosaic-core installed, ``mosaic plugins``
must list none), so :func:`mosaic.oracle.oracles` calls this hook directly and then adds what plugins
register through the host; a plugin that registers a built-in family again is an error.
"""

from __future__ import annotations

import attrs

from mosaic.oracle import attention, gemm, rmsnorm, softmax
from mosaic.plugins import hookimpl
from mosaic.records import Oracle


@attrs.frozen
class Family:
    """The reference model of one family: input/output names and ``reference(inputs, in_fmt, out_fmt)``."""

    name: str
    inputs: tuple
    optional: tuple
    outputs: tuple
    reference: object = attrs.field(eq=False)
    formula: str = ""

    def __call__(self, inputs, in_fmt, out_fmt):
        return self.reference(inputs, in_fmt, out_fmt)


def _family(name, module) -> Oracle:
    fam = Family(name, module.INPUTS, module.OPTIONAL, module.OUTPUTS, module.reference, module.FORMULA)
    return Oracle(family=name, summary=module.SUMMARY, reference=fam)


BUILTIN = {
    "gemm": _family("gemm", gemm),
    "rmsnorm": _family("rmsnorm", rmsnorm),
    "softmax": _family("softmax", softmax),
    "attention": _family("attention", attention),
}


@hookimpl
def register_oracles(register):
    for oracle in BUILTIN.values():
        register(oracle)
