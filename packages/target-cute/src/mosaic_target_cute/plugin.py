"""Entry point `cute`: registers the cute kernel language and its construct-catalog entries.

Capabilities: ``gemm:cpu-lowering`` (cute.compile for sm_90a with no GPU, PTX + cubin kept, budgets
checked against the GpuTarget), ``gemm:gpu-capture`` (``prepare`` on a GPU with torch for device
memory), and the same three for ``attention`` (kernels/hopper_attention.py, kernels/naive_attention.py):
``attention:cpu-lowering`` and ``attention:budget-check`` are tested on the CPU; ``attention:gpu-capture``'s
``prepare`` first ran on an H100 on 2026-12-07 (tests/test_attention_gpu.py: all configurations pass the oracle). Needs Python >= 3.12 and nvidia-cutlass-dsl (``pip install
'mosaic-target-cute[dsl]'``); the plugin imports no CuTe code until a backend method runs.
"""

from mosaic.plugins import hookimpl
from mosaic.records import Language

from mosaic_target_cute.constructs import ATTENTION_CONSTRUCTS, CONSTRUCTS
from mosaic_target_cute.kernel_file import CuteFiles

LANGUAGE = Language(
    name="cute",
    summary="CuTe DSL (Python, cutlass.cute; compiled ahead of time): warp-specialised Hopper gemm and attention "
            "forward, naive gemm and attention",
    families=("gemm", "attention"),
    capabilities=frozenset({"gemm:cpu-lowering", "gemm:gpu-capture", "gemm:budget-check",
                            "attention:cpu-lowering", "attention:budget-check", "attention:gpu-capture"}),
    backend=CuteFiles(),  # the project's CuTe kernels, and CuTe DSL kernel files (mosaic capture --file)
)


@hookimpl
def register_languages(register):
    register(LANGUAGE)


@hookimpl
def register_constructs(register):
    for construct in CONSTRUCTS + ATTENTION_CONSTRUCTS:
        register(construct)


@hookimpl
def register_rewrites(register):
    from mosaic_target_cute.rewrites import REWRITES  # ast edits only: no DSL import

    for rewrite in REWRITES:
        register(rewrite)
