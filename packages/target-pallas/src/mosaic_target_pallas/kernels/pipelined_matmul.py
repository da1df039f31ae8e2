"""The project's own Pallas Mosaic GPU matmul: one warpgroup issues TMA loads through ``emit_pipeline``
(``max_concurrent_steps`` slots) and wgmma on the same warpgroup — no warp specialisation. It reaches
settings jax's Hopper kernel does not expose: a CTA tile equal to one warpgroup's tile, a non-persistent
grid (one CTA per output tile, ``persistent=False``), and ``delay_release`` (keep one wgmma in flight
across pipeline steps).
"""

from __future__ import annotations

import functools

from mosaic_target_pallas.knobs import GemmKnobs


def build(knobs: GemmKnobs, m: int, n: int, k: int, dtype, num_ctas: int, into: bool = False):
    """A callable ``f(a, b) -> a @ b``; ``num_ctas`` is the persistent grid (ignored when not persistent);
    ``into=True``: ``f(a, b, out)``, the kernel writing into ``out``'s buffer (``output_buffer.py``)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    knobs.check_shape(m, n, k)
    tm, tn, tk = knobs.tile_m, knobs.tile_n, knobs.tile_k
    m_tiles, n_tiles, k_steps = m // tm, n // tn, k // tk
    epi_m, epi_n = knobs.epi_tile_m or tm, knobs.epi_tile_n or tn
    minor = 0 if knobs.grid_minor_dim == "m" else 1
    tiles = m_tiles * n_tiles
    grid = max(1, min(num_ctas, tiles)) if knobs.persistent else tiles

    def body(a_gmem, b_gmem, out_gmem):
        @plgpu.nd_loop((tiles,), collective_axes="tiles")
        def _tile(info):
            mi, ni = plgpu.planar_snake(info.index[0], (m_tiles, n_tiles), minor, knobs.grid_tile_width)

            def acc_scope(acc_ref):
                def step(_, a_smem, b_smem):
                    plgpu.wgmma(acc_ref, a_smem, b_smem)
                    plgpu.wgmma_wait(knobs.delay_release)

                plgpu.emit_pipeline(
                    step,
                    grid=(k_steps,),
                    in_specs=[
                        plgpu.BlockSpec((tm, tk), lambda s: (mi, s), delay_release=knobs.delay_release),
                        plgpu.BlockSpec((tk, tn), lambda s: (s, ni), delay_release=knobs.delay_release),
                    ],
                    max_concurrent_steps=knobs.max_concurrent_steps,
                )(a_gmem, b_gmem)
                return acc_ref[...]

            acc = pl.run_scoped(acc_scope, plgpu.ACC((tm, tn), jnp.float32))

            # epilogue: two shared-memory slots of one epi tile each, TMA-stored while the next is written
            @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((2, epi_m, epi_n), dtype))
            def _store(o_smem):
                for ei in range(tm // epi_m):
                    for ej in range(tn // epi_n):
                        slot = (ei * (tn // epi_n) + ej) % 2
                        plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # the slot's previous store has read it
                        o_smem[slot] = acc[ei * epi_m:(ei + 1) * epi_m, ej * epi_n:(ej + 1) * epi_n].astype(dtype)
                        plgpu.commit_smem()
                        plgpu.copy_smem_to_gmem(
                            o_smem.at[slot],
                            out_gmem.at[pl.ds(mi * tm + ei * epi_m, epi_m), pl.ds(ni * tn + ej * epi_n, epi_n)],
                        )
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    call = plgpu.kernel(
        body,
        out_type=() if into else jax.ShapeDtypeStruct((m, n), dtype),
        grid=(grid,), grid_names=("tiles",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )
    if into:
        from mosaic_target_pallas.output_buffer import writing_into

        return writing_into(call, (m, n), (m, n))
    return call
