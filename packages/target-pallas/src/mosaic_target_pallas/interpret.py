"""Running Pallas Mosaic GPU kernels on the CPU in jax's GPU interpreter, with its race detector.

``plgpu.InterpretGPUParams(detect_races=True)`` (jax >= 0.11.2) simulates shared memory, the warpgroups
of one CTA, TMA transfers and mbarriers, and checks every shared-memory access against a vector clock
(happens-before) race detector. jax 0.11.2's interpreter runs the grid's CTAs one after another (a race is looked
for within one CTA's warpgroups); its wgmma callback does not record shared-memory reads for the race detector.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np


@attrs.frozen
class InterpretResult:
    outputs: tuple
    races_found: bool


def unavailable() -> str | None:
    """Why this machine cannot run the GPU interpreter with its race detector (None when it can): it needs
    jax >= 0.11.2 (Python >= 3.12)."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks  # noqa: F401
        from jax.experimental.pallas import mosaic_gpu as plgpu
    except ImportError as exc:
        return f"jax's Pallas GPU interpreter is not importable here ({exc}); it needs jax >= 0.11.2 (Python 3.12)"
    if not hasattr(plgpu, "InterpretGPUParams"):
        return "this jax has no Pallas GPU interpreter (plgpu.InterpretGPUParams); it needs jax >= 0.11.2"
    return None


def run(fn: Callable[..., Any], *args: Any, detect_races: bool = True) -> InterpretResult:
    """Run ``fn(*args)`` (a Pallas Mosaic GPU call) in the GPU interpreter; return outputs and the race flag."""
    import jax
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
    from jax.experimental.pallas import mosaic_gpu as plgpu

    gpu_callbacks.reset_gpu_interpret_mode_state()
    # uninitialised memory reads NaN (jax's default, stated): an output element or a shared-memory word never
    # written shows in the oracle's check
    params = plgpu.InterpretGPUParams(detect_races=detect_races, uninitialized_memory="nan")
    try:
        with plgpu.force_gpu_interpret_mode(params):
            out = jax.block_until_ready(jax.jit(fn)(*args))
        races = bool(detect_races and gpu_callbacks.get_races().races_found)
    finally:
        gpu_callbacks.reset_gpu_interpret_mode_state()
    outs = out if isinstance(out, tuple | list) else (out,)
    return InterpretResult(tuple(np.asarray(o, dtype=np.float32) for o in outs), races)
