"""Entry point `cutlass`: registers the cutlass kernel language, its construct-catalog entries and the
mechanical source rewrites of its ``.cu`` kernel files (:mod:`mosaic_target_cutlass.rewrites`).

Families and capabilities are listed only as they are implemented:

* ``gemm`` (bf16/fp16 in, fp32 accumulate; Hopper sm_90a through CUTLASS 3.x's CollectiveBuilder, Blackwell sm_100a
  through the Sm100 builder): ``gemm:cpu-lowering`` (nvcc builds and budget checks with no GPU) and
  ``gemm:gpu-capture`` (the ctypes host shim runs the kernel on a device).
* ``attention`` (forward, bf16/fp16, head_dim 64/128, causal, grouped-query heads; the project's CuTe C++ kernel,
  templates/attention_sm90.cuh, sm_90a): ``attention:cpu-lowering`` only -- PTX, cubin, SASS, ptxas figures, budget
  rules and a host-side check of its fragment maps. It has no device runner (``prepare`` refuses) and has not run on
  a GPU: its numerics are unverified until ``tools/attention_selfcheck.sh --run`` passes on an sm_90 GPU.

``cpu-lowering`` (unqualified) holds for every family.
"""

from mosaic.plugins import hookimpl
from mosaic.records import Language

from mosaic_target_cutlass.constructs import CONSTRUCTS
from mosaic_target_cutlass.kernel_file import CutlassFiles
from mosaic_target_cutlass.rewrites import REWRITES

LANGUAGE = Language(
    name="cutlass",
    summary="CUTLASS C++ (nvcc; CUTLASS 3.x CollectiveBuilder GEMM for Hopper sm_90a, a CuTe C++ attention forward)",
    families=("gemm", "attention"),
    capabilities=frozenset({"cpu-lowering", "gemm:cpu-lowering", "gemm:gpu-capture", "attention:cpu-lowering"}),
    backend=CutlassFiles(),  # the CUTLASS templates, and .cu kernel files (mosaic capture --file)
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
    for rewrite in REWRITES:
        register(rewrite)
