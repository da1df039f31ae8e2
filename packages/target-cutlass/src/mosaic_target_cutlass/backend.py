"""The ``cutlass`` language backend (the contract is ``mosaic.backend``): knobs, lower, prepare."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from mosaic import budget as fit
from mosaic.backend import Lowered, Unbuildable
from mosaic.errors import BadInput, RecordError
from mosaic.records import GpuTarget, KernelSpec, LaunchRecord

from mosaic_target_cutlass import attention, blackwell, gemm
from mosaic_target_cutlass import build as _build

FAMILIES = {"gemm": gemm.GemmKnobs, "attention": attention.AttentionKnobs}


def to_words(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values representable in bf16/fp16 -> their 16-bit encodings (C order)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "bf16":
        bits = x.view(np.uint32)
        if np.any(bits & 0xFFFF):
            raise BadInput("an input is not representable in bf16 (low 16 bits of its float32 are set)")
        return (bits >> 16).astype(np.uint16)
    h = x.astype(np.float16)
    if not np.array_equal(h.astype(np.float32), x, equal_nan=True):
        raise BadInput("an input is not representable in fp16")
    return h.view(np.uint16)


def from_words(w: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return (w.astype(np.uint32) << 16).view(np.float32)
    return w.view(np.float16).astype(np.float32)


class CutlassBackend:
    """Builds CUTLASS 3.x kernels (and the CuTe C++ attention) with nvcc (CPU lowering) and runs them through the
    build's ctypes host shim (:class:`GemmRunnable`, :class:`AttentionRunnable`)."""

    def knobs(self, family: str) -> type:
        if family not in FAMILIES:
            raise BadInput(f"cutlass builds no family '{family}'; known: {', '.join(FAMILIES)}", "--family")
        return FAMILIES[family]

    def _knobs(self, spec: KernelSpec) -> gemm.GemmKnobs:
        cls = self.knobs(spec.family)
        try:
            return cls(**spec.knobs)
        except TypeError as exc:
            known = ", ".join(a.name for a in cls.__attrs_attrs__)
            raise RecordError(f"{cls.__name__}: {exc}; known knobs: {known}") from None

    def _knobs_for(self, spec: KernelSpec, gpu: GpuTarget):
        """The Hopper knobs, or on a Blackwell record (sm_100a) the Sm100 template's (blackwell.py)."""
        if spec.family == "gemm" and blackwell.is_blackwell(gpu):
            try:
                return blackwell.BlackwellGemmKnobs(**spec.knobs)
            except TypeError as exc:
                known = ", ".join(a.name for a in attrs.fields(blackwell.BlackwellGemmKnobs))
                raise RecordError(f"BlackwellGemmKnobs: {exc}; known knobs: {known}") from None
        return self._knobs(spec)

    def source(self, spec: KernelSpec, gpu: GpuTarget) -> str:
        knobs = self._knobs_for(spec, gpu)
        if isinstance(knobs, attention.AttentionKnobs):
            module = attention
        else:
            module = blackwell if isinstance(knobs, blackwell.BlackwellGemmKnobs) else gemm
        found = module.problems(knobs, spec, gpu)
        if found:
            raise Unbuildable("; ".join(d.line() for d in found), knobs.label)
        return attention.render(knobs, spec) if module is attention else module.render(knobs, spec.dtype)

    def build(self, spec: KernelSpec, gpu: GpuTarget) -> _build.Build:
        return _build.build(self.source(spec, gpu), gpu.arch, name=spec.family if spec.family == "attention" else "gemm")

    def lower(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path) -> Lowered:
        knobs = self._knobs_for(spec, gpu)
        b = self.build(spec, gpu)
        budget = check_budgets(b, gpu)
        if spec.family == "attention":
            # the template's fragment maps, checked on the host by the build's shim in a child process
            pr = attention.problem(spec)
            checked = attention.fragment_check(b.library, grids=[(pr["batch"], pr["seq"], pr["heads"])])
            bad = checked["fragment_violations"]
            if bad:
                raise Unbuildable(f"the attention template's fragment maps are inconsistent ({bad} violations; "
                                  "a template bug)", b.key)
            # the launch the runner makes for this problem (the shim's grid_shape, asked in the same child)
            budget = {**budget, "fragment_maps": "ok",
                      "launch": f"grid={tuple(checked['grids'][0])} block={budget['threads_per_block']} "
                                f"dynamic_smem={budget['smem_bytes']}"}
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        paths = {}
        for role, src in (("ptx", b.ptx), ("cubin", b.cubin), ("sass", b.sass), ("ptxas_log", b.ptxas_log),
                          ("source", b.source)):
            if src is not None:
                dest = workdir / src.name
                shutil.copyfile(src, dest)
                paths[role] = dest
        notes = (f"knobs {knobs.label}", f"build {b.key} ({'cached' if b.cached else f'{b.seconds:.0f} s'})",
                 *(f"{k} {v}" for k, v in budget.items()))
        return Lowered(kernel_name=b.kernel_name, resources=b.resources,
                       toolchain={**b.toolchain, "cutlass_build": b.key}, notes=notes, **paths)

    def prepare(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path, inputs: dict[str, Any]):
        if spec.family == "attention":
            return self._prepare_attention(spec, gpu, inputs)
        b = self.build(spec, gpu)
        return GemmRunnable(b.library, spec, gpu, inputs)

    def _prepare_attention(self, spec: KernelSpec, gpu: GpuTarget, inputs: dict[str, Any]) -> AttentionRunnable:
        """The knobs (RecordError), the template's rules (Unbuildable), the inputs (:data:`attention.INPUT_RULES`
        and 16-bit representability: BadInput), each one line, before anything is compiled; then the lowering's own
        build (same source, same cache entry: the kernel ``lower`` reported) and its budgets, and the runner."""
        knobs = self._knobs(spec)
        found = attention.problems(knobs, spec, gpu)
        if found:
            raise Unbuildable("; ".join(d.line() for d in found), knobs.label)
        found = attention.input_problems(spec, inputs)
        if found:
            raise BadInput("; ".join(d.line() for d in found), "attention inputs")
        words = {}
        for name in ("q", "k", "v"):
            try:
                words[name] = to_words(inputs[name], spec.dtype)
            except BadInput as exc:
                raise BadInput(f"attention input '{name}': {exc.what}", "attention inputs") from None
        b = self.build(spec, gpu)
        check_budgets(b, gpu)
        return AttentionRunnable(b, spec, words)


def shim_facts(library: Path) -> dict[str, int]:
    """Compile-time facts the shim reports without a GPU: shared memory, threads, stages (asked of the library
    in a child process: it is never loaded into this one)."""
    return _build.run_shim(library, _build.FACTS_SCRIPT)


def check_budgets(b: _build.Build, gpu: GpuTarget) -> dict[str, int]:
    """Validate the build against the GpuTarget record (:mod:`mosaic.budget`'s rules); an overflow is
    Unbuildable, never a crash. The shim's facts are the ones its build recorded: lowering loads no library."""
    facts = dict(b.facts) if b.facts is not None else shim_facts(b.library)
    r = b.resources
    threads = facts["threads_per_block"]
    smem = facts["smem_bytes"] + r.static_smem
    # the rules a CUTLASS build is checked by, each worded for this report, in its order
    words = {"smem-per-block": f"shared memory {smem} B > {gpu.smem_per_block} B per block",
             "regs-per-thread": f"{r.registers} registers per thread > {gpu.max_regs_per_thread}",
             "threads-per-block": f"{threads} threads per block > {gpu.max_threads_per_block}",
             "regs-per-block": f"{r.registers} x {threads} registers > {gpu.regs_per_sm} per SM"}
    found = {d.code for d in fit.diagnose(fit.Footprint(where=b.key, smem_bytes=smem, registers=r.registers,
                                                        threads=threads), gpu, words)}
    problems = [text for code, text in words.items() if code in found]
    if problems:
        raise Unbuildable(f"does not fit {gpu.name}: " + "; ".join(problems), b.key)
    return facts


def load_shim(library: Path, create_args: list):
    """The build's shared library with the shim's calls typed: ``mosaic_create(*create_args, &handle, err, len)``
    (the problem's arguments differ per template), then the calls every shim has (launch, poison, read, grid,
    destroy) on the handle."""
    lib = ctypes.CDLL(str(library))
    lib.mosaic_create.argtypes = [*create_args, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_int]
    for fn in ("mosaic_launch", "mosaic_poison"):
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    lib.mosaic_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.mosaic_grid.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    lib.mosaic_destroy.argtypes = [ctypes.c_void_p]
    return lib


class GemmRunnable:
    """One problem on the device: A, B, D buffers and an initialised CUTLASS kernel (see the shim)."""

    def __init__(self, library: Path, spec: KernelSpec, gpu: GpuTarget, inputs: dict[str, Any]):
        self.spec = spec
        self.dtype = spec.dtype
        a, b = np.asarray(inputs["a"]), np.asarray(inputs["b"])
        m, k = a.shape
        k2, n = b.shape
        if k != k2:
            raise BadInput(f"a is {m}x{k} but b is {k2}x{n}")
        self.shape = (m, n, k)
        scale = float(inputs.get("scale", 1.0))
        if "bias" in inputs:
            raise Unbuildable("the cutlass gemm template has no bias epilogue")
        self._lib = lib = load_shim(library, [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                              ctypes.c_void_p, ctypes.c_float, ctypes.c_int])
        wa, wb = to_words(a, self.dtype), to_words(b, self.dtype)
        self._handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = lib.mosaic_create(m, n, k, wa.ctypes.data, wb.ctypes.data, scale, gpu.sm_count,
                               ctypes.byref(self._handle), err, len(err))
        if rc != 0:
            raise Unbuildable(f"CUTLASS setup failed ({rc}): {err.value.decode(errors='replace')}")
        self._err = err

    def launch(self) -> None:
        rc = self._lib.mosaic_launch(self._handle)
        if rc != 0:
            raise Unbuildable(f"CUTLASS launch failed ({rc})")

    def poison(self) -> None:
        rc = self._lib.mosaic_poison(self._handle)
        if rc != 0:
            raise Unbuildable(f"poisoning the output failed ({rc})")

    def output(self) -> dict[str, np.ndarray]:
        m, n, _ = self.shape
        words = np.empty((m, n), dtype=np.uint16)
        rc = self._lib.mosaic_read(self._handle, words.ctypes.data, self._err, len(self._err))
        if rc != 0:
            raise Unbuildable(f"reading the output failed ({rc}): {self._err.value.decode(errors='replace')}")
        return {"c": from_words(words, self.dtype)}

    def planned_launch(self) -> LaunchRecord:
        grid = (ctypes.c_int * 3)()
        self._lib.mosaic_grid(self._handle, grid)
        facts = shim_facts_from(self._lib)
        return LaunchRecord(kernel_name="cutlass-gemm", grid=tuple(grid), block=facts["threads_per_block"],
                            dynamic_smem=facts["smem_bytes"], source="driver")

    def close(self) -> None:
        if self._handle:
            self._lib.mosaic_destroy(self._handle)
            self._handle = ctypes.c_void_p()


def shim_facts_from(lib) -> dict[str, int]:
    return {"smem_bytes": lib.mosaic_smem_bytes(), "threads_per_block": lib.mosaic_block_threads(),
            "stages": lib.mosaic_stages()}


class AttentionRunnable:
    """The attention forward on the device through its build's shim (``templates/attention_sm90.cu``), as
    :class:`GemmRunnable` runs the GEMM: ``mosaic_create`` checks the problem and the device (an sm_90 GPU), allocates
    q, k, v, o in the family's layout, copies q, k, v (16-bit words), encodes the TMA descriptors once and allows the
    kernel its dynamic shared memory; ``launch`` enqueues one ``mosaic_attention::launch`` on the legacy default
    stream (the self-check's launch); ``poison`` fills o with NaN words; ``output`` waits and copies o back as
    float32 ``{"o": (batch, heads, seq, head_dim)}``. ``words``: q, k, v as :func:`to_words` gives them."""

    def __init__(self, build: _build.Build, spec: KernelSpec, words: dict[str, np.ndarray]):
        pr = attention.problem(spec)
        self.spec, self.dtype, self.build_key = spec, spec.dtype, build.key
        self.problem = pr
        self.shape = (pr["batch"], pr["heads"], pr["seq"], pr["head_dim"])
        self.kernel_name, self.resources = build.kernel_name, build.resources
        self._words = {n: np.ascontiguousarray(w) for n, w in words.items()}  # alive while the shim copies them
        self._lib = lib = load_shim(build.library, [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p])
        lib.mosaic_error_string.restype = ctypes.c_char_p
        lib.mosaic_error_string.argtypes = [ctypes.c_int]
        self._handle = ctypes.c_void_p()
        self._err = err = ctypes.create_string_buffer(512)
        w = self._words
        rc = lib.mosaic_create(pr["batch"], pr["seq"], pr["heads"], pr["kv_heads"], w["q"].ctypes.data,
                               w["k"].ctypes.data, w["v"].ctypes.data, ctypes.byref(self._handle), err, len(err))
        if rc != 0:
            raise Unbuildable(f"CUTLASS attention setup failed ({rc}): {err.value.decode(errors='replace')}",
                              build.key)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise Unbuildable(f"CUTLASS attention {what} failed ({rc}): "
                              f"{self._lib.mosaic_error_string(rc).decode(errors='replace')}", self.build_key)

    def launch(self) -> None:
        self._check(self._lib.mosaic_launch(self._handle), "launch")

    def poison(self) -> None:
        self._check(self._lib.mosaic_poison(self._handle), "poisoning the output")

    def output(self) -> dict[str, np.ndarray]:
        words = np.empty(self.shape, dtype=np.uint16)
        rc = self._lib.mosaic_read(self._handle, words.ctypes.data, self._err, len(self._err))
        if rc != 0:
            raise Unbuildable(f"reading the attention output failed ({rc}): "
                              f"{self._err.value.decode(errors='replace')}", self.build_key)
        return {"o": from_words(words, self.dtype)}

    def planned_launch(self) -> LaunchRecord:
        """The launch the shim makes (its grid_shape, block and dynamic shared memory; the build's registers)."""
        grid = (ctypes.c_int * 3)()
        self._lib.mosaic_grid(self._handle, grid)
        facts = shim_facts_from(self._lib)
        return LaunchRecord(kernel_name=self.kernel_name, grid=tuple(grid), block=facts["threads_per_block"],
                            dynamic_smem=facts["smem_bytes"], static_smem=self.resources.static_smem or 0,
                            registers_per_thread=self.resources.registers or 0, source="driver")

    def close(self) -> None:
        if self._handle:
            self._lib.mosaic_destroy(self._handle)
            self._handle = ctypes.c_void_p()
