"""A prepared Pallas kernel on the GPU (``mosaic.backend.Runnable``).

``launch()`` dispatches the jitted kernel asynchronously (jax returns before the GPU finishes). The output
buffer is donated back into each launch (``donate_argnums``), so XLA writes the kernel's result into the
buffer that ``poison()`` filled with NaN — ``poison_effective`` records whether the buffer addresses matched
(XLA aliased the donated buffer), so a never-written element cannot pass silently.
"""

from __future__ import annotations

import numpy as np


class PallasRunnable:
    def __init__(self, fn, args, dtype, out_shape, out_name: str = "c"):
        import jax
        import jax.numpy as jnp

        self._jnp = jnp
        self.dtype = dtype
        self.out_shape = out_shape
        self.out_name = out_name
        self.args = tuple(jax.device_put(jnp.asarray(x, dtype)) for x in args)

        def step(args, out):
            del out  # donated: XLA may place the result in this buffer
            return fn(*args)

        self._step = jax.jit(step, donate_argnums=1)
        self.out = jnp.zeros(out_shape, dtype)
        self.poison_effective: bool | None = None
        self._poisoned_ptr: int | None = None
        jax.block_until_ready(self._step(self.args, self.out))  # compile outside the timed region
        self.out = jnp.zeros(out_shape, dtype)

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
