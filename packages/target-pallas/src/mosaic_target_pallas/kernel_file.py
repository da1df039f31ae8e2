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

import os
from pathlib import Path
from typing import Any

from mosaic import budget as fit
from mosaic.backend import Lowered, Unbuildable
from mosaic.errors import BadInput
from mosaic.kernel_files import KernelFile, load_python_module, make_knobs
from mosaic.records import GpuTarget, KernelSpec

from mosaic_target_pallas.backend import (
    PallasBackend,
    _smem_limit,
    _toolchain,
    assemble_ptx,
    collect_dump,
    jax_has_gpu,
)

JAX_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


class PallasFileBackend:
    """The mosaic.backend methods for one Pallas Mosaic GPU kernel file."""

    def __init__(self, kfile: KernelFile):
        self.kfile = kfile
        self._module = None

    def knobs(self, family: str) -> type:
        raise BadInput("a kernel file's knobs are its own class (mosaic.kernel_files)", "--knob")

    def check(self, spec: KernelSpec) -> None:
        from mosaic.families import get

        fam = get(spec.family)
        if fam is None:
            raise BadInput(f"no family '{spec.family}'", "--family")
        self.kfile.check_family(tuple(fam.dims), fam.optional_dims)
        if len(self.kfile.outputs) != 1:
            raise BadInput("a Pallas kernel file returns one output (OUTPUTS names one array)", self.kfile.path)
        make_knobs(self.module(), self.kfile, self.kfile.knob_values(spec.knobs))

    def module(self):
        if self._module is None:
            self._module = load_python_module(self.kfile, "mosaic_pallas_kernel_file")
        return self._module

    def _fn(self, spec: KernelSpec):
        import jax
        import jax.numpy as jnp

        if spec.dtype not in JAX_DTYPES:
            raise Unbuildable(f"a Pallas kernel file builds dtypes {', '.join(JAX_DTYPES)}, not {spec.dtype}",
                              self.kfile.name)
        dtype = getattr(jnp, JAX_DTYPES[spec.dtype])
        module = self.module()
        knobs = make_knobs(module, self.kfile, self.kfile.knob_values(spec.knobs))
        entry = getattr(module, self.kfile.entry)

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
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
            raise Unbuildable(f"Mosaic GPU lowering failed: {type(exc).__name__}: {first[:400]}",
                              self.kfile.name) from None

    def lower(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path) -> Lowered:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        fn, args, dtype = self._fn(spec)
        try:
            smem = PallasBackend().smem_bytes(fn, args)
        except Unbuildable:
            raise
        except Exception as exc:  # noqa: BLE001 - the probe traces the user's kernel
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
            raise Unbuildable(f"Mosaic GPU lowering failed: {type(exc).__name__}: {first[:400]}",
                              self.kfile.name) from None
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
            ptx, sass, log, resources = self._gpu_dump(fn, args, workdir / "mosaic_dump")
            if ptx is not None and sass is None:
                asm = assemble_ptx(ptx, gpu.arch, workdir / "from_ptx", runtime_log=log)
                cubin, sass = asm.cubin, asm.sass
                notes.extend(asm.notes)
        else:
            notes.append("PTX/SASS/ptxas log come from the GPU compile (MOSAIC_GPU_DUMP_TO); no GPU here")
        return Lowered(kernel_name=self.kfile.entry, ptx=ptx, cubin=cubin, sass=sass, ptxas_log=log, source=source,
                       resources=resources, toolchain=toolchain, notes=tuple(notes))

    def _gpu_dump(self, fn, args, dump: Path):
        import jax
        import jax.numpy as jnp

        dump.mkdir(parents=True, exist_ok=True)
        old = os.environ.get("MOSAIC_GPU_DUMP_TO")
        os.environ["MOSAIC_GPU_DUMP_TO"] = str(dump)
        try:
            jax.block_until_ready(jax.jit(fn)(*(jnp.zeros(a.shape, a.dtype) for a in args)))
        finally:
            if old is None:
                os.environ.pop("MOSAIC_GPU_DUMP_TO", None)
            else:
                os.environ["MOSAIC_GPU_DUMP_TO"] = old
        return collect_dump(dump)

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
