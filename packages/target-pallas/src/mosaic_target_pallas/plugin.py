"""Entry point `pallas`: registers the pallas kernel language and its construct-catalog entries.

Capabilities say what works where, per family, so nothing is advertised that does not run:

* ``gemm``: ``cpu-lowering`` (StableHLO + shared-memory check against the GpuTarget, no GPU),
  ``interpreter`` (jax's GPU interpreter with race detection, one CTA), ``gpu-capture``
  (PTX/SASS/ptxas log via MOSAIC_GPU_DUMP_TO, timing through ``prepare``).
* ``attention``, two kernels (``kernel`` knob). The project's own forward (``kernels/attention.py``, bf16 and
  f16; the default for bf16): ``cpu-lowering`` (the Mosaic GPU module, no GPU), ``interpreter`` and
  ``race-detection`` (jax's GPU interpreter runs its ``p_operand='smem', pv_accumulator='fresh'`` variant against
  the float64 oracle; the GPU default's register-A wgmma and carried accumulator do not run there: lowered only,
  docs/pallas-attention.md). jax's attention_mgpu (``kernel='jax'``, the default for f16): ``gpu-capture`` only,
  since it asserts jax's CUDA plugin before it traces and allocates its own output; f16 only (jax 0.11.2 stages q,
  k, v in float16 shared memory, so bf16 fails its lowering: refused up front).
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
            "matmul, attention, rmsnorm, softmax",
    families=("gemm", "attention", "rmsnorm", "softmax"),
    capabilities=frozenset({
        "gemm:cpu-lowering", "gemm:interpreter", "gemm:race-detection", "gemm:gpu-capture",
        "attention:gpu-run", "attention:gpu-capture", "attention:cpu-lowering", "attention:interpreter",
        "attention:race-detection",
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
def register_exploits(register):
    from mosaic_target_pallas.exploits import exploits  # file paths only: no DSL import

    for exploit in exploits():
        register(exploit)


@hookimpl
def register_rewrites(register):
    from mosaic_target_pallas.rewrites import REWRITES  # ast edits only: no DSL import

    for rewrite in REWRITES:
        register(rewrite)
