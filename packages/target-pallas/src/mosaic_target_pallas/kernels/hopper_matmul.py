"""jax's Mosaic GPU Hopper matmul (``jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu``), offered with
its TuningConfig knobs.

We call jax's kernel body (``hopper_matmul_mgpu.kernel``) and build the launch ourselves, because jax's
``matmul()`` sizes the grid from the live device's SM count: here the grid comes from the GpuTarget record
on the GPU (``sm_count // cluster``), and is one CTA in the interpreter (which simulates a single block;
the kernel's persistent ``nd_loop`` then walks every tile in that block).
"""

from __future__ import annotations

import functools

from mosaic_target_pallas.knobs import GemmKnobs


def tuning_config(knobs: GemmKnobs):
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    dim = {"m": hm.MatmulDimension.M, "n": hm.MatmulDimension.N}
    return hm.TuningConfig(
        tile_m=knobs.tile_m, tile_n=knobs.tile_n, tile_k=knobs.tile_k,
        max_concurrent_steps=knobs.max_concurrent_steps,
        epi_tile_m=knobs.epi_tile_m or knobs.tile_m, epi_tile_n=knobs.epi_tile_n or knobs.tile_n,
        grid_minor_dim=dim[knobs.grid_minor_dim], grid_tile_width=knobs.grid_tile_width,
        wg_dimension=dim[knobs.wg_dimension],
        cluster_dimension=None if knobs.cluster_dimension is None else dim[knobs.cluster_dimension],
    )


def build(knobs: GemmKnobs, m: int, n: int, k: int, dtype, num_ctas: int, into: bool = False):
    """A callable ``f(a, b) -> a @ b`` (a: m×k, b: k×n, row-major) running jax's kernel on ``num_ctas`` CTAs;
    ``into=True``: ``f(a, b, out)``, the kernel writing into ``out``'s buffer (``output_buffer.py``)."""
    import jax
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    knobs.check_shape(m, n, k)
    cluster = knobs.cluster_size()
    grid = max(1, num_ctas // cluster)
    call = plgpu.kernel(
        functools.partial(hm.kernel, config=tuning_config(knobs)),
        out_type=() if into else jax.ShapeDtypeStruct((m, n), dtype),
        grid=(grid,), grid_names=("cluster_grid",),
        cluster=(cluster,), cluster_names=("cluster",),
        num_threads=3, thread_name="wg",  # one TMA warpgroup + two wgmma warpgroups
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )
    if into:
        from mosaic_target_pallas.output_buffer import writing_into

        write = writing_into(call, (m, n), (m, n))
        return lambda a, b, out: write(a, b, None, out)  # no C operand (hm.kernel's c_gmem)
    return lambda a, b: call(a, b, None)
