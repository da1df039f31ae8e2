"""A Pallas Mosaic GPU kernel that writes into the caller's output buffer, not one jax allocates.

The capture's poisoning protocol fills the output buffer with NaN before a launch so that an element the kernel
never writes fails the oracle. That holds only if the kernel writes into that very buffer. A kernel built with
``plgpu.kernel(out_type=...)`` writes into a buffer XLA allocates for the custom call; donating an unused
argument does not help, because jax drops unused arguments before XLA sees them (the donation vanishes from
the lowered module). Here the output is passed in as a mutable ``jax.Ref``: ``plgpu.kernel(out_type=())``
receives it as its last ref, jax's state discharge turns the write into an ``output_operand_aliases`` entry of
the ``mosaic_gpu`` custom call, and with the buffer donated (``tf.aliasing_output`` on the jit argument) XLA
runs the kernel in the poisoned buffer itself. :func:`aliasing` reads both facts out of a lowered module.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs

ALIAS_RE = re.compile(r"#stablehlo\.output_operand_alias<[^>]*?operand_index = (\d+)")
ARG_RE = re.compile(r"%arg(\d+): tensor<[^>]*>\s*(\{[^}]*\})?")


def writing_into(call: Callable, view: tuple, shape: tuple) -> Callable:
    """``f(*operands, out) -> out written``: ``call`` (a ``plgpu.kernel`` with ``out_type=()``) gets
    ``operands`` and then ``out`` viewed as ``view`` (a reshape, no copy) as a mutable ref, and writes into it;
    the result is that buffer viewed as ``shape`` again."""

    def fn(*operands_and_out):
        import jax

        *operands, out = operands_and_out
        ref = jax.new_ref(out.reshape(view))
        call(*operands, ref)
        return jax.freeze(ref).reshape(shape)

    return fn


@attrs.frozen
class Aliasing:
    """What a lowered StableHLO module says about its output buffer."""

    donated_args: tuple  # indices of main's arguments marked tf.aliasing_output (XLA reuses their buffer)
    kernel_aliased_operands: tuple  # operand indices each mosaic_gpu custom call writes in place

    @property
    def in_place(self) -> bool:
        """The kernel writes into an operand and the jit's output reuses a donated argument."""
        return bool(self.donated_args) and bool(self.kernel_aliased_operands)


def aliasing(stablehlo: str) -> Aliasing:
    """Read the donated arguments of ``@main`` and the in-place operands of the ``mosaic_gpu`` custom calls."""
    main = next((line for line in stablehlo.splitlines() if "func.func public @main" in line), "")
    donated = tuple(int(m.group(1)) for m in ARG_RE.finditer(main) if m.group(2) and "tf.aliasing_output" in m.group(2))
    operands = []
    for line in stablehlo.splitlines():
        if "stablehlo.custom_call @mosaic_gpu" in line:
            operands += [int(i) for i in ALIAS_RE.findall(line)]
    return Aliasing(donated, tuple(operands))
