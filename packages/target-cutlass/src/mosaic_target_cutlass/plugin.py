"""Entry point `cutlass`: registers the cutlass kernel language, its construct-catalog entries and the
mechanical source rewrites of its ``.cu`` kernel files (:mod:`mosaic_target_cutlass.rewrites`).

Families and capabilities are listed only as they are implemented: ``gemm`` (bf16/fp16 in, fp32
accumulate, Hopper sm_90a through CUTLASS 3.x's CollectiveBuilder). ``cpu-lowering``: nvcc builds and
budget checks run with no GPU; ``gpu-capture``: the ctypes host shim runs the kernel on a device.
"""

from mosaic.plugins import hookimpl
from mosaic.records import Language

from mosaic_target_cutlass.constructs import CONSTRUCTS
from mosaic_target_cutlass.kernel_file import CutlassFiles
from mosaic_target_cutlass.rewrites import REWRITES

LANGUAGE = Language(
    name="cutlass",
    summary="CUTLASS C++ (nvcc; CUTLASS 3.x CollectiveBuilder GEMM for Hopper sm_90a)",
    families=("gemm",),
    capabilities=frozenset({"cpu-lowering", "gpu-capture"}),
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
