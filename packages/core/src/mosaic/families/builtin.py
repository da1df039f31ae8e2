"""Core's own kernel families, written as a ``register_families`` hook implementation -- the hook a
third-party plugin implements to add one.

Core advertises no entry point of its own (with only mosaic-core installed, ``mosaic plugins`` lists
none), so :func:`mosaic.families.registry` calls this hook directly and then adds what plugins register
through the host; a plugin that registers a built-in family's name again is an error.
"""

from __future__ import annotations

from mosaic.families import attention, gemm, rmsnorm, softmax
from mosaic.plugins import hookimpl

BUILTIN = (gemm.FAMILY, attention.FAMILY, rmsnorm.FAMILY, softmax.FAMILY)


@hookimpl
def register_families(register):
    for family in BUILTIN:
        register(family)
