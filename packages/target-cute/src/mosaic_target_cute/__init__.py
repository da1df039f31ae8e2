"""Mosaicist kernel language plugin `cute`: CuTe DSL (Python, cutlass.cute; compiled ahead of time)."""
