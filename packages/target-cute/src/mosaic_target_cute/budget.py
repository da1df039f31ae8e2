"""Lowering checks against a GpuTarget: a rule table, each rule a small function with a code. All rules
run; every problem comes back as a Diagnostic; :func:`check` raises Unbuildable carrying them all."""

from __future__ import annotations

from collections.abc import Callable

from mosaic.backend import Unbuildable
from mosaic.errors import Diagnostic
from mosaic.records import GpuTarget

from mosaic_target_cute.lowering import CuteBuild

Rule = Callable[[CuteBuild, GpuTarget], Diagnostic | None]


def _smem_per_block(b: CuteBuild, g: GpuTarget):
    total = b.static_smem + b.dynamic_smem
    if total > g.smem_per_block:
        return Diagnostic("smem-per-block", b.kernel_name[:60], f"<= {g.smem_per_block}", total,
                          f"static {b.static_smem} + dynamic {b.dynamic_smem} B exceed {g.name}'s per-block limit")


def _regs_per_thread(b: CuteBuild, g: GpuTarget):
    if b.registers > g.max_regs_per_thread:
        return Diagnostic("regs-per-thread", b.kernel_name[:60], f"<= {g.max_regs_per_thread}", b.registers)


def _regs_per_block(b: CuteBuild, g: GpuTarget):
    unit = g.reg_alloc_unit
    per_warp = -(-b.registers * 32 // unit) * unit
    need = per_warp * (-(-b.threads // 32))
    if need > g.regs_per_sm:
        return Diagnostic("regs-per-block", b.kernel_name[:60], f"<= {g.regs_per_sm}", need,
                          f"{b.registers} registers x {b.threads} threads do not fit one SM")


def _threads(b: CuteBuild, g: GpuTarget):
    if b.threads > g.max_threads_per_block:
        return Diagnostic("threads-per-block", b.kernel_name[:60], f"<= {g.max_threads_per_block}", b.threads)


def _cluster(b: CuteBuild, g: GpuTarget):
    size = b.cluster[0] * b.cluster[1] * b.cluster[2]
    if size > g.max_cluster_size:
        return Diagnostic("cluster-size", b.kernel_name[:60], f"<= {g.max_cluster_size}", size)


RULES: dict[str, Rule] = {
    "smem-per-block": _smem_per_block,
    "regs-per-thread": _regs_per_thread,
    "regs-per-block": _regs_per_block,
    "threads-per-block": _threads,
    "cluster-size": _cluster,
}


def diagnose(build: CuteBuild, gpu: GpuTarget) -> list[Diagnostic]:
    return [d for rule in RULES.values() if (d := rule(build, gpu)) is not None]


def check(build: CuteBuild, gpu: GpuTarget) -> None:
    problems = diagnose(build, gpu)
    if problems:
        raise Unbuildable("; ".join(p.line() for p in problems), f"{gpu.name}")
