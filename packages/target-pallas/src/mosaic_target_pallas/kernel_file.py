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
from mosaic.families import full_shape
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


#: StableHLO ops that compute (rules as data): one of them outside the Mosaic GPU call means the program does
#: work the kernel does not (a library call instead of the kernel, a fallback, a post-pass that fixes the output);
#: data movement (reshape, transpose, convert, broadcast_in_dim, slice, constant, ...) is allowed
COMPUTE_OPS = frozenset({
    "abs", "add", "atan2", "cbrt", "ceil", "clamp", "cosine", "custom_call", "divide", "dot", "dot_general",
    "convolution", "exponential", "exponential_minus_one", "floor", "log", "log_plus_one", "logistic", "maximum",
    "minimum", "multiply", "negate", "power", "reduce", "reduce_precision", "reduce_window", "remainder", "round_nearest_even",
    "round_nearest_afz", "rsqrt", "scatter", "select_and_scatter", "sign", "sine", "sort", "sqrt", "subtract", "tan",
    "tanh", "while", "fft", "cholesky", "triangular_solve", "rng", "rng_bit_generator",
})
MOSAIC_GPU_CALL = "mosaic_gpu"


def program_ops(text: str) -> tuple[int, dict[str, int]]:
    """(Mosaic GPU kernel calls, {compute op: count} outside them) of a lowered program's StableHLO text. The
    kernel's own body is serialised inside its custom call's attributes, so every op line here is outside it."""
    import re

    calls, outside = 0, {}
    op = re.compile(r'^\s*(?:[%\w#:, ]+=\s*)?"?stablehlo\.(\w+)"?')
    for line in text.splitlines():
        m = op.match(line)
        if not m:
            continue
        name = m.group(1)
        if name == "custom_call":
            target = re.search(r"custom_call\s*@([\w.]+)", line)
            if target and target.group(1).startswith(MOSAIC_GPU_CALL):
                calls += 1
                continue
            name = f"custom_call @{target.group(1) if target else '?'}"
        if name in COMPUTE_OPS or name.startswith("custom_call"):
            outside[name] = outside.get(name, 0) + 1
    return calls, outside


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

        full = full_shape(spec.family, spec.shape)  # optional entries (kv_heads) filled in
        args = tuple(jax.ShapeDtypeStruct(op.shape(full), dtype) for op in self.kfile.inputs)
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
        return PallasRunnable(fn, [inputs[o.name] for o in self.kfile.inputs], dtype, out.shape(full_shape(spec.family, spec.shape)),
                              out_name=out.name)


    def program_check(self, spec: KernelSpec) -> dict:
        """What the lowered program holds at ``spec``'s shape (no GPU): its Mosaic GPU calls and the compute outside
        them (the gate's ``kernel`` stage, :mod:`mosaic.gate`)."""
        key = tuple(sorted(spec.shape.items()))
        cache = self.__dict__.setdefault("_programs", {})
        if key not in cache:
            fn, args, _ = self._fn(spec)
            calls, outside = program_ops(self._trace_lower(fn, args).as_text())
            cache[key] = {"language": "Mosaic GPU", "kernels": calls, "outside": outside,
                          "what": "the entry lowers to no Mosaic GPU custom call" if not calls else ""}
        return cache[key]


    def interpret_unavailable(self) -> str | None:
        """Why this machine cannot run :meth:`interpret` (None when it can): jax's GPU interpreter with its race
        detector needs jax >= 0.11.2 (Python >= 3.12)."""
        from mosaic_target_pallas import interpret

        return interpret.unavailable()

    def interpret(self, spec: KernelSpec, inputs: dict[str, Any]) -> dict:
        """Run the file's entry on ``inputs`` in jax's GPU interpreter on the CPU (``interpret.py``: race detector on,
        uninitialised memory NaN): ``{"outputs": {name: float32 array}, "races": bool}``. The output must be the one
        array the contract names; anything else is returned as it is for the gate to refuse."""
        import jax.numpy as jnp
        import numpy as np

        from mosaic_target_pallas import interpret

        fn, _, dtype = self._fn(spec)
        args = [jnp.asarray(np.asarray(inputs[o.name], np.float32), dtype) for o in self.kfile.inputs]
        result = interpret.run(fn, *args, detect_races=True)
        outs = result.outputs
        name = self.kfile.outputs[0].name
        return {"outputs": {name: outs[0]} if len(outs) == 1 else {f"{name}[{i}]": o for i, o in enumerate(outs)},
                "races": result.races_found}


class PallasFiles(PallasBackend):
    """The pallas backend that also builds Pallas Mosaic GPU kernel files: ``kernel_file(kfile)``."""

    kernel_file_syntax = "python"

    def kernel_file(self, kfile: KernelFile) -> PallasFileBackend:
        return PallasFileBackend(kfile)

