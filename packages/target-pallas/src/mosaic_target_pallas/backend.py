"""The ``pallas`` language backend (see ``mosaic.backend``): knobs, lower, prepare.

Inputs of the ``gemm`` family: ``a`` (m×k) and ``b`` (k×n), row-major, bf16/f16; output ``c`` (m×n), same dtype.

* ``lower`` on a machine with no GPU traces the kernel and lowers it for the ``cuda`` platform: the
  StableHLO (holding the serialised Mosaic GPU module) is the ``source`` artifact, and the kernel's shared
  memory is checked against ``gpu.smem_per_block`` (jax's own check, with the budget set from the GpuTarget
  record). PTX and SASS only exist after the GPU compile: when jax has a CUDA backend, ``lower`` compiles
  and runs the kernel once with ``MOSAIC_GPU_DUMP_TO`` set and returns the dumped PTX, SASS and ptxas log.
  jax 0.11.2 on the H200 dumped PTX and a ptxas log but no SASS or cubin: then :func:`assemble_ptx`
  assembles the captured PTX with ``ptxas -arch=<gpu.arch>`` into a cubin and disassembles it with core's
  nvdisasm helper, and the bundle's notes say so (the SASS is ptxas's, not taken from jax's runtime).
* ``prepare`` (GPU) places the inputs on the device and returns a :class:`PallasRunnable`.

Inputs of the ``attention`` family: ``q`` (batch, heads, seq, head_dim), ``k`` and ``v`` (batch, kv_heads,
seq, head_dim); output ``o`` like ``q``. The ``kernel`` knob picks the kernel: ``project``
(``kernels/attention.py``, bf16 and f16, lowers on the CPU and writes into the caller's buffer) or ``jax``
(jax's attention_mgpu, f16 only, needs jax's CUDA plugin); unset, bf16 gets ``project`` and f16 ``jax``
(``knobs.DEFAULT_ATTENTION_KERNEL``).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from mosaic import budget as fit
from mosaic.backend import Lowered, Unbuildable
from mosaic.errors import BadInput, RecordError, ToolMissing
from mosaic.records import GpuTarget, KernelSpec, ResourceUsage
from mosaic.toolchain import ptxas as _ptxas

from mosaic_target_pallas.knobs import DEFAULT_ATTENTION_KERNEL, FAMILY_KNOBS, AttentionKnobs, GemmKnobs
from mosaic_target_pallas.rowwise_knobs import ROWWISE_KNOBS

JAX_DTYPES = {"bf16": "bfloat16", "f16": "float16"}
#: jax 0.11.2's attention_mgpu forward stages q, k, v and o in float16 shared memory (``plgpu.SMEM(..., jnp.float16)``
#: in its ``entry``) although its dtype check admits bf16: a bf16 problem fails its lowering on the TMA copy
#: ("Expected dtypes to match but src had type bfloat16 and dst had type float16", the H200 on 2026-12-02;
#: reproduced on the CPU by tests/test_attention_capture.py, which says when a jax release lifts it)
ATTENTION_DTYPES = ("f16",)
SMEM_RE = re.compile(r"smem_bytes=(\d+)")


def _jax_dtype(spec: KernelSpec):
    import jax.numpy as jnp

    if spec.dtype not in JAX_DTYPES:
        raise Unbuildable(f"pallas {spec.family} supports dtypes {', '.join(JAX_DTYPES)}, not {spec.dtype}",
                          spec.name or spec.family)
    return getattr(jnp, JAX_DTYPES[spec.dtype])


def gemm_dims(spec: KernelSpec) -> tuple[int, int, int]:
    try:
        return spec.shape["m"], spec.shape["n"], spec.shape["k"]
    except KeyError as exc:
        raise BadInput(f"gemm shape needs m, n, k; got {sorted(spec.shape)}", f"missing {exc}") from None


def build_gemm(knobs: GemmKnobs, m: int, n: int, k: int, dtype, num_ctas: int, into: bool = False):
    from mosaic_target_pallas.kernels import blackwell_matmul, hopper_matmul, pipelined_matmul

    module = {"jax-hopper": hopper_matmul, "jax-blackwell": blackwell_matmul}.get(knobs.kernel, pipelined_matmul)
    return module.build(knobs, m, n, k, dtype, num_ctas, into=into)


def jax_has_cuda_plugin() -> bool:
    """jax's CUDA plugin is installed (jax[cuda]): what jax's attention_mgpu asserts before it traces."""
    from jax._src.lib import cuda_versions

    return cuda_versions is not None


def jax_has_gpu() -> bool:
    import jax

    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


@contextlib.contextmanager
def _smem_limit(limit: int):
    from jax.experimental.mosaic.gpu import core as mgpu_core

    with mgpu_core.artificial_shared_memory_limit(limit):
        yield


def _toolchain() -> dict:
    import jax
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}


def in_family_layout(kernel, head_dim: int):
    """``f(q, k, v) -> o`` in the attention family's layout and scale around ``kernel(q, k, v) -> o``, which takes
    and returns (batch, seq, heads, head_dim) and computes ``softmax(q k^T) v`` with NO scale -- jax 0.11.2's
    attention_mgpu (its scores go straight from the wgmma into ``exp2(qk * log2e - m)``) and its
    ``attention_reference`` alike. The family's problem is ``softmax(q k^T / sqrt(head_dim)) v`` in
    (batch, heads, seq, head_dim): q is scaled in float32 and rounded once to its own dtype (exact when
    head_dim is an even power of two, 64 or 256; at 128 the scale 2^-3.5 costs one rounding of each q element,
    well inside the oracle's band for the normal, large and denormal inputs, not for ``int``, whose scores
    are large), then q, k, v are transposed in and the output transposed back. Without the scale every
    score was sqrt(head_dim) times too large: the H200's 2026-12-02 captures failed the oracle on ~99.9 % of
    the elements."""
    import jax.numpy as jnp

    scale = 1.0 / math.sqrt(head_dim)

    def forward(q, k, v):
        qs = (q.astype(jnp.float32) * scale).astype(q.dtype)
        o = kernel(jnp.swapaxes(qs, 1, 2), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2))
        return jnp.swapaxes(o, 1, 2)

    return forward


class PallasBackend:
    """Pallas Mosaic GPU: jax's Hopper kernels and the project's own, lowered and captured through jax."""

    def knobs(self, family: str) -> type:
        if family in ROWWISE_KNOBS:  # rmsnorm, softmax: rowwise.py
            return ROWWISE_KNOBS[family]
        if family not in FAMILY_KNOBS:
            raise BadInput(f"pallas has no family '{family}'; known: {', '.join([*FAMILY_KNOBS, *ROWWISE_KNOBS])}",
                           "family")
        return FAMILY_KNOBS[family]

    # -- building ---------------------------------------------------------------------------------
    def _gemm_fn(self, spec: KernelSpec, gpu: GpuTarget, num_ctas: int | None = None, into: bool = False):
        if spec.family != "gemm":
            raise Unbuildable(f"pallas builds gemm, attention, rmsnorm, softmax; not '{spec.family}'", spec.family)
        knobs = GemmKnobs(**spec.knobs)
        m, n, k = gemm_dims(spec)
        dtype = _jax_dtype(spec)
        try:
            fn = build_gemm(knobs, m, n, k, dtype, gpu.sm_count if num_ctas is None else num_ctas, into=into)
        except RecordError as exc:  # the tiling does not divide the problem
            raise Unbuildable(str(exc), spec.name or "gemm") from None
        return fn, knobs, (m, n, k), dtype

    def smem_bytes(self, fn, args) -> int | None:
        """The kernel's shared-memory footprint as Mosaic GPU computes it (a probe with a zero budget)."""
        import jax

        try:
            with _smem_limit(0):
                jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        except ValueError as exc:
            found = SMEM_RE.search(str(exc))
            return int(found.group(1)) if found else None
        return 0

    def lower(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path) -> Lowered:
        import jax

        if spec.family in ROWWISE_KNOBS:
            from mosaic_target_pallas import rowwise

            return rowwise.lower(self, spec, gpu, workdir)
        if spec.family == "attention":
            fn, args, name, notes = self._attention_fn(spec)
        else:
            fn, knobs, (m, n, k), dtype = self._gemm_fn(spec, gpu)
            args = [jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((k, n), dtype)]
            name = spec.name or f"pallas_gemm_{knobs.kernel}"
            notes = [f"cta_tile={knobs.cta_tile()}", f"cluster={knobs.cluster_size()}"]
            try:
                return lower_fn(self, fn, args, name, gpu, workdir, notes)
            except Unbuildable as exc:  # a GEMM of the other tensor-core generation: name this one's kernel
                from mosaic_target_pallas import arch_rules

                raise Unbuildable(arch_rules.gemm_pointer(exc.what, gpu.arch), exc.where) from None
        return lower_fn(self, fn, args, name, gpu, workdir, notes)

    # -- the gate's CPU stage (mosaic.gate.template_stage): the rowwise templates in jax's GPU interpreter --------
    def interprets(self, family: str) -> bool:
        """True for the templates that run in jax's GPU interpreter on the CPU (the rowwise rmsnorm and softmax;
        the wgmma GEMM and attention templates are not run there)."""
        return family in ROWWISE_KNOBS

    def interpret_unavailable(self) -> str | None:
        """Why this machine cannot run :meth:`interpret` (None when it can): jax >= 0.11.2 (Python >= 3.12)."""
        from mosaic_target_pallas import interpret

        return interpret.unavailable()

    def interpret(self, spec: KernelSpec, inputs: dict[str, Any]) -> dict:
        """Run the template at ``spec`` on ``inputs`` in jax's GPU interpreter (race detector on, the output buffer
        NaN beforehand): ``{"outputs": {"y": float32 array}, "races": bool}``."""
        from mosaic_target_pallas import rowwise

        if spec.family not in ROWWISE_KNOBS:
            raise Unbuildable(f"the pallas {spec.family} template does not run in the interpreter", spec.family)
        result = rowwise.run_interpreted(spec, inputs)
        return {"outputs": {"y": result.outputs[0]}, "races": result.races_found}

    def output_shapes(self, family: str, shape: dict) -> dict[str, tuple]:
        """The template's output arrays at ``shape`` (the rowwise templates write ``y``, rows x cols)."""
        return {"y": (int(shape["rows"]), int(shape["cols"]))}

    # -- running ----------------------------------------------------------------------------------
    def prepare(self, spec: KernelSpec, gpu: GpuTarget, workdir: Path, inputs: dict[str, Any]):
        from mosaic_target_pallas.runnable import PallasRunnable

        if not jax_has_gpu():
            raise Unbuildable("pallas prepare needs jax with a CUDA backend (jax[cuda]) and a GPU", "prepare")
        if spec.family == "attention":
            return self._prepare_attention(spec, inputs)
        if spec.family in ROWWISE_KNOBS:
            from mosaic_target_pallas import rowwise

            return rowwise.prepare(spec, inputs)
        fn, knobs, (m, n, k), dtype = self._gemm_fn(spec, gpu, into=True)
        for key, shape in (("a", (m, k)), ("b", (k, n))):
            if key not in inputs or tuple(np.shape(inputs[key])) != shape:
                raise BadInput(f"gemm input '{key}' must have shape {shape}",
                               f"got {None if key not in inputs else np.shape(inputs[key])}")
        return PallasRunnable(fn, [inputs["a"], inputs["b"]], dtype, (m, n), writes_into=True)

    def _attention_fn(self, spec: KernelSpec, into: bool = False):
        """The attention forward the ``kernel`` knob picks (unset: the dtype's default, bf16 ``project``,
        f16 ``jax``) as ``f(q, k, v) -> o`` in the family's layout, its argument shapes, a name and notes;
        ``kernel=project``: :meth:`_project_attention_fn` (``into``: ``f(q, k, v, out)`` writing into
        ``out``).

        ``kernel=jax``: jax's attention_mgpu forward. The family's inputs are in the oracle's layout, q
        (batch, heads, seq, head_dim) and k, v (batch, kv_heads, seq, head_dim); attention_mgpu wants (batch,
        seq, heads, head_dim), so q, k, v are transposed on the device and the output transposed back, and q
        is scaled by 1/sqrt(head_dim) first (jax's kernel does not scale: :func:`in_family_layout`). jax's
        kernel asserts its CUDA plugin at trace time, so without jax[cuda] this is Unbuildable.

        Causality is part of the problem (``--shape ...,causal=1``), not a tuning choice: the knob must agree
        with it (checked before anything is traced), for either kernel."""
        import jax

        kn = AttentionKnobs(**spec.knobs)
        try:
            b, s, h, d = (spec.shape[x] for x in ("batch", "seq", "heads", "head_dim"))
        except KeyError as exc:
            raise BadInput(f"attention shape needs batch, seq, heads, head_dim; got {sorted(spec.shape)}",
                           f"missing {exc}") from None
        kv = spec.shape.get("kv_heads", h)
        causal = bool(spec.shape.get("causal", 0))
        if "causal" in spec.knobs and kn.causal != causal:
            raise BadInput(f"attention knob causal={kn.causal} contradicts the problem (causal={int(causal)})",
                           "causality is part of the problem: set it in --shape (causal=1), not as a knob")
        try:
            kn = kn.resolved(spec.dtype)
        except RecordError as exc:  # a knob of the other kernel, the kernel picked by the dtype
            default = DEFAULT_ATTENTION_KERNEL.get(spec.dtype, "project")
            raise BadInput(f"{exc} (kernel unset: {spec.dtype} runs kernel={default}; set --knob "
                           "kernel=project or kernel=jax)", "--knob") from None
        if kn.kernel == "project":
            return self._project_attention_fn(spec, kn, (b, s, h, d, kv, causal), into)
        if spec.dtype not in ATTENTION_DTYPES:
            raise Unbuildable(f"jax's attention_mgpu forward runs {', '.join(ATTENTION_DTYPES)} only, not {spec.dtype}: it "
                              "stages q, k, v in float16 shared memory, so other inputs fail its lowering",
                              spec.name or "attention")
        dtype = _jax_dtype(spec)
        if not jax_has_cuda_plugin():
            raise Unbuildable("jax's attention_mgpu needs jax's CUDA plugin (jax[cuda]) even to trace: it lowers "
                              "and runs where that is installed (the GPU), not here", spec.name or "attention")
        from jax.experimental.pallas.ops.gpu import attention_mgpu as am

        cfg = am.TuningConfig(block_q=kn.block_q, block_kv=kn.block_kv, max_concurrent_steps=kn.max_concurrent_steps,
                              use_schedule_barrier=kn.use_schedule_barrier, causal=causal)

        forward = in_family_layout(lambda q, k, v: am.attention(q, k, v, cfg), d)
        args = [jax.ShapeDtypeStruct((b, h, s, d), dtype), jax.ShapeDtypeStruct((b, kv, s, d), dtype),
                jax.ShapeDtypeStruct((b, kv, s, d), dtype)]
        notes = [f"block_q={kn.block_q}", f"block_kv={kn.block_kv}", f"stages={kn.max_concurrent_steps}",
                 f"causal={int(causal)}", "jax's attention_mgpu in (batch, seq, heads, head_dim): q, k, v and o "
                 "transposed around it on the device (the lowered module holds the transposes)",
                 f"scale=1/sqrt({d}) applied to q before the kernel (jax's kernel computes softmax(q k^T) unscaled)"]
        return forward, args, spec.name or "pallas_attention_mgpu", notes

    def _project_attention_fn(self, spec: KernelSpec, kn, dims: tuple, into: bool = False):
        """The project's attention forward (``kernels/attention.py``): the family's layout in and out (no
        transposes), the scale 1/sqrt(head_dim) applied to the fp32 scores inside the kernel (folded with
        log2(e) into one multiplier), bf16 and f16; no CUDA plugin needed to trace."""
        import jax

        from mosaic_target_pallas.kernels import attention

        b, s, h, d, kv, causal = dims
        dtype = _jax_dtype(spec)
        problem = attention.AttentionProblem(batch=b, heads=h, kv_heads=kv, seq=s, head_dim=d, causal=causal)
        name = spec.name or "pallas_attention_project"
        why = attention.check(kn, problem)
        if why:
            raise Unbuildable(f"the project's Pallas attention cannot run this problem: {why}", name)
        forward = attention.build(kn, problem, dtype, into=into)
        args = [jax.ShapeDtypeStruct((b, h, s, d), dtype), jax.ShapeDtypeStruct((b, kv, s, d), dtype),
                jax.ShapeDtypeStruct((b, kv, s, d), dtype)]
        if into:
            args.append(jax.ShapeDtypeStruct((b, h, s, d), dtype))
        turns = kn.compute_wgs == 2 and kn.use_schedule_barrier
        notes = ["kernel=project", f"block_q={kn.block_q}", f"block_kv={kn.block_kv}",
                 f"stages={min(kn.max_concurrent_steps, s // kn.block_kv)}", f"compute_wgs={kn.compute_wgs}",
                 f"schedule_barrier={int(turns)}", f"p_operand={kn.p_operand}",
                 f"pv_accumulator={kn.pv_accumulator}", f"approx_math={int(kn.approx_math)}",
                 f"causal={int(causal)}", f"gqa_group={h // kv}",
                 "the project's Pallas attention in the family's layout (batch, heads, seq, head_dim): "
                 "no transposes",
                 f"scale=1/sqrt({d}) folded with log2(e) into the fp32 scores inside the kernel"]
        return forward, args, name, notes

    def _prepare_attention(self, spec: KernelSpec, inputs: dict[str, Any]):
        """The attention forward (:meth:`_attention_fn`). The project's kernel writes into the runnable's
        output buffer, so the capture's poison reaches it; jax's attention_mgpu allocates its own output, so
        the runnable cannot run it in the poisoned buffer (``runnable.py``: ``poison_effective`` is False)."""
        from mosaic_target_pallas.runnable import PallasRunnable

        into = AttentionKnobs(**spec.knobs).resolved(spec.dtype).kernel == "project"
        forward, args, _, _ = self._attention_fn(spec, into=into)
        missing = [x for x in ("q", "k", "v") if x not in inputs]
        if missing:
            raise BadInput(f"attention inputs q, k, v are needed; missing {', '.join(missing)}", "inputs")
        for key, a in zip(("q", "k", "v"), args[:3], strict=True):
            if tuple(np.shape(inputs[key])) != a.shape:
                raise BadInput(f"attention input '{key}' must have shape {a.shape}", f"got {np.shape(inputs[key])}")
        return PallasRunnable(forward, [inputs["q"], inputs["k"], inputs["v"]], args[0].dtype, args[0].shape,
                              out_name="o", writes_into=into)


def lower_fn(backend, fn, args, name: str, gpu: GpuTarget, workdir: Path, notes: list,
             smem_detail: str = "") -> Lowered:
    """Lower ``fn(*args)`` for the ``cuda`` platform: the shared-memory probe against ``gpu``, the StableHLO as the
    source artifact, and with a CUDA backend the compile dump's PTX, SASS (or ptxas's, :func:`assemble_ptx`) and
    ptxas log. ``smem_detail``: what the kernel's buffers are, for the over-budget line."""
    import jax

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    smem = backend.smem_bytes(fn, args)
    budget = gpu.smem_per_block
    if smem and fit.diagnose(fit.Footprint(where=name, smem_bytes=smem), gpu, ("smem-per-block",)):
        raise Unbuildable(f"[smem-per-block] {name}: shared memory {smem} B exceeds {gpu.name}'s {budget} B per block"
                          + (f" ({smem_detail})" if smem_detail else ""), name)
    try:
        with _smem_limit(budget):
            lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    except (ValueError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        raise Unbuildable(f"Mosaic GPU lowering failed: {first}", name) from None
    from mosaic_target_pallas import arch_rules

    text = lowered.as_text()
    refused = arch_rules.refusal(text, gpu.arch, name)  # a kernel built for another architecture is not lowered
    if refused:
        raise Unbuildable(refused, name)
    source = workdir / f"{name}.stablehlo.mlir"
    source.write_text(text)
    arches = arch_rules.target_arches(text)
    if arches and "sm_90a" not in arches:  # no CPU fallback to report "lowered" from StableHLO alone
        missing = arch_rules.ptx_step_missing()
        if missing:
            raise ToolMissing(f"{name} cannot lower to PTX for {gpu.arch} here: {missing} (the StableHLO with "
                              f"its Mosaic GPU module lowered for {', '.join(arches)}; smem {smem} B fits)")
    notes = [f"smem_bytes={smem}", *notes]
    if arches:
        notes.append(f"the Mosaic GPU module's tensor-core instructions target {', '.join(arches)}")
    ptx = sass = ptxas = resources = cubin = None
    toolchain = _toolchain()
    if jax_has_gpu():
        ptx, sass, ptxas, resources = gpu_compile_dump(fn, args, workdir / "mosaic_dump")
        if ptx is not None and sass is None:
            asm = assemble_ptx(ptx, gpu.arch, workdir / "from_ptx", runtime_log=ptxas)
            cubin, sass = asm.cubin, asm.sass
            notes.extend(asm.notes)
            if asm.ptxas_version:
                toolchain["ptxas"] = asm.ptxas_version
    else:
        notes.append("PTX/SASS/ptxas log come from the GPU compile (MOSAIC_GPU_DUMP_TO); no GPU here")
    return Lowered(kernel_name=name, ptx=ptx, cubin=cubin, sass=sass, ptxas_log=ptxas, source=source,
                   resources=resources, toolchain=toolchain, notes=tuple(notes))


@attrs.frozen
class Assembled:
    """A cubin and its SASS made from captured PTX by ptxas (any may be None when a tool is missing)."""

    cubin: Path | None
    sass: Path | None
    log: Path | None
    ptxas_version: str | None
    registers: int | None
    notes: tuple


def assemble_ptx(ptx: Path, arch: str, out_dir: Path, runtime_log: Path | None = None) -> Assembled:
    """``ptxas -arch=<arch> -v -o kernel.cubin kernel.ptx``, then SASS through core's nvdisasm helper.

    Used when jax's dump holds PTX but no SASS/cubin. The notes say that the SASS was assembled from the
    captured PTX by ptxas <version> rather than taken from jax's runtime, and compare the register count
    with jax's own ptxas log when there is one. A missing or failing tool gives a note, never an error:
    the capture keeps its PTX.
    """
    from mosaic.toolchain.nvdisasm import disassemble
    from mosaic.toolchain.tools import find_tool

    ptx = Path(ptx)
    out_dir = Path(out_dir)
    if find_tool("ptxas") is None:
        return Assembled(None, None, None, None, None,
                         ("no SASS: jax dumped PTX only and ptxas is not on PATH to assemble it",))
    out_dir.mkdir(parents=True, exist_ok=True)
    cubin = out_dir / f"{ptx.stem}.cubin"
    res = _ptxas.assemble(ptx, arch, cubin)
    version = res.version or "unknown version"
    if res.returncode is None:
        return Assembled(None, None, None, version, None, (f"no SASS: ptxas {version} did not finish in 300 s",))
    log = out_dir / f"{ptx.stem}.ptxas-reassembly.log"
    log.write_text(f"# {' '.join(res.cmd[:-3])} -o {cubin.name} {ptx.name}  (ptxas {version})\n" + res.log)
    if res.cubin is None:
        return Assembled(None, None, log, version, None,
                         (f"no SASS: ptxas {version} -arch={arch} failed on the captured PTX: {res.message()}",))
    registers = _max_registers(res.log)
    notes = [f"SASS and cubin assembled from the captured PTX by ptxas {version} (-arch={arch}), not taken "
             "from jax's runtime (its MOSAIC_GPU_DUMP_TO dump held PTX and a ptxas log only)"]
    if runtime_log is not None and Path(runtime_log).is_file():
        jax_regs = _max_registers(Path(runtime_log).read_text(errors="replace"))
        if jax_regs is not None and registers is not None:
            same = jax_regs == registers
            notes.append(f"registers: reassembly {registers}, jax's runtime ptxas log {jax_regs}"
                         + ("" if same else " -- DIFFERENT: the runtime used other ptxas options or version"))
    sass = out_dir / f"{ptx.stem}.sass"
    try:
        sass.write_text(disassemble(cubin))
    except BadInput as exc:
        notes.append(f"no SASS: {exc.what}")
        sass = None
    return Assembled(cubin, sass, log, version, registers, tuple(notes))


def _max_registers(log: str) -> int | None:
    """The largest register count of any function in a ptxas -v log (None when it states none)."""
    regs = [f.registers for f in _ptxas.parse_log(log) if f.registers is not None]
    return max(regs) if regs else None


def gpu_compile_dump(fn, args, dump: Path):
    """Compile and run once on zeros with MOSAIC_GPU_DUMP_TO=dump; (ptx, sass, ptxas log, resources)."""
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


def collect_dump(dump: Path):
    """Pick the newest PTX, SASS and ptxas log from a MOSAIC_GPU_DUMP_TO directory and read the resources."""
    def newest(match) -> Path | None:
        found = sorted((p for p in dump.iterdir() if p.is_file() and match(p.name)), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None

    # jaxlib names dumps <module basename>.<kind>: .ptx, .sass (and .sass_ctrl), and a ptxas log
    ptx = newest(lambda n: n.endswith(".ptx"))
    sass = newest(lambda n: n.endswith(".sass"))
    ptxas = newest(lambda n: "ptxas" in n)
    resources = None
    if ptxas is not None:
        functions = _ptxas.parse_log(ptxas.read_text(errors="replace"))
        regs = [f.registers for f in functions if f.registers is not None]
        if regs:
            resources = ResourceUsage(registers=max(regs), spill_stores=sum(f.spill_stores or 0 for f in functions),
                                      spill_loads=sum(f.spill_loads or 0 for f in functions))
    return ptx, sass, ptxas, resources
