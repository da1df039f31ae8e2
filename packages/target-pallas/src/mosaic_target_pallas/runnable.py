"""A prepared Pallas kernel on the GPU (``mosaic.backend.Runnable``).

``launch()`` dispatches the jitted kernel asynchronously (jax returns before the GPU finishes). The output
buffer is donated back into each launch (``donate_argnums``), so XLA writes the kernel's result into the
buffer that ``poison()`` filled with NaN — ``poison_effective`` records whether the buffer addresses matched
(XLA aliased the donated buffer), so a never-written element cannot pass silently.
"""

from __future__ import annotations

import numpy as np


class PallasRunnable:
    def __init__(self, fn, a, b, dtype, out_shape):
        import jax
        import jax.numpy as jnp

        self._jnp = jnp
        self.dtype = dtype
        self.out_shape = out_shape
        self.a = jax.device_put(jnp.asarray(a, dtype))
        self.b = jax.device_put(jnp.asarray(b, dtype))

        def step(a, b, out):
            del out  # donated: XLA may place the result in this buffer
            return fn(a, b)

        self._step = jax.jit(step, donate_argnums=2)
        self.out = jnp.zeros(out_shape, dtype)
        self.poison_effective: bool | None = None
        self._poisoned_ptr: int | None = None
        jax.block_until_ready(self._step(self.a, self.b, self.out))  # compile outside the timed region
        self.out = jnp.zeros(out_shape, dtype)

    def launch(self) -> None:
        self.out = self._step(self.a, self.b, self.out)

    def poison(self) -> None:
        self.out = self._jnp.full(self.out_shape, np.nan, self.dtype).block_until_ready()
        self._poisoned_ptr = self.out.unsafe_buffer_pointer()

    def output(self) -> dict[str, np.ndarray]:
        out = self.out.block_until_ready()
        if self._poisoned_ptr is not None:
            self.poison_effective = out.unsafe_buffer_pointer() == self._poisoned_ptr
        return {"c": np.asarray(out, dtype=np.float32)}

    def close(self) -> None:
        self.a = self.b = self.out = None
