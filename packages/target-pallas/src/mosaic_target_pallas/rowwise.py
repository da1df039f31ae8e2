"""The project's Pallas Mosaic GPU row-wise kernels, ``rmsnorm`` and ``softmax`` (knobs: ``rowwise_knobs.py``).

One warpgroup per CTA. Each CTA walks ``blocks_per_cta`` blocks of ``block_rows`` full rows through
``emit_pipeline``: one TMA copy per block brings the block into shared memory, viewed as (block_rows,
cols / tma_cols, tma_cols) so that no dimension of the copy exceeds jax's 256-element TMA box, with
``max_concurrent_steps`` copies in flight. The reduction runs in registers in a tiled layout that gives
each warp ``block_rows / 4`` rows of a box and each lane ``vector``-wide slices of them, so a row's sum or
max never leaves its warp (lane shuffles, no shared-memory scratch). ``copy="tma_in"`` keeps the TMA loads
and stores the result from registers with plain vector stores (as quack's rmsnorm does: no output buffer, no
store pipeline). Otherwise the result is written to one of
``out_slots`` shared-memory buffers and stored with a TMA copy that overlaps the next block; ``out_slots=0``
writes the result over the block's own input stage and stores it from there (no output buffer: room for one
more stage), the pipeline releasing each stage one step late so that the store has read it.

* rmsnorm: pass 1 sums x^2 over the boxes in float32 (element-wise in registers, one cross-lane reduction per
  block), ``r = rsqrt(sum / cols + eps)``; pass 2 writes
  ``x * r * w`` (the weight row is copied to shared memory once per CTA).
* softmax: ``online=True`` keeps a running max and rescales the running sum in one pass, then writes
  ``exp(x - max) / sum``; ``online=False`` takes the max first, then the sum, then writes.

Barriers (``auto_barriers=False``, the default): Mosaic GPU's automatic warpgroup barriers around each store are
off, and the kernel's own synchronisation orders every shared-memory access that crosses threads: the TMA load of
a stage is issued only after ``commit_smem()`` (a fence and a warpgroup barrier) that follows every read of the
stage in the step; an output slot is rewritten only after ``wait_smem_to_gmem`` (its own warpgroup barrier) saw
the slot's last store read; in place, each lane overwrites exactly the elements it read (one layout for the load
and the store), stored after ``commit_smem()``; the weight row is read after its mbarrier wait; cross-warp
reductions (2-row blocks) carry their own barriers. ``auto_barriers=True`` keeps jax's conservative ones.

``hold='registers'``: the first pass keeps each box it loaded in registers (in the input format) and the later
passes read them there, not from shared memory (or, direct, from global memory / L2) again: the reference's way
(quack's rmsnorm keeps its row in 121 registers per thread).

Every pass reads the block from shared memory, so HBM sees each element once in and once out. ``copy="direct"``
stages nothing: the warps load their rows from global memory with plain vector loads (the later passes hit
L2), store the result directly, and a CTA walks its blocks in a loop (no shared memory, so many CTAs per SM).

``build(..., block_body=...)`` keeps the pipeline and swaps what a step does to its block, for measuring the pipeline
itself (``benchmarks/pallas_copy_ceiling.py``): ``"copy"`` writes each box out as it was loaded (y = x: the same
loads and stores as the family's last pass, no arithmetic); ``"store"`` (in place, TMA only) stores the staged
block as the TMA load left it (no pass through registers at all).
"""

from __future__ import annotations

from pathlib import Path

from mosaic.backend import Lowered, Unbuildable
from mosaic.errors import BadInput
from mosaic.records import GpuTarget, KernelSpec

from mosaic_target_pallas.rowwise_knobs import LANES, ROWWISE_KNOBS, WARPS, RmsnormKnobs, RowwiseKnobs

FAMILIES = tuple(ROWWISE_KNOBS)
#: what ``build``'s step does to a block: the family's arithmetic, or none (the pipeline's own ceiling)
BLOCK_BODIES = ("family", "copy", "store")
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


def build(family: str, knobs: RowwiseKnobs, rows: int, cols: int, dtype, store_wait: bool = True,
          into: bool = False, block_body: str = "family"):
    """A callable ``f(x, w) -> y`` (rmsnorm) or ``f(x) -> y`` (softmax) on (rows, cols) arrays of ``dtype``;
    ``into=True``: ``f(x, w, out)`` / ``f(x, out)``, the kernel writing ``y`` into ``out``'s buffer
    (``output_buffer.py``: what the capture's poisoned output needs). Knobs that do not fit the problem
    raise Unbuildable with one line. ``store_wait=False`` drops what keeps a stage's last reader ahead of the
    pipeline's next load into it (in place: the store's wait; copy='tma_in': the warpgroup barrier after the
    reads): a planted race, for the interpreter's race detector to find (tests only). ``block_body`` (``BLOCK_BODIES``): ``"family"`` the family's arithmetic; ``"copy"`` y = x through registers
    and ``"store"`` y = x straight from the TMA stage (``out_slots=0``, ``copy='tma'`` only), both with the
    family's pipeline, arguments and (rmsnorm) weight-row copy unchanged."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    problems = knobs.problems(rows, cols)
    if problems:
        raise Unbuildable("; ".join(f"[{code}] {line}" for code, line in problems), family)
    if block_body not in BLOCK_BODIES:
        raise ValueError(f"unknown block_body {block_body!r}; known: {', '.join(BLOCK_BODIES)}")
    if block_body == "store" and (knobs.out_slots or knobs.copy != "tma"):
        raise Unbuildable(f"block_body='store' stores the staged block itself: needs out_slots=0 and copy='tma', got "
                          f"out_slots={knobs.out_slots}, copy={knobs.copy!r}", family)
    br, tw, per_cta = knobs.block_rows, knobs.tma_cols, knobs.blocks_per_cta
    boxes = cols // tw
    ctas = rows // knobs.rows_per_cta()
    layout, row_layout = _layouts(knobs)
    f32 = jnp.float32
    rmsnorm = family == "rmsnorm"
    in_place = knobs.out_slots == 0

    direct = knobs.copy == "direct"
    tma_in = knobs.copy == "tma_in"  # TMA loads into the stages, plain vector stores from registers

    def raw(ref, j):  # shared memory: Mosaic GPU's optimized load; global memory (direct): plain vector loads
        return plgpu.load(ref.at[:, j, :], layout=layout, optimized=not direct)

    def box(ref, j):
        return raw(ref, j).astype(f32)

    def reader(ref):
        """``get(j)``: box j as float32 -- loaded again at every pass (hold='reload'), or loaded by the first pass
        and kept in registers in the input format for the later ones (hold='registers')."""
        held: dict[int, object] = {}

        def get(j):
            if knobs.hold != "registers":
                return box(ref, j)
            if j not in held:
                held[j] = raw(ref, j)
            return held[j].astype(f32)

        return get

    def spread(v, axis):  # a per-row (axis 0) or per-column (axis 1) vector over the box
        return plgpu.layout_cast(lax.broadcast_in_dim(v, (br, tw), (axis,)), layout)

    def rmsnorm_block(x_smem, out, w_smem):
        get = reader(x_smem)
        # the squares summed element-wise over the boxes, reduced across the lanes once per block (not once per box)
        acc = None
        for j in range(boxes):
            x = get(j)
            acc = x * x if acc is None else acc + x * x
        r = spread(lax.rsqrt(jnp.sum(acc, axis=1) * (1.0 / cols) + EPS), 0)
        for j in range(boxes):
            w = plgpu.load(w_smem.at[j], layout=row_layout, optimized=not direct).astype(f32)
            out[:, j, :] = (get(j) * r * spread(w, 1)).astype(dtype)

    def softmax_block(x_smem, out, _w):
        get = reader(x_smem)
        m = jnp.full((br,), -jnp.inf, f32)
        s = jnp.zeros((br,), f32)
        if knobs.online:
            for j in range(boxes):
                x = get(j)
                m_new = jnp.maximum(m, jnp.max(x, axis=1))
                s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - spread(m_new, 0)), axis=1)
                m = m_new
        else:
            for j in range(boxes):
                m = jnp.maximum(m, jnp.max(get(j), axis=1))
            for j in range(boxes):
                s = s + jnp.sum(jnp.exp(get(j) - spread(m, 0)), axis=1)
        mb, inv = spread(m, 0), spread(1.0 / s, 0)
        for j in range(boxes):
            out[:, j, :] = (jnp.exp(get(j) - mb) * inv).astype(dtype)

    def copy_block(x_smem, out, _w):  # y = x: each box loaded and stored in the same layout, no arithmetic
        for j in range(boxes):
            out[:, j, :] = raw(x_smem, j)

    def store_block(x_smem, out, _w):  # in place: the stage already holds y = x
        pass

    compute = {"family": rmsnorm_block if rmsnorm else softmax_block, "copy": copy_block, "store": store_block}[block_body]

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
            o_smem = refs[0] if knobs.out_slots and not tma_in else None
            w_smem, w_bar = refs[-2:] if rmsnorm else (None, None)
            if rmsnorm:
                plgpu.copy_gmem_to_smem(w_gmem, w_smem, w_bar)
                plgpu.barrier_wait(w_bar)

            def step(idx, x_smem):
                rows_out = o_gmem.at[pl.ds((cta * per_cta + idx[0]) * br, br)]
                if tma_in:
                    # the result goes straight from registers to global memory; the stage is refilled by the
                    # pipeline's next TMA load right after this step, so every warp's reads of it must be done:
                    # commit_smem's warpgroup barrier (and proxy fence) orders them before that async write
                    compute(x_smem, rows_out, w_smem)
                    if store_wait:
                        plgpu.commit_smem()
                    return
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

        scratch = [plgpu.SMEM((knobs.out_slots, br, boxes, tw), dtype)] if knobs.out_slots and not tma_in else []
        if rmsnorm:
            scratch += [plgpu.SMEM((boxes, tw), dtype), plgpu.Barrier()]
        pl.run_scoped(scoped, *scratch)

    view = (rows, boxes, tw)
    call = plgpu.kernel(
        body,
        out_type=() if into else jax.ShapeDtypeStruct(view, dtype),
        grid=(ctas,), grid_names=("cta",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane,
                                             approx_math=knobs.approx_math,
                                             unsafe_no_auto_barriers=not knobs.auto_barriers),
    )

    if into:
        from mosaic_target_pallas.output_buffer import writing_into

        write = writing_into(call, view, (rows, cols))
        if rmsnorm:
            return lambda x, w, out: write(x.reshape(view), w.reshape(boxes, tw), out)
        return lambda x, out: write(x.reshape(view), out)
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
    """The rmsnorm/softmax half of ``PallasBackend.lower`` (``backend.lower_fn``: the same artifacts and notes as
    the gemm half)."""
    import jax

    from mosaic_target_pallas import backend as be

    knobs, (rows, cols), dtype = knobs_of(spec), dims(spec), be._jax_dtype(spec)
    name = spec.name or f"pallas_{spec.family}"
    fn = build(spec.family, knobs, rows, cols, dtype)
    args = [jax.ShapeDtypeStruct(shape, dtype) for _, shape in arg_shapes(spec.family, rows, cols)]
    notes = [f"block={knobs.block_rows}x{cols} as {cols // knobs.tma_cols} TMA boxes of {knobs.tma_cols}",
             f"grid={rows // knobs.rows_per_cta()} CTAs x {knobs.blocks_per_cta} blocks",
             f"stages={knobs.max_concurrent_steps}", f"out_slots={knobs.out_slots}"]
    detail = (f"block_rows={knobs.block_rows} x cols={cols}, {knobs.max_concurrent_steps} stages + "
              f"{knobs.out_slots} output slots")
    return be.lower_fn(backend, fn, args, name, gpu, workdir, notes, smem_detail=detail)


def prepare(spec: KernelSpec, inputs: dict):
    """A PallasRunnable over the family's inputs (x, and w for rmsnorm), output ``y``."""
    import numpy as np

    from mosaic_target_pallas.backend import _jax_dtype
    from mosaic_target_pallas.runnable import PallasRunnable

    knobs, (rows, cols), dtype = knobs_of(spec), dims(spec), _jax_dtype(spec)
    fn = build(spec.family, knobs, rows, cols, dtype, into=True)
    args = []
    for key, shape in arg_shapes(spec.family, rows, cols):
        if key not in inputs or tuple(np.shape(inputs[key])) != shape:
            raise BadInput(f"{spec.family} input '{key}' must have shape {shape}",
                           f"got {None if key not in inputs else np.shape(inputs[key])}")
        args.append(inputs[key])
    return PallasRunnable(fn, args, dtype, (rows, cols), out_name="y", writes_into=True)


def run_interpreted(spec: KernelSpec, inputs: dict, detect_races: bool = True):
    """Run the kernel of ``spec`` on the family's ``inputs`` in jax's GPU interpreter (CPU; ``interpret.py``):
    an InterpretResult whose one output is ``y``. As on the GPU, the kernel writes into an output buffer filled
    with NaN beforehand (``build(into=True)``), so an element it never writes reads NaN and fails the oracle.
    The interpreter computes on the CPU through XLA, which flushes float32 subnormals to zero, so bf16 subnormal
    inputs read as zero here (not on the GPU)."""
    import jax.numpy as jnp

    from mosaic_target_pallas import interpret
    from mosaic_target_pallas.backend import _jax_dtype

    knobs, (rows, cols), dtype = knobs_of(spec), dims(spec), _jax_dtype(spec)
    fn = build(spec.family, knobs, rows, cols, dtype, into=True)
    args = [jnp.asarray(inputs[key], dtype) for key, _ in arg_shapes(spec.family, rows, cols)]
    return interpret.run(fn, *args, jnp.full((rows, cols), jnp.nan, dtype), detect_races=detect_races)


__all__ = ["FAMILIES", "RmsnormKnobs", "build", "lower", "prepare", "run_interpreted"]
