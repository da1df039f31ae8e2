"""Does it fit the GpuTarget? One rule table for every target plugin and AMK.

A caller describes what one launch asks of the GPU as a :class:`Footprint` (shared memory, registers,
threads, cluster size, resident SMs; a figure it does not know is ``None`` and its rules are skipped) and
:func:`diagnose` runs every rule of :data:`RULES` (tinygrad ``uop/spec.py`` style: one function per code),
returning one :class:`~mosaic.errors.Diagnostic` per limit exceeded, never stopping at the first. Targets
word the diagnostics for their own reports (``attrs.evolve(d, message=...)``) but never restate a limit.

Codes: ``smem-per-block``, ``smem-per-sm`` (with the block's reserved shared memory), ``regs-per-thread``,
``regs-per-block`` (allocated per warp in ``reg_alloc_unit`` steps), ``threads-per-block``, ``cluster-size``,
``sm-count``. The GpuTarget record states no tensor-memory (TMEM) size yet, so there is no TMEM rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from mosaic.errors import CheckFailed, Diagnostic
from mosaic.records import GpuTarget


def _opt_int(inst, attribute, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"Footprint.{attribute.name}={value!r} must be None or an integer >= 0")


@attrs.frozen
class Footprint:
    """What one launch asks of a GPU. ``where`` names it in every diagnostic (a kernel, a config)."""

    where: str
    smem_bytes: int | None = attrs.field(default=None, validator=_opt_int)  # one block: static + dynamic
    registers: int | None = attrs.field(default=None, validator=_opt_int)  # per thread
    threads: int | None = attrs.field(default=None, validator=_opt_int)  # per block
    cluster_size: int | None = attrs.field(default=None, validator=_opt_int)  # CTAs per cluster
    sms: int | None = attrs.field(default=None, validator=_opt_int)  # SMs it needs at once (persistent blocks)


Rule = Callable[[Footprint, GpuTarget], Diagnostic | None]


def _smem_per_block(f: Footprint, g: GpuTarget) -> Diagnostic | None:
    if f.smem_bytes is not None and f.smem_bytes > g.smem_per_block:
        return Diagnostic("smem-per-block", f.where, f"<= {g.smem_per_block}", f.smem_bytes,
                          f"{f.smem_bytes} B of shared memory exceed {g.name}'s {g.smem_per_block} B per block")
    return None


def _smem_per_sm(f: Footprint, g: GpuTarget) -> Diagnostic | None:
    if f.smem_bytes is not None and f.smem_bytes + g.smem_reserved_per_block > g.smem_per_sm:
        need = f.smem_bytes + g.smem_reserved_per_block
        return Diagnostic("smem-per-sm", f.where, f"<= {g.smem_per_sm}", need,
                          f"{f.smem_bytes} B + {g.smem_reserved_per_block} B reserved exceed {g.name}'s "
                          f"{g.smem_per_sm} B per SM")
    return None


def _regs_per_thread(f: Footprint, g: GpuTarget) -> Diagnostic | None:
    if f.registers is not None and f.registers > g.max_regs_per_thread:
        return Diagnostic("regs-per-thread", f.where, f"<= {g.max_regs_per_thread}", f.registers,
                          f"{f.registers} registers per thread exceed {g.name}'s {g.max_regs_per_thread}")
    return None


def registers_per_block(registers: int, threads: int, gpu: GpuTarget) -> int:
    """Registers one block occupies: per warp, ``registers x 32`` rounded up to ``reg_alloc_unit``."""
    unit = gpu.reg_alloc_unit
    return -(-registers * 32 // unit) * unit * -(-threads // 32)


def _regs_per_block(f: Footprint, g: GpuTarget) -> Diagnostic | None:
    if f.registers is None or f.threads is None:
        return None
    need = registers_per_block(f.registers, f.threads, g)
    if need > g.regs_per_sm:
        return Diagnostic("regs-per-block", f.where, f"<= {g.regs_per_sm}", need,
                          f"{f.registers} registers x {f.threads} threads do not fit one SM")
    return None


def _threads_per_block(f: Footprint, g: GpuTarget) -> Diagnostic | None:
    if f.threads is not None and f.threads > g.max_threads_per_block:
        return Diagnostic("threads-per-block", f.where, f"<= {g.max_threads_per_block}", f.threads,
                          f"{f.threads} threads per block exceed {g.name}'s {g.max_threads_per_block}")
    return None


def _cluster_size(f: Footprint, g: GpuTarget) -> Diagnostic | None:
    if f.cluster_size is not None and f.cluster_size > g.max_cluster_size:
        return Diagnostic("cluster-size", f.where, f"<= {g.max_cluster_size}", f.cluster_size,
                          f"clusters of {f.cluster_size} CTAs exceed {g.name}'s {g.max_cluster_size}")
    return None


def _sm_count(f: Footprint, g: GpuTarget) -> Diagnostic | None:
    if f.sms is not None and f.sms > g.sm_count:
        return Diagnostic("sm-count", f.where, f"<= {g.sm_count}", f.sms, f"{g.name} has {g.sm_count} SMs")
    return None


#: code -> rule, in report order
RULES: dict[str, Rule] = {
    "smem-per-block": _smem_per_block,
    "smem-per-sm": _smem_per_sm,
    "regs-per-thread": _regs_per_thread,
    "regs-per-block": _regs_per_block,
    "threads-per-block": _threads_per_block,
    "cluster-size": _cluster_size,
    "sm-count": _sm_count,
}


def diagnose(footprint: Footprint, gpu: GpuTarget, codes: Iterable[str] | None = None) -> list[Diagnostic]:
    """Every limit of ``gpu`` that ``footprint`` exceeds, in :data:`RULES` order (all rules run).

    ``codes`` limits the table to the rules a caller checks (an unknown code is a ValueError).
    """
    chosen = list(RULES) if codes is None else list(codes)
    unknown = [c for c in chosen if c not in RULES]
    if unknown:
        raise ValueError(f"unknown budget rule(s) {unknown}; known: {', '.join(RULES)}")
    return [d for code, rule in RULES.items() if code in chosen and (d := rule(footprint, gpu)) is not None]


def check(footprint: Footprint, gpu: GpuTarget, codes: Iterable[str] | None = None) -> None:
    """:func:`diagnose`, raising :class:`~mosaic.errors.CheckFailed` with every diagnostic when any."""
    problems = diagnose(footprint, gpu, codes)
    if problems:
        raise CheckFailed(f"{footprint.where} does not fit {gpu.name}", problems)
