"""A prepared Pallas kernel on the GPU (``mosaic.backend.Runnable``).

``launch()`` dispatches the jitted kernel asynchronously (jax returns before the GPU finishes).

``writes_into=True`` (the project's kernels: gemm, rmsnorm, softmax): the kernel is ``fn(*args, out)`` and
writes into ``out``'s buffer (``output_buffer.py``), and that buffer is donated to each launch, so the
kernel runs in the very buffer that ``poison()`` filled with NaN and an element it never writes fails the
oracle. ``output()`` compares the result's device address with the poisoned buffer's: ``poison_effective``
is True when they match and False when XLA put the result elsewhere.

``writes_into=False`` (jax's attention_mgpu, which allocates its own output and is transposed back to the
family's layout afterwards): the poison cannot reach the kernel's buffer; ``poison_effective`` is False
after a poisoned run, so no caller can take the protocol for granted there.
"""

from __future__ import annotations

import numpy as np


def launch_step(fn, writes_into: bool):
    """The jitted launch ``step(args, out)``: ``fn(*args, out)`` with ``out`` donated (``writes_into``), else
    ``fn(*args)`` (``out`` unused, and jax drops an unused argument before XLA sees it)."""
    import jax

    if writes_into:
        return jax.jit(lambda args, out: fn(*args, out), donate_argnums=1)
    return jax.jit(lambda args, out: fn(*args))


class PallasRunnable:
    def __init__(self, fn, args, dtype, out_shape, out_name: str = "c", writes_into: bool = False):
        import jax
        import jax.numpy as jnp

        self._jnp = jnp
        self.dtype = dtype
        self.out_shape = tuple(out_shape)
        self.out_name = out_name
        self.writes_into = writes_into
        self.args = tuple(jax.device_put(jnp.asarray(x, dtype)) for x in args)
        self._step = launch_step(fn, writes_into)
        self.out = jnp.zeros(self.out_shape, dtype)
        self.poison_effective: bool | None = None
        self._poisoned_ptr: int | None = None
        self.out = jax.block_until_ready(self._step(self.args, self.out))  # compile outside the timed region

    def launch(self) -> None:
        self.out = self._step(self.args, self.out)

    def poison(self) -> None:
        self.out = self._jnp.full(self.out_shape, np.nan, self.dtype).block_until_ready()
        self._poisoned_ptr = self.out.unsafe_buffer_pointer()

    def output(self) -> dict[str, np.ndarray]:
        out = self.out.block_until_ready()
        if self._poisoned_ptr is not None:
            self.poison_effective = out.unsafe_buffer_pointer() == self._poisoned_ptr
        return {self.out_name: np.asarray(out, dtype=np.float32)}

    def close(self) -> None:
        self.args = self.out = None
