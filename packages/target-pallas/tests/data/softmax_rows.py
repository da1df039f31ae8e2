"""Softmax in Pallas Mosaic GPU for the rewrite tests: y = exp(x - max(x)) / sum(exp(x - max(x))) over each row.
Each program walks ``rows_per_cta`` rows in a ``lax.fori_loop``; a row is three pipelined passes over column
chunks of block_cols (the max, then the sum of exponentials as the pipeline's carry, then the scaled row), as
in examples/kernels/pallas/rmsnorm.py. Written for Mosaicist's kernel-file contract (docs/kernel-files.md).
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

ENTRY = "softmax"
INPUTS = {"x": ("rows", "cols")}
OUTPUTS = {"y": ("rows", "cols")}


@dataclasses.dataclass(frozen=True)
class Knobs:
    block_cols: int = 256  # columns per pipeline step (a TMA box: at most 256)
    rows_per_cta: int = 4  # rows one program walks
    max_concurrent_steps: int = 2  # copies in flight


def softmax(x, knobs: Knobs):
    rows, cols = x.shape
    bc, per = knobs.block_cols, knobs.rows_per_cta
    steps = cols // bc

    def body(x_gmem, y_gmem):
        cta = jax.lax.axis_index("ctas")

        def one_row(i, carry):
            row = cta * per + i
            spec = plgpu.BlockSpec((1, bc), lambda j: (row, j))

            def row_max(_, x_smem, m):
                return jnp.maximum(m, jnp.max(x_smem[...].astype(jnp.float32)))

            m = plgpu.emit_pipeline(row_max, grid=(steps,), in_specs=[spec], init_carry=jnp.float32(-jnp.inf),
                                    max_concurrent_steps=knobs.max_concurrent_steps)(x_gmem)

            def row_sum(_, x_smem, s):
                return s + jnp.sum(jnp.exp(x_smem[...].astype(jnp.float32) - m))  # the sum of exponentials

            s = plgpu.emit_pipeline(row_sum, grid=(steps,), in_specs=[spec], init_carry=jnp.float32(0.0),
                                    max_concurrent_steps=knobs.max_concurrent_steps)(x_gmem)

            def scaled(_, x_smem, y_smem):
                y = jnp.exp(x_smem[...].astype(jnp.float32) - m) / s
                y_smem[...] = y.astype(y_smem.dtype)

            plgpu.emit_pipeline(scaled, grid=(steps,), in_specs=[spec], out_specs=[spec],
                                max_concurrent_steps=knobs.max_concurrent_steps)(x_gmem, y_gmem)
            return carry

        jax.lax.fori_loop(0, per, one_row, 0)

    call = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((rows, cols), x.dtype), grid=(rows // per,),
                        grid_names=("ctas",),
                        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane))
    return call(x)
