"""Mosaicist kernel language plugin `pallas`: Pallas Mosaic GPU (jax.experimental.pallas, plgpu)."""
