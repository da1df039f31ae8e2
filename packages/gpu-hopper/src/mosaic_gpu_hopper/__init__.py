"""NVIDIA Hopper GPU records for Mosaicist."""

from mosaic_gpu_hopper.targets import H100_PCIE, H100_SXM, H200, TARGETS

__all__ = ["H100_PCIE", "H100_SXM", "H200", "TARGETS"]
