"""Mosaicist: port GPU kernels between kernel languages by convergence, and build validated megakernels."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mosaic-core")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
