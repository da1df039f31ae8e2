"""Entry point `pallas`: registers the pallas kernel language and its construct-catalog entries.

Capabilities say what works where, per family, so nothing is advertised that does not run:

* ``gemm``: ``cpu-lowering`` (StableHLO + shared-memory check against the GpuTarget, no GPU),
  ``interpreter`` (jax's GPU interpreter with race detection, one CTA), ``gpu-capture``
  (PTX/SASS/ptxas log via MOSAIC_GPU_DUMP_TO, timing through ``prepare``).
* ``attention`` (jax's attention_mgpu, forward): ``gpu-capture`` (lowered, PTX/SASS dumped and timed where
  jax's CUDA plugin is installed) only. jax's kernel asserts that plugin before it traces, so it neither lowers
  on a machine without it (``attention:no-cpu-lowering``) nor runs in the interpreter
  (``attention:no-interpreter``; it also launches a multi-CTA grid, while the interpreter simulates one CTA).
  It allocates its own output, so the capture's poisoned buffer cannot reach it (``runnable.py``). f16 only: jax
  0.11.2's kernel stages q, k, v in float16 shared memory, so a bf16 problem fails its lowering (refused up front).
* ``rmsnorm``, ``softmax`` (the project's own row-wise kernels, ``rowwise.py``): ``cpu-lowering``,
  ``interpreter`` and ``race-detection`` (every knob runs in jax's GPU interpreter against the float64
  oracle), ``gpu-capture`` like gemm.

Needs Python >= 3.12 with jax 0.11.2 (``pip install 'mosaic-target-pallas[jax]'``); the plugin itself
imports no jax, so ``mosaic plugins`` works without it.
"""

from pathlib import Path

from mosaic.plugins import hookimpl
from mosaic.records import Language

from mosaic_target_pallas.constructs import CONSTRUCTS
from mosaic_target_pallas.kernel_file import PallasFiles

LANGUAGE = Language(
    name="pallas",
    summary="Pallas Mosaic GPU (jax.experimental.pallas, plgpu): jax's Hopper matmul/attention + own "
            "matmul, rmsnorm, softmax",
    families=("gemm", "attention", "rmsnorm", "softmax"),
    capabilities=frozenset({
        "gemm:cpu-lowering", "gemm:interpreter", "gemm:race-detection", "gemm:gpu-capture",
        "attention:gpu-run", "attention:gpu-capture", "attention:no-interpreter", "attention:no-cpu-lowering",
        *(f"{family}:{cap}" for family in ("rmsnorm", "softmax")
          for cap in ("cpu-lowering", "interpreter", "race-detection", "gpu-capture")),
    }),
    backend=PallasFiles(),  # the project's Pallas kernels, and Pallas kernel files (mosaic capture --file)
    # captures on an H200 (the first live campaign's reference), for `mosaic run` on a machine without a GPU
    references=sorted((Path(__file__).parent / "references").glob("*.bundle")),
)


@hookimpl
def register_languages(register):
    register(LANGUAGE)


@hookimpl
def register_constructs(register):
    for construct in CONSTRUCTS:
        register(construct)


@hookimpl
def register_rewrites(register):
    from mosaic_target_pallas.rewrites import REWRITES  # ast edits only: no DSL import

    for rewrite in REWRITES:
        register(rewrite)
