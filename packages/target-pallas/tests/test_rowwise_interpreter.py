"""The Pallas rmsnorm and softmax kernels in jax's GPU interpreter (CPU, race detector on) against the family's
float64 oracle: every value of the knob table on a small shape, and every input distribution (normal, int, large,
equal-rows, denormal) in bf16 and f16 on four configurations (one writing in place with rows split over two
warps, one loading directly from global memory). As on the GPU, each kernel writes into an output buffer filled
with NaN beforehand (``rowwise.run_interpreted``), so an element it never writes fails the oracle.

rmsnorm's bf16 subnormal inputs are checked on the GPU only (test_rmsnorm_gpu.py): the interpreter computes
through XLA:CPU, which flushes float32 subnormals to zero. Softmax's denormal inputs only check that nothing
breaks (its output is uniform up to 2^-126), so they run here too. The interpreter computes exp/rsqrt exactly
whatever ``approx_math`` says (Mosaic GPU's approximate forms are the GPU test's)."""

import attrs
import pytest
from mosaic import families, oracle
from mosaic.records import KernelSpec
from mosaic_target_pallas.rowwise_knobs import ROWWISE_KNOBS, table_configs

pytest.importorskip("jax", minversion="0.11.2",
                    reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")

FAMILIES = ("rmsnorm", "softmax")
OTHER = {"block_rows": 8, "tma_cols": 64, "vector": 2, "max_concurrent_steps": 3, "blocks_per_cta": 4,
         "out_slots": 2, "approx_math": True}
#: softmax's other configuration also takes the three-pass path
OTHER_EXTRA = {"rmsnorm": {}, "softmax": {"online": False}}
IN_PLACE = {"block_rows": 2, "tma_cols": 128, "vector": 2, "max_concurrent_steps": 3, "blocks_per_cta": 8,
            "out_slots": 0, "approx_math": False}
DISTRIBUTIONS = ("normal", "int", "large", "equal-rows", "denormal")


def _gpu():
    from mosaic.plugins import PluginHost

    return PluginHost(allow="hopper").load().get("gpus", "h200")


def _spec(family, knobs, rows, cols, dtype="bf16"):
    return KernelSpec(family=family, shape={"rows": rows, "cols": cols}, dtype=dtype, language="pallas", knobs=knobs)


def small_shape(knobs) -> tuple[int, int]:
    """Two CTAs of the blocking, 512 columns; one CTA of 256 columns for the longest walks."""
    per_cta = knobs["block_rows"] * knobs["blocks_per_cta"]
    return (per_cta, 256) if per_cta >= 256 else (2 * per_cta, 512)


def _table():
    gpu = _gpu()
    return [pytest.param(family, knobs, id=f"{family}-{k}={v}")
            for family in FAMILIES for k, v, knobs in table_configs(family, _spec(family, {}, 16384, 512), gpu)]


def check(family, knobs, values="normal", dtype="bf16", seed=0):
    from mosaic_target_pallas.rowwise import run_interpreted

    spec = _spec(family, knobs, *small_shape(knobs), dtype=dtype)
    inputs = families.make_inputs(spec, seed, values)
    result = run_interpreted(spec, inputs)
    verdict = oracle.check(family, inputs, {"y": result.outputs[0]}, dtype)
    return verdict, result.races_found


@pytest.mark.parametrize("family,knobs", _table())
def test_every_table_value_passes_the_oracle(family, knobs):
    verdict, races = check(family, knobs)
    assert verdict.passed, verdict.reason
    assert races is False


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("values", DISTRIBUTIONS)
@pytest.mark.parametrize("config", ["default", "other", "in-place", "direct"])
@pytest.mark.parametrize("family", FAMILIES)
def test_distributions_pass_the_oracle(family, config, values, dtype):
    if family == "rmsnorm" and values == "denormal" and dtype == "bf16":
        pytest.skip("bf16 subnormals are float32 subnormals, which XLA:CPU flushes: checked on the GPU")
    cls = ROWWISE_KNOBS[family]
    knobs = {"default": attrs.asdict(cls()), "other": {**OTHER, **OTHER_EXTRA[family]}, "in-place": IN_PLACE,
             "direct": attrs.asdict(cls(copy="direct", block_rows=8, blocks_per_cta=2))}[config]
    verdict, races = check(family, knobs, values, dtype, seed=1)
    assert verdict.passed, verdict.reason
    assert races is False


@pytest.mark.parametrize("family", FAMILIES)
def test_a_wrong_kernel_fails_the_oracle(family):
    """The check can fail: the kernel's output for another seed's inputs is not these inputs' result."""
    from mosaic_target_pallas.rowwise import run_interpreted

    knobs = attrs.asdict(ROWWISE_KNOBS[family]())
    spec = _spec(family, knobs, *small_shape(knobs))
    other = run_interpreted(spec, families.make_inputs(spec, 2, "normal")).outputs[0]
    verdict = oracle.check(family, families.make_inputs(spec, 3, "normal"), {"y": other}, "bf16")
    assert not verdict.passed and "outside the guard band" in verdict.reason


@pytest.mark.parametrize("config", [{"out_slots": 0}, {"copy": "tma_in"}], ids=["in-place", "tma_in"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_race_detector_finds_a_stage_overtaken_by_the_next_load(family, config):
    """A stage's last reader must be done before the pipeline loads into it again: in place (out_slots=0) the
    stage's TMA store, with copy='tma_in' every warp's register loads (the barrier after them). Without that
    ordering the race detector reports the race, with it none."""
    import jax.numpy as jnp
    from mosaic_target_pallas import interpret
    from mosaic_target_pallas.rowwise import arg_shapes, build

    knobs = ROWWISE_KNOBS[family](**config, blocks_per_cta=8)
    spec = _spec(family, attrs.asdict(knobs), 32, 512)
    inputs = families.make_inputs(spec, 0, "normal")
    args = [jnp.asarray(inputs[k], jnp.bfloat16) for k, _ in arg_shapes(family, 32, 512)]
    assert interpret.run(build(family, knobs, 32, 512, jnp.bfloat16, store_wait=False), *args).races_found is True
    assert interpret.run(build(family, knobs, 32, 512, jnp.bfloat16), *args).races_found is False
