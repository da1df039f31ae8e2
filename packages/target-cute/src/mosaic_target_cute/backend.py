"""The ``cute`` language backend (see ``mosaic.backend``): knobs, lower, prepare.

Inputs of ``gemm``: ``a`` (m×k) and ``b`` (k×n) row-major, bf16/f16; output ``c`` (m×n), same dtype.
Inputs of ``attention``: ``q`` (batch, heads, seq, head_dim), ``k`` and ``v`` (batch, kv_heads, seq, head_dim),
bf16/f16; output ``o`` like ``q`` (:mod:`mosaic.families.attention`). Its ``lower`` first holds the knobs to the
budget rules (:func:`mosaic_target_cute.budget.attention_diagnose`), then compiles and checks the build's own
figures; its ``prepare`` (GPU, torch) runs it (first on an H100 on 2026-12-07).
``lower`` compiles ahead of time for ``gpu.arch`` with no GPU, keeps PTX and cubin, disassembles SASS
when nvdisasm is found, re-assembles the PTX with ``ptxas -v`` for the resource log when ptxas is found,
and checks shared memory, registers, threads and cluster size against the GpuTarget record; it also keeps the
compiled function (:mod:`mosaic_target_cute.artifact_store`), which ``prepare`` on the GPU loads instead of
compiling again (it compiles, and says why, when the artifact is missing or foreign).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from mosaic.backend import Lowered, Unbuildable
from mosaic.errors import BadInput, RecordError
from mosaic.records import GpuTarget, KernelSpec, ResourceUsage

from mosaic_target_cute import artifact_store, blackwell_budget, budget
from mosaic_target_cute.knobs import FAMILY_KNOBS, AttentionKnobs, AttentionShape, GemmKnobs
from mosaic_target_cute.lowering import compile_attention, compile_gemm, disassemble, line_info, ptxas_log


def gemm_dims(spec: KernelSpec) -> tuple[int, int, int]:
    try:
        return spec.shape["m"], spec.shape["n"], spec.shape["k"]
    except KeyError as exc:
        raise BadInput(f"gemm shape needs m, n, k; got {sorted(spec.shape)}", f"missing {exc}") from None


def attention_shape(spec: KernelSpec) -> AttentionShape:
    try:
        return AttentionShape.from_shape(spec.shape)
    except KeyError as exc:
        raise BadInput(f"attention shape needs batch, seq, heads, head_dim; got {sorted(spec.shape)}",
                       f"missing {exc}") from None


def attention_knobs(spec: KernelSpec, gpu: GpuTarget) -> tuple[AttentionKnobs, AttentionShape]:
    """The spec's knobs and problem, refused (Unbuildable, every broken rule named) when the knobs do not build for
    the problem or break a budget rule (:func:`mosaic_target_cute.budget.attention_diagnose`)."""
    knobs = AttentionKnobs(**spec.knobs)
    shape = attention_shape(spec)
    try:
        knobs.check_shape(shape)
    except RecordError as exc:
        raise Unbuildable(str(exc), spec.name or "attention") from None
    problems = budget.attention_diagnose(knobs, shape, gpu)
    if problems:
        raise Unbuildable("; ".join(p.line() for p in problems), gpu.name)
    return knobs, shape


SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _spills(log: Path | None) -> str:
    text = log.read_text() if log is not None else ""
    found = SPILL_RE.findall(text)
    if not found:
        return "spills=unknown (no ptxas log)"
    stores, loads = (sum(int(f[i]) for f in found) for i in (0, 1))
    return f"spill_stores={stores} spill_loads={loads}"


def _toolchain() -> dict:
    from importlib.metadata import version

    return {"nvidia-cutlass-dsl": version("nvidia-cutlass-dsl")}


def keep_compiled(compiled, build, knobs: GemmKnobs, mnk, dtype: str, gpu: GpuTarget) -> str:
    """Keep the lowering's compiled function for the GPU worker (:mod:`artifact_store`); the lowering's note.
    A failure to keep it is noted, never fatal: the worker then compiles."""
    inputs = artifact_store.key_inputs(knobs, *mnk, dtype, gpu.arch, gpu.sm_count, line_info())
    key = artifact_store.artifact_key(inputs)
    try:
        where = artifact_store.save(compiled, build, key, inputs)
    except Exception as exc:  # noqa: BLE001 - the DSL raises many types; the worker compiles instead
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        return f"artifact=not kept ({type(exc).__name__}: {first[:200]})"
    return f"artifact={key[:12]}" if where is not None else "artifact=off"


class CuteBackend:
    """CuTe DSL kernels compiled ahead of time (cute.compile) for sm_90a (hopper) or sm_100a (blackwell)."""

    def knobs(self, family: str) -> type:
        if family not in FAMILY_KNOBS:
            raise BadInput(f"cute has no family '{family}'; known: {', '.join(FAMILY_KNOBS)}", "family")
        return FAMILY_KNOBS[family]

    def _knobs(self, spec: KernelSpec) -> tuple[GemmKnobs, tuple[int, int, int]]:
        if spec.family != "gemm":
            raise Unbuildable(f"cute has no family '{spec.family}'", spec.family)
        knobs = GemmKnobs(**spec.knobs)
        m, n, k = gemm_dims(spec)
        try:
            knobs.check_shape(m, n, k)
        except RecordError as exc:
            raise Unbuildable(str(exc), spec.name or "gemm") from None
        return knobs, (m, n, k)

    def lower(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path) -> Lowered:
        if spec.family == "attention":
            return self._lower_attention(spec, gpu, Path(workdir))
        knobs, (m, n, k) = self._knobs(spec)
        knobs, picked = blackwell_budget.for_gpu(knobs, gpu)
        if knobs.kernel == "blackwell":
            refused = blackwell_budget.refusals(knobs, gpu)
            if refused:
                raise Unbuildable("; ".join(p.line() for p in refused), gpu.name)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        compiled, build = compile_gemm(knobs, m, n, k, spec.dtype, gpu.arch, gpu.sm_count, workdir / "cute_dump")
        budget.check(build, gpu)
        kept = keep_compiled(compiled, build, knobs, (m, n, k), spec.dtype, gpu)
        name = spec.name or f"cute_gemm_{knobs.kernel}"
        sass = disassemble(build.cubin, workdir / f"{name}.sass")
        log = ptxas_log(build.ptx, gpu.arch, workdir / f"{name}.ptxas.log")
        notes = (f"dynamic_smem={build.dynamic_smem}", f"threads={build.threads}", f"cluster={build.cluster}",
                 f"grid_ctas={build.grid_ctas}", f"compile_seconds={build.compile_seconds:.2f}", kept,
                 *((picked,) if picked else ()))
        return Lowered(kernel_name=build.kernel_name, ptx=build.ptx, cubin=build.cubin, sass=sass,
                       ptxas_log=log, source=Path(__file__).parent / "kernels" / (
                           f"{knobs.kernel}_gemm.py"),
                       resources=ResourceUsage(registers=build.registers, static_smem=build.static_smem),
                       toolchain=_toolchain(), notes=notes)

    def _lower_attention(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path) -> Lowered:
        knobs, shape = attention_knobs(spec, gpu)
        workdir.mkdir(parents=True, exist_ok=True)
        compiled, build = compile_attention(knobs, shape, spec.dtype, gpu.arch, gpu.sm_count, workdir / "cute_dump")
        budget.check_attention(build, knobs, gpu)
        name = spec.name or f"cute_attention_{knobs.kernel}"
        sass = disassemble(build.cubin, workdir / f"{name}.sass")
        log = ptxas_log(build.ptx, gpu.arch, workdir / f"{name}.ptxas.log")
        notes = (f"dynamic_smem={build.dynamic_smem}", f"threads={build.threads}", f"cluster={build.cluster}",
                 f"grid_ctas={build.grid_ctas}", f"compile_seconds={build.compile_seconds:.2f}", _spills(log),
                 "artifact=not kept (the artifact store keys gemm builds only: prepare compiles attention again)")
        if knobs.kernel == "hopper":
            regs = budget.consumer_registers(knobs, shape)
            notes += (f"setmaxnreg=producer {knobs.producer_regs}, consumers {knobs.consumer_warpgroups} x "
                      f"{knobs.consumer_regs}", f"consumer_regs_estimate=S {regs['S']} + O {regs['O']} + P {regs['P']}"
                      f" + {regs['other']}")
        return Lowered(kernel_name=build.kernel_name, ptx=build.ptx, cubin=build.cubin, sass=sass, ptxas_log=log,
                       source=Path(__file__).parent / "kernels" / f"{knobs.kernel}_attention.py",
                       resources=ResourceUsage(registers=build.registers, static_smem=build.static_smem),
                       toolchain=_toolchain(), notes=notes)

    def prepare(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path, inputs: dict[str, Any]):
        if spec.family == "attention":
            from mosaic_target_cute.runnable import CuteAttentionRunnable

            knobs, shape = attention_knobs(spec, gpu)
            want = {"q": (shape.batch, shape.heads, shape.seq, shape.head_dim),
                    "k": (shape.batch, shape.kv_heads, shape.seq, shape.head_dim),
                    "v": (shape.batch, shape.kv_heads, shape.seq, shape.head_dim)}
            for key, want_shape in want.items():
                if key not in inputs or tuple(np.shape(inputs[key])) != want_shape:
                    raise BadInput(f"attention input '{key}' must have shape {want_shape}",
                                   f"got {None if key not in inputs else np.shape(inputs[key])}")
            return CuteAttentionRunnable(knobs, shape, spec.dtype, gpu, Path(workdir), inputs["q"], inputs["k"],
                                         inputs["v"])
        from mosaic_target_cute.runnable import CuteRunnable

        knobs, (m, n, k) = self._knobs(spec)
        for key, shape in (("a", (m, k)), ("b", (k, n))):
            if key not in inputs or tuple(np.shape(inputs[key])) != shape:
                raise BadInput(f"gemm input '{key}' must have shape {shape}",
                               f"got {None if key not in inputs else np.shape(inputs[key])}")
        return CuteRunnable(knobs, (m, n, k), spec.dtype, gpu, Path(workdir), inputs["a"], inputs["b"])
