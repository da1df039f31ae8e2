"""Mosaicist kernel language plugin `cutlass`: CUTLASS C++ (nvcc; CUTLASS 3.x/CuTe C++ templates)."""
