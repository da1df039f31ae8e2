"""Attention (``batch x seq x heads x head_dim``): its dimensions and work. The float64 oracle is
:mod:`mosaic.oracle.attention`."""

from __future__ import annotations

from collections.abc import Mapping

from mosaic.families.family import Family

DIMS = ("batch", "seq", "heads", "head_dim")


def work(shape: Mapping[str, int], e: float) -> tuple[float, float]:
    """(FLOPs, bytes): QK^T and PV (2 * 2 * b * h * q^2 * d); q, k, v read and o written once."""
    b, q, h, d = shape["batch"], shape["seq"], shape["heads"], shape["head_dim"]
    return 4.0 * b * h * q * q * d, 4.0 * e * b * q * h * d


FAMILY = Family("attention", DIMS, work)
