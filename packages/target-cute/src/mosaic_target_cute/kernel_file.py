"""CuTe DSL kernel files (``.py``): the ``cute`` language's side of :mod:`mosaic.kernel_files`.

Besides the language-neutral contract (``ENTRY``, ``INPUTS``, ``OUTPUTS``, a frozen ``Knobs`` dataclass) a
CuTe file's entry is a ``@cute.jit`` function called as ``ENTRY(*inputs, *outputs, knobs, stream)``: the
operands are row-major ``cute.Tensor``s of the shapes the contract names (16-byte aligned), ``knobs`` an
instance of the knob class (annotate it ``cutlass.Constexpr``: a compile-time value, so the compiled kernel is
called with the tensors and the stream only) and ``stream`` a ``CUstream``.

``lower`` imports the file (in the capture's child process only), compiles the entry ahead of time for
``gpu.arch`` with fake tensors (no GPU), keeps PTX and cubin, disassembles SASS and re-assembles the PTX
with ``ptxas -v`` for the resource log when those tools are found, and checks shared memory, registers
and the PTX's ``.reqntid`` threads against the GpuTarget record. ``prepare`` (GPU) compiles the same entry
for torch-backed tensors with the same layouts.

A family's optional shape entries (attention's ``kv_heads`` and ``causal``) reach the file in two ways: an operand
may name one as a dimension (``k[batch,kv_heads,seq,head_dim]``), sized from the shape or, where the shape leaves
it out because it holds its default, from that default (:func:`full_shape`); and a knob named after one is that
entry (:func:`shape_knobs`): it takes the problem's value, so the file sees the shape it is compiled for.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from mosaic import budget as fit
from mosaic.backend import Lowered, Unbuildable
from mosaic.errors import BadInput
from mosaic.kernel_files import KernelFile, PythonFileBackend, failure, make_knobs
from mosaic.records import GpuTarget, KernelSpec, ResourceUsage
from mosaic.toolchain.cubin import read_cubin

from mosaic_target_cute.backend import CuteBackend
from mosaic_target_cute.lowering import disassemble, ptxas_log

CUTE_DTYPES = {"bf16": "BFloat16", "f16": "Float16", "f32": "Float32"}
REQNTID_RE = re.compile(r"\.reqntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def full_shape(spec: KernelSpec) -> dict:
    """``spec.shape`` with every optional entry of its family filled in (core's :func:`mosaic.families.full_shape`)."""
    from mosaic.families import full_shape as family_full_shape

    return family_full_shape(spec.family, spec.shape)


def shape_knobs(kfile: KernelFile, spec: KernelSpec) -> dict:
    """The file's knob values with each knob named after one of the family's optional shape entries set from the
    problem (``causal`` from ``--shape ...,causal=1``). A value given for it that contradicts the shape is one
    error line, except the knob's own default: a full knob set (a campaign's candidate) carries it without
    choosing it, and the shape decides."""
    from mosaic.families import get

    values = kfile.knob_values(spec.knobs)
    fam = get(spec.family)
    shape = full_shape(spec)
    for name in getattr(fam, "optional_dims", {}) or {}:
        knob = kfile.knob(name)
        if knob is None or name not in shape or knob.type not in ("bool", "int"):
            continue
        want = bool(shape[name]) if knob.type == "bool" else int(shape[name])
        if name in spec.knobs and values[name] != want and values[name] != knob.default:
            raise BadInput(f"knob {name}={values[name]} of {kfile.name} contradicts the problem's {name}="
                           f"{shape[name]} (the shape sets it: --shape ...,{name}={int(values[name])})", "--knob")
        values[name] = want
    return values


class CuteFileBackend(PythonFileBackend):
    """The mosaic.backend methods for one CuTe DSL kernel file (``check``: the family's dimensions, then
    import the file and build its knob instance, in the child)."""

    module_name = "mosaic_cute_kernel_file"

    def __init__(self, kfile: KernelFile):
        super().__init__(kfile)
        self._launches: dict[str, tuple] = {}  # spec -> (the cubin's main kernel, its HostLaunch or None)

    def knob_instance(self, spec):
        """The file's knob class with the spec's knobs over its defaults, and the shape's optional entries over
        the knobs named after them (:func:`shape_knobs`)."""
        return make_knobs(self.module(), self.kfile, shape_knobs(self.kfile, spec))

    def _compile(self, spec: KernelSpec, gpu: GpuTarget, dump: Path, tensors=None, stream=None):
        import cutlass.cute as cute
        from cutlass.cute.runtime import make_fake_stream

        if spec.dtype not in CUTE_DTYPES:
            raise Unbuildable(f"a CuTe kernel file builds dtypes {', '.join(CUTE_DTYPES)}, not {spec.dtype}",
                              self.kfile.name)
        module = self.module()
        knobs = self.knob_instance(spec)
        if tensors is None:
            tensors = self.fake_tensors(spec)
        if dump.exists():
            shutil.rmtree(dump)
        dump.mkdir(parents=True)
        options = f"--gpu-arch {gpu.arch} --keep-ptx --keep-cubin --dump-dir {dump}"
        start = time.perf_counter()
        try:
            compiled = cute.compile(getattr(module, self.kfile.entry), *tensors, knobs,
                                    stream if stream is not None else make_fake_stream(), options=options)
        except Exception as exc:  # noqa: BLE001 - the DSL raises many types; a failed compile is unbuildable
            raise failure("cute.compile failed", exc, self.kfile.name) from None
        return compiled, knobs, time.perf_counter() - start

    def fake_tensors(self, spec: KernelSpec):
        import cutlass
        from cutlass.cute.runtime import make_fake_tensor

        t = getattr(cutlass, CUTE_DTYPES[spec.dtype])
        out, full = [], full_shape(spec)
        for op in (*self.kfile.inputs, *self.kfile.outputs):
            shape = op.shape(full)
            out.append(make_fake_tensor(t, shape, row_major(shape), assumed_align=16))
        return out

    def lower(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path) -> Lowered:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        dump = workdir / "cute_dump"
        compiled, _, seconds = self._compile(spec, gpu, dump)
        launch = self._host_launch(compiled)
        ptxs, cubins = sorted(dump.glob("*.ptx")), sorted(dump.glob("*.cubin"))
        if not ptxs or not cubins:
            raise Unbuildable(f"cute.compile wrote no PTX/cubin under {dump}", self.kfile.name)
        ptx, cubin = workdir / "kernel.ptx", workdir / "kernel.cubin"  # the DSL's names run to hundreds of chars
        shutil.copyfile(ptxs[0], ptx)
        shutil.copyfile(cubins[0], cubin)
        kernels = read_cubin(cubin.read_bytes())
        if not kernels:
            raise Unbuildable("the cubin holds no kernel", self.kfile.name)
        main = max(kernels, key=lambda k: k.code_bytes)
        found = REQNTID_RE.search(ptx.read_text(errors="replace"))
        threads = int(np.prod([int(g) for g in found.groups() if g])) if found else None
        if threads is None and launch is not None:
            threads = int(np.prod(launch.block))
        smem = main.static_smem + (launch.dynamic_smem if launch is not None else 0)
        problems = fit.diagnose(fit.Footprint(where=self.kfile.name, smem_bytes=smem,
                                              registers=main.registers, threads=threads,
                                              cluster_size=int(np.prod(launch.cluster)) if launch else None), gpu,
                                ("smem-per-block", "regs-per-thread", "regs-per-block", "threads-per-block",
                                 "cluster-size"))
        if problems:
            raise Unbuildable(f"does not fit {gpu.name}: " + "; ".join(p.line() for p in problems), self.kfile.name)
        sass = disassemble(cubin, workdir / "kernel.sass")
        log = ptxas_log(ptx, gpu.arch, workdir / "ptxas.log")
        source = workdir / self.kfile.name
        source.write_text(self.kfile.source)  # the text that was read and hashed (the child checked the file)
        values = shape_knobs(self.kfile, spec)
        notes = (f"kernel file {self.kfile.name} sha256 {self.kfile.sha256}",
                 f"knobs {self.kfile.knob_class}({', '.join(f'{k}={v}' for k, v in values.items())})",
                 f"kernels in the cubin: {', '.join(k.name[:80] for k in kernels)}",
                 f"threads={threads} (PTX .reqntid)" if threads else "threads: the PTX states no .reqntid",
                 (f"launch grid={list(launch.grid)} block={list(launch.block)} cluster={list(launch.cluster)} "
                  f"dynamic_smem={launch.dynamic_smem} (the host code's cudaLaunchConfig_t)") if launch else
                 "launch: not read from the host code (its launch configuration is not constant)",
                 f"compile_seconds={seconds:.2f}")
        self._launches[self._key(spec, gpu)] = (main, launch)
        if launch is not None:
            self.planned_launch = self.launch_record
        from mosaic_target_cute.backend import _toolchain

        return Lowered(kernel_name=main.name, ptx=ptx, cubin=cubin, sass=sass, ptxas_log=log, source=source,
                       resources=ResourceUsage(registers=main.registers, static_smem=main.static_smem),
                       toolchain=_toolchain(), notes=notes)

    @staticmethod
    def _key(spec: KernelSpec, gpu: GpuTarget) -> str:
        import json

        return json.dumps([spec.to_json(), gpu.name], sort_keys=True, default=str)

    @staticmethod
    def _host_launch(compiled):
        """The one constant launch of the compiled host code (:mod:`mosaic_target_cute.host_launch`), or None."""
        from mosaic_target_cute.host_launch import read_launches

        module = getattr(compiled, "ir_module", None)
        if module is None:
            return None
        launches = read_launches(str(module))
        return launches[0] if len(launches) == 1 else None

    def launch_record(self, spec: KernelSpec, gpu: GpuTarget):
        """The launch record of the :meth:`lower` of ``spec``: grid, block, cluster and dynamic shared memory from
        the host code, registers and static shared memory from the cubin (lowers first when this object has not
        lowered ``spec``). A lowering that read a constant launch also sets ``planned_launch`` to this method, the
        hook :func:`mosaic.capture.capture` writes ``launch.json`` of a ``--lower-only`` capture from; a host
        code whose launch is not constant gets no launch record, as before."""
        from mosaic.records import LaunchRecord

        key = self._key(spec, gpu)
        if key not in self._launches:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="mosaic-cute-launch-") as tmp:
                self.lower(spec, gpu, Path(tmp))
        main, launch = self._launches[key]
        if launch is None:
            raise Unbuildable("the host code's launch configuration is not constant: no launch record",
                              self.kfile.name)
        return LaunchRecord(kernel_name=main.name, grid=launch.grid, block=launch.block, cluster=launch.cluster,
                            static_smem=main.static_smem, dynamic_smem=launch.dynamic_smem,
                            registers_per_thread=main.registers or 0, source="cubin")

    def prepare(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path, inputs: dict[str, Any]):
        return CuteFileRunnable(self, spec, gpu, Path(workdir), inputs)


class CuteFileRunnable:
    """The file's kernel on the GPU, torch tensors as device memory (``mosaic.backend.Runnable``)."""

    def __init__(self, backend: CuteFileBackend, spec: KernelSpec, gpu: GpuTarget, workdir: Path, inputs):
        try:
            import torch
        except ImportError:
            raise Unbuildable("a CuTe kernel file's prepare needs torch with CUDA", "prepare") from None
        if not torch.cuda.is_available():
            raise Unbuildable("a CuTe kernel file's prepare needs a CUDA GPU", "prepare")
        import cuda.bindings.driver as cuda
        from cutlass.cute.runtime import from_dlpack

        kfile = backend.kfile
        if sorted(inputs) != sorted(o.name for o in kfile.inputs):
            raise Unbuildable(f"the family's inputs are {', '.join(sorted(inputs))}; the file's INPUTS "
                              f"{', '.join(o.name for o in kfile.inputs)}", kfile.name)
        tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[spec.dtype]
        self.torch = torch
        self.inputs, full = [], full_shape(spec)
        for op in kfile.inputs:
            arr = np.asarray(inputs[op.name], np.float32)
            if tuple(arr.shape) != op.shape(full):
                raise Unbuildable(f"input {op.name} has shape {arr.shape}; the file says {op.text()}", kfile.name)
            self.inputs.append(torch.as_tensor(arr).to("cuda", tdt).contiguous())
        self.outputs = {op.name: torch.empty(op.shape(full), device="cuda", dtype=tdt) for op in kfile.outputs}
        views = [from_dlpack(t, assumed_align=16) for t in (*self.inputs, *self.outputs.values())]
        want = [(tuple(f.shape), tuple(f.stride)) for f in backend.fake_tensors(spec)]
        got = [(tuple(v.shape), tuple(v.stride)) for v in views]
        if got != want:
            raise Unbuildable(f"device views {got} differ from the lowered layouts {want}", "prepare")
        self.stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        self.compiled, _, _ = backend._compile(spec, gpu, workdir / "cute_run_dump", tensors=views,
                                               stream=self.stream)
        # the compiled function's runtime signature has no Constexpr parameter (cutlass.base_dsl's
        # ExecutionArgs.filter_runtime_signature): it is called with the tensors and the stream only
        self.args = (*views, self.stream)
        self.launch()  # load the module outside the timed region
        torch.cuda.synchronize()

    def launch(self) -> None:
        self.compiled(*self.args)

    def poison(self) -> None:
        for t in self.outputs.values():
            t.fill_(float("nan"))

    def output(self) -> dict[str, np.ndarray]:
        self.torch.cuda.synchronize()
        return {name: t.float().cpu().numpy() for name, t in self.outputs.items()}

    def close(self) -> None:
        self.inputs, self.outputs, self.compiled = [], {}, None


class CuteFiles(CuteBackend):
    """The cute backend that also builds CuTe DSL kernel files: ``kernel_file(kfile)``."""

    kernel_file_syntax = "python"

    def kernel_file(self, kfile: KernelFile) -> CuteFileBackend:
        return CuteFileBackend(kfile)
