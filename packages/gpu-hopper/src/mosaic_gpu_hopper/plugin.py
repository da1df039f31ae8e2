"""Entry point `hopper`: registers the Hopper GpuTarget records."""

from mosaic.plugins import hookimpl

from mosaic_gpu_hopper.targets import TARGETS


@hookimpl
def register_gpus(register):
    for target in TARGETS:
        register(target)
