"""RMSNorm in Pallas Mosaic GPU: y = x / sqrt(mean(x^2) + eps) * w over each row; one program per row, two
pipelined passes over column chunks of block_cols (a TMA box is at most 256 elements per dimension): the
sum of squares as the pipeline's carry, then the scaled row. Written for Mosaicist's kernel-file contract
(docs/kernel-files.md):

    mosaic capture --file examples/kernels/pallas/rmsnorm.py --lang pallas --family rmsnorm \\
        --shape 4096x8192 --dtype bf16 --knob block_cols=128 --lower-only -o rmsnorm.bundle

The entry is a jax function called as ``ENTRY(*inputs, knobs)`` on jax arrays of the shapes INPUTS names;
it returns the output, like jax's own Pallas ops take their ``TuningConfig``.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

ENTRY = "rmsnorm"
INPUTS = {"x": ("rows", "cols"), "w": ("cols",)}
OUTPUTS = {"y": ("rows", "cols")}


@dataclasses.dataclass(frozen=True)
class Knobs:
    block_cols: int = 256  # columns per pipeline step (a TMA box: at most 256)
    max_concurrent_steps: int = 2  # copies in flight
    eps: float = 1e-6  # mosaic's rmsnorm oracle uses 1e-6

    def __post_init__(self):
        if not 1 <= self.block_cols <= 256:
            raise ValueError(f"block_cols={self.block_cols}: a TMA box holds 1..256 elements per dimension")


def rmsnorm(x, w, knobs: Knobs):
    rows, cols = x.shape
    bc = knobs.block_cols
    if cols % bc:
        raise ValueError(f"cols={cols} is not a multiple of block_cols={bc}")
    steps = cols // bc

    def body(x_gmem, w_gmem, y_gmem):
        row = jax.lax.axis_index("rows")

        def squares(_, x_smem, total):
            xf = x_smem[...].astype(jnp.float32)
            return total + jnp.sum(xf * xf)

        total = plgpu.emit_pipeline(
            squares, grid=(steps,), in_specs=[plgpu.BlockSpec((1, bc), lambda j: (row, j))],
            max_concurrent_steps=knobs.max_concurrent_steps, init_carry=jnp.float32(0.0),
        )(x_gmem)
        scale = jax.lax.rsqrt(total / cols + knobs.eps)

        def scaled(_, x_smem, w_smem, y_smem):
            y = x_smem[...].astype(jnp.float32) * scale * w_smem[...].astype(jnp.float32)
            y_smem[...] = y.astype(y_smem.dtype)

        plgpu.emit_pipeline(
            scaled, grid=(steps,),
            in_specs=[plgpu.BlockSpec((1, bc), lambda j: (row, j)), plgpu.BlockSpec((1, bc), lambda j: (0, j))],
            out_specs=[plgpu.BlockSpec((1, bc), lambda j: (row, j))],
            max_concurrent_steps=knobs.max_concurrent_steps,
        )(x_gmem, w_gmem, y_gmem)

    call = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((rows, cols), x.dtype), grid=(rows,), grid_names=("rows",),
                        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane))
    return call(x, w.reshape(1, cols))
