"""Entry point `blackwell`: registers the Blackwell GpuTarget records."""

from mosaic.plugins import hookimpl

from mosaic_gpu_blackwell.targets import TARGETS


@hookimpl
def register_gpus(register):
    for target in TARGETS:
        register(target)
