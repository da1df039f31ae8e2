"""Pallas Mosaic GPU kernel files (``.py``): the ``pallas`` language's side of :mod:`mosaic.kernel_files`.

Besides the language-neutral contract (``ENTRY``, ``INPUTS``, ``OUTPUTS``, a frozen ``Knobs`` dataclass) a
Pallas file's entry is a jax function called as ``ENTRY(*inputs, knobs)`` on jax arrays of the contract's
shapes, returning its one output (jax's own Pallas ops take their ``TuningConfig`` the same way).

``lower`` imports the file (in the capture's child process only), traces the entry with
``jax.ShapeDtypeStruct`` inputs and lowers it for the ``cuda`` platform with no GPU -- the Mosaic GPU
module is built then, so a kernel Mosaic GPU cannot express fails here -- after probing its shared memory
(jax's own check, with a zero budget) against the GpuTarget record. PTX and SASS exist only after the GPU
compile: with a CUDA backend, ``lower`` also runs the kernel once with ``MOSAIC_GPU_DUMP_TO`` set, as the
project's own Pallas kernels do. ``prepare`` (GPU) wraps the entry in a :class:`PallasRunnable`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mosaic import budget as fit
from mosaic.backend import Lowered, Unbuildable
from mosaic.errors import BadInput
from mosaic.kernel_files import KernelFile, PythonFileBackend, failure
from mosaic.records import GpuTarget, KernelSpec

from mosaic_target_pallas.backend import (
    PallasBackend,
    _smem_limit,
    _toolchain,
    assemble_ptx,
    gpu_compile_dump,
    jax_has_gpu,
)

JAX_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


class PallasFileBackend(PythonFileBackend):
    """The mosaic.backend methods for one Pallas Mosaic GPU kernel file."""

    module_name = "mosaic_pallas_kernel_file"

    def check(self, spec: KernelSpec) -> None:
        self.check_family(spec)
        if len(self.kfile.outputs) != 1:
            raise BadInput("a Pallas kernel file returns one output (OUTPUTS names one array)", self.kfile.path)
        self.knob_instance(spec)

    def _fn(self, spec: KernelSpec):
        import jax
        import jax.numpy as jnp

        if spec.dtype not in JAX_DTYPES:
            raise Unbuildable(f"a Pallas kernel file builds dtypes {', '.join(JAX_DTYPES)}, not {spec.dtype}",
                              self.kfile.name)
        dtype = getattr(jnp, JAX_DTYPES[spec.dtype])
        knobs = self.knob_instance(spec)
        entry = getattr(self.module(), self.kfile.entry)

        def fn(*inputs):
            return entry(*inputs, knobs)

        args = tuple(jax.ShapeDtypeStruct(op.shape(spec.shape), dtype) for op in self.kfile.inputs)
        return fn, args, dtype

    def _trace_lower(self, fn, args, budget: int | None = None):
        import jax

        try:
            if budget is None:
                return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
            with _smem_limit(budget):
                return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's kernel: a failed lowering is unbuildable
            raise failure("Mosaic GPU lowering failed", exc, self.kfile.name) from None

    def lower(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path) -> Lowered:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        fn, args, dtype = self._fn(spec)
        try:
            smem = PallasBackend().smem_bytes(fn, args)
        except Unbuildable:
            raise
        except Exception as exc:  # noqa: BLE001 - the probe traces the user's kernel
            raise failure("Mosaic GPU lowering failed", exc, self.kfile.name) from None
        if smem:
            over = fit.diagnose(fit.Footprint(where=self.kfile.name, smem_bytes=smem), gpu, ("smem-per-block",))
            if over:
                raise Unbuildable(f"shared memory {smem} B exceeds {gpu.name}'s {gpu.smem_per_block} B per block",
                                  self.kfile.name)
        try:
            lowered = self._trace_lower(fn, args, gpu.smem_per_block)
        except ValueError as exc:
            raise Unbuildable(f"Mosaic GPU lowering failed: {str(exc).splitlines()[0][:400]}", self.kfile.name) from None
        mlir = lowered.as_text()
        (workdir / f"{Path(self.kfile.name).stem}.stablehlo.mlir").write_text(mlir)
        source = workdir / self.kfile.name
        source.write_text(self.kfile.source)
        values = self.kfile.knob_values(spec.knobs)
        notes = [f"kernel file {self.kfile.name} sha256 {self.kfile.sha256}",
                 f"knobs {self.kfile.knob_class}({', '.join(f'{k}={v}' for k, v in values.items())})",
                 f"smem_bytes={smem}", f"stablehlo {len(mlir)} characters (holds the serialised Mosaic GPU module)"]
        ptx = sass = log = resources = cubin = None
        toolchain = _toolchain()
        if jax_has_gpu():
            ptx, sass, log, resources = gpu_compile_dump(fn, args, workdir / "mosaic_dump")
            if ptx is not None and sass is None:
                asm = assemble_ptx(ptx, gpu.arch, workdir / "from_ptx", runtime_log=log)
                cubin, sass = asm.cubin, asm.sass
                notes.extend(asm.notes)
        else:
            notes.append("PTX/SASS/ptxas log come from the GPU compile (MOSAIC_GPU_DUMP_TO); no GPU here")
        return Lowered(kernel_name=self.kfile.entry, ptx=ptx, cubin=cubin, sass=sass, ptxas_log=log, source=source,
                       resources=resources, toolchain=toolchain, notes=tuple(notes))

    def prepare(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path, inputs: dict[str, Any]):
        from mosaic_target_pallas.runnable import PallasRunnable

        if not jax_has_gpu():
            raise Unbuildable("a Pallas kernel file's prepare needs jax with a CUDA backend and a GPU", "prepare")
        if sorted(inputs) != sorted(o.name for o in self.kfile.inputs):
            raise Unbuildable(f"the family's inputs are {', '.join(sorted(inputs))}; the file's INPUTS "
                              f"{', '.join(o.name for o in self.kfile.inputs)}", self.kfile.name)
        fn, _, dtype = self._fn(spec)
        out = self.kfile.outputs[0]
        return PallasRunnable(fn, [inputs[o.name] for o in self.kfile.inputs], dtype, out.shape(spec.shape),
                              out_name=out.name)


class PallasFiles(PallasBackend):
    """The pallas backend that also builds Pallas Mosaic GPU kernel files: ``kernel_file(kfile)``."""

    kernel_file_syntax = "python"

    def kernel_file(self, kfile: KernelFile) -> PallasFileBackend:
        return PallasFileBackend(kfile)
