"""The GPU interpreter with race detection: a planted race is caught, the real kernels run race-free
and compute the right product."""

import numpy as np
import pytest
from mosaic_target_pallas import interpret
from mosaic_target_pallas.kernels import hopper_matmul, pipelined_matmul, race_demo
from mosaic_target_pallas.knobs import GemmKnobs

jnp = pytest.importorskip(
    "jax.numpy", reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312 (make test does)")


def test_planted_race_is_caught_and_barrier_fixes_it():
    x = jnp.arange(128, dtype=jnp.float32)
    racy = interpret.run(race_demo.build(128, barrier=False), x)
    safe = interpret.run(race_demo.build(128, barrier=True), x)
    assert racy.races_found is True
    assert safe.races_found is False
    np.testing.assert_array_equal(safe.outputs[0], np.arange(128) * 2.0 + 1.0)


def test_race_flag_is_off_without_detection():
    r = interpret.run(race_demo.build(128, barrier=False), jnp.ones(128, jnp.float32), detect_races=False)
    assert r.races_found is False


def _operands(m, n, k, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a16, b16 = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
    ref = np.asarray(a16, np.float64) @ np.asarray(b16, np.float64)
    return a16, b16, ref


@pytest.mark.parametrize("knobs", [
    GemmKnobs(tile_m=64, tile_n=64, tile_k=32, max_concurrent_steps=2, epi_tile_m=32, epi_tile_n=32),
    GemmKnobs(tile_m=64, tile_n=32, tile_k=32, max_concurrent_steps=3, epi_tile_m=32, epi_tile_n=32,
              wg_dimension="m", grid_minor_dim="m"),
    GemmKnobs(kernel="pipelined", tile_m=64, tile_n=64, tile_k=32, max_concurrent_steps=2, epi_tile_m=32,
              epi_tile_n=64, delay_release=1, persistent=False),
], ids=["jax-hopper", "jax-hopper-wg-m", "pipelined"])
@pytest.mark.parametrize("into", [False, True], ids=["returned", "into-poisoned"])
def test_gemm_kernels_are_correct_and_race_free(knobs, into):
    """Also in the form ``prepare`` runs on the GPU (``into=True``): the kernel writes into a NaN-filled buffer
    passed in (output_buffer.py), and every element must come out written."""
    m, n, k = 128, 256, 128
    a, b, ref = _operands(m, n, k, jnp.bfloat16)
    mod = hopper_matmul if knobs.kernel == "jax-hopper" else pipelined_matmul
    fn = mod.build(knobs, m, n, k, jnp.bfloat16, 1, into=into)
    poison = (jnp.full((m, n), jnp.nan, jnp.bfloat16),) if into else ()
    r = interpret.run(fn, a, b, *poison)
    assert r.races_found is False
    got = r.outputs[0]
    # bf16 output: half an ulp of |ref| (2^-8 relative) plus fp32-accumulation slack
    tol = np.abs(ref) * 2.0**-8 + 1e-3 * np.sqrt(k)
    assert np.all(np.abs(got - ref) <= tol), float(np.max(np.abs(got - ref) - tol))
    assert np.isfinite(got).all()
