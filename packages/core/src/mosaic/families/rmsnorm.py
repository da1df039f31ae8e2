"""RMSNorm (``rows x cols``): its dimensions and work. The float64 oracle is :mod:`mosaic.oracle.rmsnorm`."""

from __future__ import annotations

from collections.abc import Mapping

from mosaic.families.family import Family

DIMS = ("rows", "cols")


def work(shape: Mapping[str, int], e: float) -> tuple[float, float]:
    """(FLOPs, bytes): about four operations per element; the input read and the output written once."""
    return 4.0 * shape["rows"] * shape["cols"], 2.0 * e * shape["rows"] * shape["cols"]


FAMILY = Family("rmsnorm", DIMS, work)
