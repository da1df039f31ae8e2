"""jax's Mosaic GPU Blackwell matmul (``jax.experimental.pallas.ops.gpu.blackwell_matmul_mgpu``): tcgen05 MMA
from shared memory into tensor memory, TMA loads, an optional collective 2-CTA MMA. sm_100a only.

jax's ``matmul_kernel`` builds its own launch (one CTA per output tile, ``cluster=(1 + collective,)``), so
``num_ctas`` is not used; ``into=True`` is not offered (jax's kernel allocates its output).
"""

from __future__ import annotations

from mosaic.errors import RecordError

from mosaic_target_pallas.knobs import GemmKnobs


def tuning_config(knobs: GemmKnobs):
    from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as bm

    dim = {"m": bm.MatmulDimension.M, "n": bm.MatmulDimension.N}
    return bm.TuningConfig(
        tile_m=knobs.tile_m, tile_n=knobs.tile_n, tile_k=knobs.tile_k,
        max_concurrent_steps=knobs.max_concurrent_steps, collective=knobs.cluster_dimension == "m",
        epilogue_tile_n=knobs.epi_tile_n or knobs.tile_n,
        grid_minor_dim=dim[knobs.grid_minor_dim], grid_tile_width=knobs.grid_tile_width,
    )


def build(knobs: GemmKnobs, m: int, n: int, k: int, dtype, num_ctas: int, into: bool = False):
    from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as bm

    if into:
        raise RecordError("jax-blackwell allocates its own output: it cannot write into a given buffer")
    knobs.check_shape(m, n, k)
    config = tuning_config(knobs)
    return lambda a, b: bm.matmul_kernel(a, b, config)
