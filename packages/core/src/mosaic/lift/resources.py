"""Resource facts from outside the instruction stream: the ptxas -v log, occupancy, Nsight Compute metrics."""

from __future__ import annotations

import math

from mosaic.budget import registers_per_block
from mosaic.errors import BadInput
from mosaic.toolchain.ptxas import parse_log


def parse_ptxas_log(text: str) -> dict[str, dict]:
    """Per function: registers, spill store/load bytes, stack frame, static smem from ``ptxas -v`` output
    (the figures :func:`mosaic.toolchain.ptxas.parse_log` found, under the lifter's names)."""
    out: dict[str, dict] = {}
    for f in parse_log(text):
        if not f.name:  # lines before the first function
            continue
        entry = out.setdefault(f.name, {})
        for key, value in (("stack_frame", f.stack_frame), ("spill_store_bytes", f.spill_stores),
                           ("spill_load_bytes", f.spill_loads), ("registers", f.registers),
                           ("static_smem", f.static_smem)):
            if value is not None:
                entry[key] = value
    return out


def occupancy(gpu, threads_per_block: int, registers: int, smem_bytes: int) -> dict:
    """Resident blocks and warps per SM from the GpuTarget record (CUDA occupancy rules, sm_80+ units)."""
    warps = math.ceil(threads_per_block / 32)
    limits = {"threads": gpu.max_threads_per_sm // max(1, warps * 32), "blocks": gpu.max_blocks_per_sm}
    if registers:
        need = registers_per_block(registers, threads_per_block, gpu)
        limits["registers"] = gpu.regs_per_sm // need if need else gpu.max_blocks_per_sm
    smem = smem_bytes + gpu.smem_reserved_per_block
    limits["shared memory"] = gpu.smem_per_sm // smem if smem else gpu.max_blocks_per_sm
    blocks = max(0, min(limits.values()))
    limiter = min(limits, key=lambda k: limits[k])
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps, "limiter": limiter}


# Nsight Compute metric names (or prefixes) read by the machine layer.
METRICS = {
    "tensor_pipe": ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                    "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
                    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"),
    "memory_throughput": ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                          "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
    "occupancy.achieved": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "l2.hit_rate": ("lts__t_sector_hit_rate.pct",),
}
# stall reasons: per-issue warp-latency ratios (WarpStateStats) or PC-sampling counts (SourceCounters); the
# first family present is used, never a sum of both (their units differ)
STALL_PREFIXES = ("smsp__average_warps_issue_stalled_", "smsp__average_warp_latency_issue_stalled_",
                  "smsp__pcsamp_warps_issue_stalled_", "smsp__warp_issue_stalled_")
STALL_SUFFIXES = ("_per_issue_active", "_per_warp_active")


def read_metrics(data, where: str) -> dict:
    """Flatten a bundle's metrics JSON: ``{name: number}`` or ``{"metrics": {name: number | {"value": n}}}``."""
    if data is None:
        return {}
    if isinstance(data, dict) and isinstance(data.get("metrics"), dict):
        data = data["metrics"]
    if not isinstance(data, dict):
        raise BadInput("metrics file must be a JSON object of metric name -> number", where)
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            v = v.get("value")
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[str(k)] = float(v)
    return out


def stall_top(metrics: dict, n: int = 3) -> list | None:
    """The ``n`` largest stall reasons, from the first metric family (:data:`STALL_PREFIXES`) the profile
    holds; ``*_not_issued`` variants (the same stall counted when no instruction issued) are left out."""
    for p in STALL_PREFIXES:
        stalls: dict[str, float] = {}
        for k, v in metrics.items():
            if not k.startswith(p):
                continue
            reason = k[len(p):].split(".")[0]
            for suffix in STALL_SUFFIXES:
                reason = reason.removesuffix(suffix)
            if not reason.endswith("_not_issued"):
                stalls[reason] = stalls.get(reason, 0.0) + v
        if stalls:
            return [r for r, _ in sorted(stalls.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]
    return None


def metric(metrics: dict, names: tuple) -> float | None:
    for name in names:
        if name in metrics:
            return round(metrics[name], 1)
    return None
