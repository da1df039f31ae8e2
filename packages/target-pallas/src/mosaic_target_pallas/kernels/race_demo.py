"""A tiny two-warpgroup kernel for the race detector: warpgroup 0 writes a shared-memory buffer,
warpgroup 1 reads it and writes the output. With ``barrier=True`` the reader waits on an mbarrier that the
writer arrives on (the correct protocol); with ``barrier=False`` the barrier is missing and the read races
with the write — the planted race the interpreter must catch.
"""

from __future__ import annotations

import functools


def build(n: int = 128, *, barrier: bool):
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def body(x_gmem, out_gmem):
        @functools.partial(pl.run_scoped, buf=plgpu.SMEM((n,), jnp.float32),
                           ready=plgpu.Barrier(num_arrivals=1), collective_axes="wg")
        def _scope(buf, ready):
            wg = lax.axis_index("wg")

            @pl.when(wg == 0)
            def _writer():
                buf[...] = x_gmem[...] * 2.0
                if barrier:
                    plgpu.barrier_arrive(ready)

            @pl.when(wg == 1)
            def _reader():
                if barrier:
                    plgpu.barrier_wait(ready)
                out_gmem[...] = buf[...] + 1.0

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((n,), jnp.float32),
                        num_threads=2, thread_name="wg",
                        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
