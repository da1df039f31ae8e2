"""NVIDIA Blackwell GPU records for Mosaicist."""

from mosaic_gpu_blackwell.targets import B200, RTX_5090, TARGETS

__all__ = ["B200", "RTX_5090", "TARGETS"]
