"""The Pallas kernels write into the buffer the capture poisoned (``output_buffer.py``, ``runnable.py``), checked
without a GPU:

* the launch that ``prepare`` builds for gemm (both kernels), rmsnorm and softmax, lowered for ``cuda``, donates
  its output argument (``tf.aliasing_output``) and its ``mosaic_gpu`` custom call writes into an operand
  (``output_operand_aliases``); the launch of a kernel that returns a fresh array does neither (jax drops the
  unused donated argument: the H200's "the output buffer was not the poisoned one");
* in jax's GPU interpreter a kernel that writes half its output leaves the poison in the other half, and a
  PallasRunnable's result lies in the poisoned buffer (``poison_effective``) with the writing kernel, not
  with the returning one.
"""

import numpy as np
import pytest
from mosaic import families, oracle
from mosaic.records import KernelSpec

pytest.importorskip("jax", minversion="0.11.2",
                    reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")


def _rowwise(family, into, rows=32, cols=512):
    import jax
    import jax.numpy as jnp
    from mosaic_target_pallas import rowwise
    from mosaic_target_pallas.rowwise_knobs import ROWWISE_KNOBS

    fn = rowwise.build(family, ROWWISE_KNOBS[family](), rows, cols, jnp.bfloat16, into=into)
    args = tuple(jax.ShapeDtypeStruct(s, jnp.bfloat16) for _, s in rowwise.arg_shapes(family, rows, cols))
    return fn, args, jax.ShapeDtypeStruct((rows, cols), jnp.bfloat16)


def _gemm(kernel, into, m=256, n=256, k=256):
    import jax
    import jax.numpy as jnp
    from mosaic_target_pallas.backend import build_gemm
    from mosaic_target_pallas.knobs import GemmKnobs

    fn = build_gemm(GemmKnobs(kernel=kernel), m, n, k, jnp.bfloat16, 132, into=into)
    S = jax.ShapeDtypeStruct
    return fn, (S((m, k), jnp.bfloat16), S((k, n), jnp.bfloat16)), S((m, n), jnp.bfloat16)


KERNELS = {"rmsnorm": lambda into: _rowwise("rmsnorm", into), "softmax": lambda into: _rowwise("softmax", into),
           "gemm-jax-hopper": lambda into: _gemm("jax-hopper", into),
           "gemm-pipelined": lambda into: _gemm("pipelined", into)}


def _launch_aliasing(name, into):
    from mosaic_target_pallas.output_buffer import aliasing
    from mosaic_target_pallas.runnable import launch_step

    fn, args, out = KERNELS[name](into)
    lowered = launch_step(fn, writes_into=into).trace(args, out).lower(lowering_platforms=("cuda",))
    return aliasing(lowered.as_text()), len(args)


@pytest.mark.parametrize("name", list(KERNELS))
def test_the_launch_runs_the_kernel_in_the_donated_output_buffer(name):
    found, n_args = _launch_aliasing(name, into=True)
    assert found.donated_args == (n_args,), found  # main's last argument: the output buffer
    assert found.kernel_aliased_operands == (n_args,), found  # the kernel's last operand: that buffer, reshaped
    assert found.in_place


@pytest.mark.parametrize("name", ["rmsnorm", "gemm-jax-hopper"])
def test_a_kernel_returning_a_fresh_array_is_not_in_place(name):
    """What the H200 saw: the donated output argument is unused, so jax drops it and nothing is aliased."""
    found, _ = _launch_aliasing(name, into=False)
    assert found.donated_args == () and found.kernel_aliased_operands == () and not found.in_place, found


def test_the_poison_survives_where_the_kernel_does_not_write():
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from mosaic_target_pallas import interpret
    from mosaic_target_pallas.output_buffer import writing_into

    def half(x, o):
        o[:64] = x[:64] * 2

    def whole(x, o):
        o[...] = x[...] * 2

    x = jnp.arange(128 * 128, dtype=jnp.float32).reshape(128, 128)
    poison = jnp.full((128, 128), jnp.nan, jnp.float32)
    for body, nan_rows in ((half, 64), (whole, 0)):
        call = plgpu.kernel(body, out_type=(), grid=(1,), grid_names=("cta",))
        out = interpret.run(writing_into(call, (128, 128), (128, 128)), x, poison).outputs[0]
        assert int(np.isnan(out).all(axis=1).sum()) == nan_rows, body.__name__
        assert np.array_equal(out[:64], np.asarray(x[:64]) * 2)


@pytest.mark.parametrize("family", ["rmsnorm", "softmax"])
def test_the_runnable_result_is_the_poisoned_buffer(family):
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from mosaic_target_pallas import rowwise
    from mosaic_target_pallas.rowwise_knobs import ROWWISE_KNOBS
    from mosaic_target_pallas.runnable import PallasRunnable

    rows, cols = 32, 512
    spec = KernelSpec(family=family, shape={"rows": rows, "cols": cols}, dtype="bf16", language="pallas", knobs={})
    inputs = families.make_inputs(spec, 0, "normal")
    args = [inputs[k] for k, _ in rowwise.arg_shapes(family, rows, cols)]
    seen = {}
    for into in (True, False):
        fn = rowwise.build(family, ROWWISE_KNOBS[family](), rows, cols, jnp.bfloat16, into=into)
        with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams(detect_races=False)):
            r = PallasRunnable(fn, args, jnp.bfloat16, (rows, cols), "y", writes_into=into)
            try:
                r.poison()
                r.launch()
                out = r.output()
            finally:
                r.close()
        assert oracle.check(family, inputs, out, "bf16").passed
        seen[into] = r.poison_effective
    assert seen == {True: True, False: False}
