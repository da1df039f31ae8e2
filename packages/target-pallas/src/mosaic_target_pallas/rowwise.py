"""The project's Pallas Mosaic GPU row-wise kernels, ``rmsnorm`` and ``softmax`` (knobs: ``rowwise_knobs.py``).

One warpgroup per CTA. Each CTA walks ``blocks_per_cta`` blocks of ``block_rows`` full rows through
``emit_pipeline``: one TMA copy per block brings the block into shared memory, viewed as (block_rows,
cols / tma_cols, tma_cols) so that no dimension of the copy exceeds jax's 256-element TMA box, with
``max_concurrent_steps`` copies in flight. The reduction runs in registers in a tiled layout that gives
each warp ``block_rows / 4`` rows of a box and each lane ``vector``-wide slices of them, so a row's sum or
max never leaves its warp (lane shuffles, no shared-memory scratch). The result is written to one of
``out_slots`` shared-memory buffers and stored with a TMA copy that overlaps the next block; ``out_slots=0``
writes the result over the block's own input stage and stores it from there (no output buffer: room for one
more stage), the pipeline releasing each stage one step late so that the store has read it.

* rmsnorm: pass 1 sums x^2 over the boxes in float32, ``r = rsqrt(sum / cols + eps)``; pass 2 writes
  ``x * r * w`` (the weight row is copied to shared memory once per CTA).
* softmax: ``online=True`` keeps a running max and rescales the running sum in one pass, then writes
  ``exp(x - max) / sum``; ``online=False`` takes the max first, then the sum, then writes.

Every pass reads the block from shared memory, so HBM sees each element once in and once out. ``copy="direct"``
stages nothing: the warps load their rows from global memory with plain vector loads (the later passes hit
L2), store the result directly, and a CTA walks its blocks in a loop (no shared memory, so many CTAs per SM).
"""

from __future__ import annotations

from pathlib import Path

from mosaic.backend import Lowered, Unbuildable
from mosaic.errors import BadInput
from mosaic.records import GpuTarget, KernelSpec

from mosaic_target_pallas.rowwise_knobs import LANES, ROWWISE_KNOBS, WARPS, RmsnormKnobs, RowwiseKnobs

FAMILIES = tuple(ROWWISE_KNOBS)
EPS = 1e-6  # the rmsnorm oracle's and the torch yardstick's eps


def dims(spec: KernelSpec) -> tuple[int, int]:
    try:
        return spec.shape["rows"], spec.shape["cols"]
    except KeyError as exc:
        raise BadInput(f"{spec.family} shape needs rows, cols; got {sorted(spec.shape)}", f"missing {exc}") from None


def knobs_of(spec: KernelSpec) -> RowwiseKnobs:
    return ROWWISE_KNOBS[spec.family](**spec.knobs)


def _layouts(knobs: RowwiseKnobs):
    """(block layout, weight-row layout) of a (block_rows, tma_cols) box. From 4 rows up: tiles of 4 rows x 32
    lanes x ``vector``, the 4 row groups over the warps (a row's reduction stays in its warp). 2 rows: each
    row split over 2 warps side by side (the reduction crosses warps through Mosaic GPU's shared-memory
    reduction scratch). One row per block would need a 1-D layout (a size-1 row dimension is not a canonical
    Mosaic GPU tiling, and a tiling of the columns alone cannot reduce axis 1): not offered. The weight row is laid out like one row of the box, replicated over the
    warps that share its columns."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    width = LANES * knobs.vector
    if knobs.block_rows >= WARPS:
        block = plgpu.Layout.TILED(plgpu.Tiling(((WARPS, width), (knobs.vector,))),
                                   warp_dims=(-3,), lane_dims=(-2,), vector_dim=-1)
        row = plgpu.Layout.TILED(plgpu.Tiling(((width,), (knobs.vector,))),
                                 warp_dims=(plgpu.Replicated(WARPS),), lane_dims=(-2,), vector_dim=-1)
        return block, row
    rows, groups = knobs.block_rows, knobs.warp_groups_per_row()
    block = plgpu.Layout.TILED(plgpu.Tiling(((rows, groups * width), (width,), (knobs.vector,))),
                               warp_dims=(-4, -3), lane_dims=(-2,), vector_dim=-1)
    row = plgpu.Layout.TILED(plgpu.Tiling(((groups * width,), (width,), (knobs.vector,))),
                             warp_dims=(plgpu.Replicated(rows), -3), lane_dims=(-2,), vector_dim=-1)
    return block, row


def build(family: str, knobs: RowwiseKnobs, rows: int, cols: int, dtype, store_wait: bool = True):
    """A callable ``f(x, w) -> y`` (rmsnorm) or ``f(x) -> y`` (softmax) on (rows, cols) arrays of ``dtype``.
    Knobs that do not fit the problem raise Unbuildable with one line. ``store_wait=False`` drops the wait
    that keeps an in-place store ahead of the pipeline's next load into its stage: a planted race, for the
    interpreter's race detector to find (tests only)."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    problems = knobs.problems(rows, cols)
    if problems:
        raise Unbuildable("; ".join(f"[{code}] {line}" for code, line in problems), family)
    br, tw, per_cta = knobs.block_rows, knobs.tma_cols, knobs.blocks_per_cta
    boxes = cols // tw
    ctas = rows // knobs.rows_per_cta()
    layout, row_layout = _layouts(knobs)
    f32 = jnp.float32
    rmsnorm = family == "rmsnorm"
    in_place = knobs.out_slots == 0

    direct = knobs.copy == "direct"

    def box(ref, j):  # shared memory: Mosaic GPU's optimized load; global memory (direct): plain vector loads
        return plgpu.load(ref.at[:, j, :], layout=layout, optimized=not direct).astype(f32)

    def spread(v, axis):  # a per-row (axis 0) or per-column (axis 1) vector over the box
        return plgpu.layout_cast(lax.broadcast_in_dim(v, (br, tw), (axis,)), layout)

    def rmsnorm_block(x_smem, out, w_smem):
        acc = jnp.zeros((br,), f32)
        for j in range(boxes):
            x = box(x_smem, j)
            acc = acc + jnp.sum(x * x, axis=1)
        r = spread(lax.rsqrt(acc * (1.0 / cols) + EPS), 0)
        for j in range(boxes):
            w = plgpu.load(w_smem.at[j], layout=row_layout, optimized=not direct).astype(f32)
            out[:, j, :] = (box(x_smem, j) * r * spread(w, 1)).astype(dtype)

    def softmax_block(x_smem, out, _w):
        m = jnp.full((br,), -jnp.inf, f32)
        s = jnp.zeros((br,), f32)
        if knobs.online:
            for j in range(boxes):
                x = box(x_smem, j)
                m_new = jnp.maximum(m, jnp.max(x, axis=1))
                s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - spread(m_new, 0)), axis=1)
                m = m_new
        else:
            for j in range(boxes):
                m = jnp.maximum(m, jnp.max(box(x_smem, j), axis=1))
            for j in range(boxes):
                s = s + jnp.sum(jnp.exp(box(x_smem, j) - spread(m, 0)), axis=1)
        mb, inv = spread(m, 0), spread(1.0 / s, 0)
        for j in range(boxes):
            out[:, j, :] = (jnp.exp(box(x_smem, j) - mb) * inv).astype(dtype)

    compute = rmsnorm_block if rmsnorm else softmax_block

    def body(x_gmem, *rest):
        w_gmem, o_gmem = rest if rmsnorm else (None, rest[0])
        cta = lax.axis_index("cta")
        if direct:
            # no staging: each warp reads its rows from global memory (the second pass from L2) and stores the
            # result straight back; a CTA walks its blocks in a loop
            def walk(b, carry):
                first = (cta * per_cta + b) * br
                compute(x_gmem.at[pl.ds(first, br)], o_gmem.at[pl.ds(first, br)], w_gmem)
                return carry

            lax.fori_loop(0, per_cta, walk, 0)
            return

        def scoped(*refs):
            o_smem = refs[0] if knobs.out_slots else None
            w_smem, w_bar = refs[-2:] if rmsnorm else (None, None)
            if rmsnorm:
                plgpu.copy_gmem_to_smem(w_gmem, w_smem, w_bar)
                plgpu.barrier_wait(w_bar)

            def step(idx, x_smem):
                rows_out = o_gmem.at[pl.ds((cta * per_cta + idx[0]) * br, br)]
                if in_place:
                    # each lane overwrites exactly the elements it read (one layout for loads and stores); the
                    # pipeline releases this stage one step late (delay_release=1), so the store of the previous
                    # step must have read its stage before this step ends
                    compute(x_smem, x_smem, w_smem)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(x_smem, rows_out)
                    if store_wait:
                        plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                    return
                slot = idx[0] % knobs.out_slots
                # the slot's previous TMA store must have read it (out_slots=1: the last store)
                plgpu.wait_smem_to_gmem(knobs.out_slots - 1, wait_read_only=True)
                compute(x_smem, o_smem.at[slot], w_smem)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(o_smem.at[slot], rows_out)

            spec = plgpu.BlockSpec((br, boxes, tw), lambda s: (cta * per_cta + s, 0, 0),
                                   delay_release=1 if in_place else 0)
            plgpu.emit_pipeline(step, grid=(per_cta,), in_specs=[spec],
                                max_concurrent_steps=knobs.max_concurrent_steps)(x_gmem)
            plgpu.wait_smem_to_gmem(0)

        scratch = [plgpu.SMEM((knobs.out_slots, br, boxes, tw), dtype)] if knobs.out_slots else []
        if rmsnorm:
            scratch += [plgpu.SMEM((boxes, tw), dtype), plgpu.Barrier()]
        pl.run_scoped(scoped, *scratch)

    call = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((rows, boxes, tw), dtype),
        grid=(ctas,), grid_names=("cta",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane,
                                             approx_math=knobs.approx_math),
    )

    if rmsnorm:
        def fn(x, w):
            return call(x.reshape(rows, boxes, tw), w.reshape(boxes, tw)).reshape(rows, cols)
    else:
        def fn(x):
            return call(x.reshape(rows, boxes, tw)).reshape(rows, cols)
    return fn


def arg_shapes(family: str, rows: int, cols: int) -> list[tuple[str, tuple]]:
    """The kernel's inputs in call order: (family input name, shape)."""
    return [("x", (rows, cols))] + ([("w", (cols,))] if family == "rmsnorm" else [])


def lower(backend, spec: KernelSpec, gpu: GpuTarget, workdir: Path) -> Lowered:
    """The rmsnorm/softmax half of ``PallasBackend.lower`` (same artifacts and notes as the gemm half)."""
    import jax

    from mosaic_target_pallas import backend as be

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    knobs, (rows, cols), dtype = knobs_of(spec), dims(spec), be._jax_dtype(spec)
    name = spec.name or f"pallas_{spec.family}"
    fn = build(spec.family, knobs, rows, cols, dtype)
    args = [jax.ShapeDtypeStruct(shape, dtype) for _, shape in arg_shapes(spec.family, rows, cols)]
    smem = backend.smem_bytes(fn, args)
    if smem and smem > gpu.smem_per_block:
        raise Unbuildable(f"[smem-per-block] {name}: shared memory {smem} B exceeds {gpu.name}'s "
                          f"{gpu.smem_per_block} B per block (block_rows={knobs.block_rows} x cols={cols}, "
                          f"{knobs.max_concurrent_steps} stages + {knobs.out_slots} output slots)", name)
    try:
        with be._smem_limit(gpu.smem_per_block):
            lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    except (ValueError, NotImplementedError) as exc:
        raise Unbuildable(f"Mosaic GPU lowering failed: {str(exc).splitlines()[0]}", name) from None
    source = workdir / f"{name}.stablehlo.mlir"
    source.write_text(lowered.as_text())
    notes = [f"smem_bytes={smem}", f"block={knobs.block_rows}x{cols} as {cols // knobs.tma_cols} TMA boxes of "
             f"{knobs.tma_cols}", f"grid={rows // knobs.rows_per_cta()} CTAs x {knobs.blocks_per_cta} blocks",
             f"stages={knobs.max_concurrent_steps}", f"out_slots={knobs.out_slots}"]
    ptx = sass = ptxas = resources = cubin = None
    toolchain = be._toolchain()
    if be.jax_has_gpu():
        ptx, sass, ptxas, resources = gpu_compile_dump(fn, args, workdir / "mosaic_dump")
        if ptx is not None and sass is None:
            asm = be.assemble_ptx(ptx, gpu.arch, workdir / "from_ptx", runtime_log=ptxas)
            cubin, sass = asm.cubin, asm.sass
            notes.extend(asm.notes)
            if asm.ptxas_version:
                toolchain["ptxas"] = asm.ptxas_version
    else:
        notes.append("PTX/SASS/ptxas log come from the GPU compile (MOSAIC_GPU_DUMP_TO); no GPU here")
    return Lowered(kernel_name=name, ptx=ptx, cubin=cubin, sass=sass, ptxas_log=ptxas, source=source,
                   resources=resources, toolchain=toolchain, notes=tuple(notes))


def gpu_compile_dump(fn, args, dump: Path):
    """Compile and run once on zeros with MOSAIC_GPU_DUMP_TO=dump; (ptx, sass, ptxas log, resources)."""
    import os

    import jax
    import jax.numpy as jnp

    from mosaic_target_pallas.backend import collect_dump

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


def prepare(spec: KernelSpec, inputs: dict):
    """A PallasRunnable over the family's inputs (x, and w for rmsnorm), output ``y``."""
    import numpy as np

    from mosaic_target_pallas.backend import _jax_dtype
    from mosaic_target_pallas.runnable import PallasRunnable

    knobs, (rows, cols), dtype = knobs_of(spec), dims(spec), _jax_dtype(spec)
    fn = build(spec.family, knobs, rows, cols, dtype)
    args = []
    for key, shape in arg_shapes(spec.family, rows, cols):
        if key not in inputs or tuple(np.shape(inputs[key])) != shape:
            raise BadInput(f"{spec.family} input '{key}' must have shape {shape}",
                           f"got {None if key not in inputs else np.shape(inputs[key])}")
        args.append(inputs[key])
    return PallasRunnable(fn, args, dtype, (rows, cols), out_name="y")


def run_interpreted(spec: KernelSpec, inputs: dict, detect_races: bool = True):
    """Run the kernel of ``spec`` on the family's ``inputs`` in jax's GPU interpreter (CPU; ``interpret.py``):
    an InterpretResult whose one output is ``y``. The interpreter computes on the CPU through XLA, which
    flushes float32 subnormals to zero, so bf16 subnormal inputs read as zero here (not on the GPU)."""
    import jax.numpy as jnp

    from mosaic_target_pallas import interpret
    from mosaic_target_pallas.backend import _jax_dtype

    knobs, (rows, cols), dtype = knobs_of(spec), dims(spec), _jax_dtype(spec)
    fn = build(spec.family, knobs, rows, cols, dtype)
    args = [jnp.asarray(inputs[key], dtype) for key, _ in arg_shapes(spec.family, rows, cols)]
    return interpret.run(fn, *args, detect_races=detect_races)


__all__ = ["FAMILIES", "RmsnormKnobs", "build", "lower", "prepare", "run_interpreted"]
