"""The ``cute`` language backend (see ``mosaic.backend``): knobs, lower, prepare.

Inputs of ``gemm``: ``a`` (m×k) and ``b`` (k×n) row-major, bf16/f16; output ``c`` (m×n), same dtype.
``lower`` compiles ahead of time for ``gpu.arch`` with no GPU, keeps PTX and cubin, disassembles SASS
when nvdisasm is found, re-assembles the PTX with ``ptxas -v`` for the resource log when ptxas is found,
and checks shared memory, registers, threads and cluster size against the GpuTarget record; it also keeps the
compiled function (:mod:`mosaic_target_cute.artifact_store`), which ``prepare`` on the GPU loads instead of
compiling again (it compiles, and says why, when the artifact is missing or foreign).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from mosaic.backend import Lowered, Unbuildable
from mosaic.errors import BadInput, RecordError
from mosaic.records import GpuTarget, KernelSpec, ResourceUsage

from mosaic_target_cute import artifact_store, blackwell_budget, budget
from mosaic_target_cute.knobs import FAMILY_KNOBS, GemmKnobs
from mosaic_target_cute.lowering import compile_gemm, disassemble, line_info, ptxas_log


def gemm_dims(spec: KernelSpec) -> tuple[int, int, int]:
    try:
        return spec.shape["m"], spec.shape["n"], spec.shape["k"]
    except KeyError as exc:
        raise BadInput(f"gemm shape needs m, n, k; got {sorted(spec.shape)}", f"missing {exc}") from None


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

    def prepare(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path, inputs: dict[str, Any]):
        from mosaic_target_cute.runnable import CuteRunnable

        knobs, (m, n, k) = self._knobs(spec)
        for key, shape in (("a", (m, k)), ("b", (k, n))):
            if key not in inputs or tuple(np.shape(inputs[key])) != shape:
                raise BadInput(f"gemm input '{key}' must have shape {shape}",
                               f"got {None if key not in inputs else np.shape(inputs[key])}")
        return CuteRunnable(knobs, (m, n, k), spec.dtype, gpu, Path(workdir), inputs["a"], inputs["b"])
