"""Entry point `cutlass`: registers the cutlass kernel language, its construct-catalog entries and the
mechanical source rewrites of its ``.cu`` kernel files (:mod:`mosaic_target_cutlass.rewrites`).

Families and capabilities are listed only as they are implemented:

* ``gemm`` (bf16/fp16 in, fp32 accumulate; Hopper sm_90a through CUTLASS 3.x's CollectiveBuilder, Blackwell sm_100a
  through the Sm100 builder): ``gemm:cpu-lowering`` (nvcc builds and budget checks with no GPU) and
  ``gemm:gpu-capture`` (the ctypes host shim runs the kernel on a device).
* ``attention`` (forward, bf16/fp16, head_dim 64/128, causal, grouped-query heads; the project's CuTe C++ kernel,
  templates/attention_sm90.cuh, sm_90a): ``attention:cpu-lowering`` -- PTX, cubin, SASS, ptxas figures, budget rules
  and a host-side check of its fragment maps -- and ``attention:gpu-capture``: ``prepare`` builds the lowering's own
  translation unit and runs it through the build's ctypes shim (``backend.AttentionRunnable``, the GEMM's mechanism).
  The kernel's numerics were verified on an H100 on 2026-12-07 by ``tools/attention_selfcheck.sh --run`` (the template
  in a stand-alone program: 5 problems over 4 configurations against a float64 reference, ALL PASS); the runner itself
  has not run on a GPU yet (``tests/test_attention_gpu.py``, ``tools/attention_capture_check.sh``).

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
    capabilities=frozenset({"cpu-lowering", "gemm:cpu-lowering", "gemm:gpu-capture", "attention:cpu-lowering",
                            "attention:gpu-capture"}),
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
