"""Lowering checks against a GpuTarget, through core's rule table (:mod:`mosaic.budget`): every rule runs,
every problem comes back as a Diagnostic worded for a CuTe build; :func:`check` raises Unbuildable carrying
them all."""

from __future__ import annotations

import attrs
from mosaic import budget as rules
from mosaic.backend import Unbuildable
from mosaic.errors import Diagnostic
from mosaic.records import GpuTarget

from mosaic_target_cute.lowering import CuteBuild

#: the rules a CuTe build is checked by (its launch needs no particular SM count)
CODES = ("smem-per-block", "regs-per-thread", "regs-per-block", "threads-per-block", "cluster-size")


def footprint(b: CuteBuild) -> rules.Footprint:
    """What the build asks of one SM: static + dynamic shared memory, registers, threads, cluster."""
    return rules.Footprint(where=b.kernel_name[:60], smem_bytes=b.static_smem + b.dynamic_smem,
                           registers=b.registers, threads=b.threads,
                           cluster_size=b.cluster[0] * b.cluster[1] * b.cluster[2])


def _worded(d: Diagnostic, b: CuteBuild, g: GpuTarget) -> Diagnostic:
    if d.code == "smem-per-block":
        return attrs.evolve(d, message=f"static {b.static_smem} + dynamic {b.dynamic_smem} B exceed {g.name}'s "
                                       "per-block limit")
    if d.code == "regs-per-block":
        return d
    return attrs.evolve(d, message="")  # the expected/actual figures say it all


def diagnose(build: CuteBuild, gpu: GpuTarget) -> list[Diagnostic]:
    return [_worded(d, build, gpu) for d in rules.diagnose(footprint(build), gpu, CODES)]


def check(build: CuteBuild, gpu: GpuTarget) -> None:
    problems = diagnose(build, gpu)
    if problems:
        raise Unbuildable("; ".join(p.line() for p in problems), f"{gpu.name}")
