"""The project's own Pallas Mosaic GPU attention forward for sm_90a, bf16 and f16.

``o = softmax(scale * q k^T [causal]) v`` in the attention family's layout: q and o (batch, heads, seq,
head_dim), k and v (batch, kv_heads, seq, head_dim), so nothing is transposed around the kernel, and the
scale 1/sqrt(head_dim) is applied inside it, in fp32, to the scores (q is not rounded after scaling).

One CTA owns ``compute_wgs * block_q`` query rows of one (batch, head) and walks the key/value sequence in
blocks of ``block_kv``. Its warpgroups split the work:

* the **loader** (the last warpgroup) streams K and V blocks by TMA into a ring of ``max_concurrent_steps``
  shared-memory slots. Each slot has four mbarriers: ``k_full``/``v_full`` (the copy's bytes have landed)
  and ``k_empty``/``v_empty`` (every compute warpgroup has finished reading it, one arrival each), so the K
  of a slot is refilled as soon as its scores are computed, while P V still reads the slot's V;
* each **compute** warpgroup keeps ``block_q`` query rows in shared memory and, per key block: S = Q K^T
  by wgmma into fp32 registers; the online softmax with its running maximum ``m`` and sum ``total`` per row
  kept in the base-2 domain (``scale * log2(e)`` is folded into ONE multiplier, so P = exp2(S c - m) is an
  FMA and an ``ex2`` per score); the rescale of ``acc`` and ``total`` by exp2(m_old - m_new) whenever the
  maximum grows; and acc += P V by wgmma with P rounded to the input dtype. At the end o = acc * (1 / total)
  is written over Q's shared-memory tile (Q's last reader has completed) and stored by TMA.

Knobs of this kernel (``AttentionKnobs`` with ``kernel="project"``): ``block_q``, ``block_kv``,
``max_concurrent_steps`` (ring slots), ``compute_wgs`` (1 or 2), ``use_schedule_barrier`` (two compute
warpgroups take turns on the tensor cores: one issues its wgmma while the other does its softmax),
``p_operand`` (P fed to the second wgmma from registers, or staged in shared memory),
``pv_accumulator`` (``carried``: the running acc is the wgmma's accumulator; ``fresh``: P V goes into a
zeroed accumulator that is added to acc in registers), ``approx_math`` (``ex2.approx``, fast reciprocal).

Causal problems (square: query i sees keys j <= i) skip whole blocks: a compute warpgroup whose rows end at
``r`` runs ceil(r / block_kv) key blocks, those left of the diagonal with no mask and those crossing it with
a -inf mask. The CTA's loader loads the blocks its LAST warpgroup needs; an earlier warpgroup, done
sooner, passes the remaining blocks through (it waits for each to land and releases it, computing nothing)
so that the ``empty`` barriers still count every warpgroup and every warpgroup observes every phase of
the barriers it waits on.

Causal CTAs are launched in reverse query order (the longest walks first, the short ones fill the tail).

Grouped-query attention: q head ``h`` reads kv head ``h // (heads // kv_heads)`` (:func:`kv_head_of`).

jax's GPU interpreter (``interpret.py``) runs this kernel with ``p_operand="smem"`` and
``pv_accumulator="fresh"``; it does not implement a wgmma whose A operand is a register array, a
``pl.run_state`` over ``plgpu.ACC.init`` nor a store into an accumulator, so the register and carried
variants are checked by lowering only (see ``docs/pallas-attention.md``).

Written for this project after reading jax 0.11.2's ``attention_mgpu`` (which stages every operand in
float16 shared memory, hence fails for bf16, and needs jax's CUDA plugin to trace); this kernel asks for no
plugin, so it lowers on a machine without a GPU.
"""

from __future__ import annotations

import functools
import math

import attrs

from mosaic_target_pallas.knobs import AttentionKnobs

LOG2_E = math.log2(math.e)
#: setmaxnreg with two compute warpgroups: 384 threads share the SM's 64K registers (170 each by default);
#: 2 x 128 x 232 + 128 x 40 = 64512 moves them to the warpgroups holding the accumulators (multiples of 8)
COMPUTE_REGISTERS, LOADER_REGISTERS = 232, 40


@attrs.frozen
class AttentionProblem:
    """What one launch computes, in the family's terms (``seq`` is both the query and the key length)."""

    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    causal: bool = False

    @property
    def group(self) -> int:
        """q heads per kv head."""
        return self.heads // self.kv_heads

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


def check(knobs: AttentionKnobs, p: AttentionProblem) -> str | None:
    """Why this kernel cannot run ``p`` with ``knobs`` (one line), or None."""
    rows = knobs.compute_wgs * knobs.block_q
    if p.kv_heads < 1 or p.heads % p.kv_heads:
        return f"kv_heads={p.kv_heads} must divide heads={p.heads}"
    if p.head_dim % 64 or not 64 <= p.head_dim <= 256:
        return f"head_dim={p.head_dim} must be a multiple of 64 in [64, 256] (128-byte swizzled wgmma tiles)"
    if p.seq % rows:
        return (f"seq={p.seq} must be a multiple of compute_wgs*block_q={rows} "
                f"(one CTA takes {knobs.compute_wgs} x {knobs.block_q} query rows)")
    if p.seq % knobs.block_kv:
        return f"seq={p.seq} must be a multiple of block_kv={knobs.block_kv}"
    return None


def smem_bytes(knobs: AttentionKnobs, head_dim: int, seq: int, itemsize: int = 2) -> int:
    """The buffers' shared memory (Mosaic GPU adds its barriers and alignment): Q/O per compute warpgroup,
    the K and V ring, and P when it is staged."""
    ring = min(knobs.max_concurrent_steps, seq // knobs.block_kv)
    q = knobs.compute_wgs * knobs.block_q * head_dim
    kv = 2 * ring * knobs.block_kv * head_dim
    p = knobs.compute_wgs * knobs.block_q * knobs.block_kv if knobs.p_operand == "smem" else 0
    return (q + kv + p) * itemsize


# -- the pieces of the math, one function each (tests replace one at a time to plant a bug) ----------------

def kv_head_of(head, group: int):
    """The kv head that q head ``head`` reads (grouped-query attention: ``group`` q heads per kv head)."""
    import jax.numpy as jnp
    from jax import lax

    return lax.div(head, jnp.int32(group))


def causal_mask(s, q_row0, k_col0):
    """The scores of the (block_q, block_kv) tile at rows ``q_row0``, columns ``k_col0``, with every key after
    its query set to -inf."""
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    rows = q_row0 + plgpu.broadcasted_iota(jnp.int32, s.shape, 0, layout=plgpu.Layout.WGMMA)
    cols = k_col0 + plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA)
    return jnp.where(cols <= rows, s, -jnp.inf)


def online_softmax(m, total, acc, s, c: float):
    """One block of the online softmax: ``m`` the running max of ``s * c`` per row, ``total`` the running sum
    of exp2(s c - m); returns (m, total, acc, p), acc and total rescaled to the new maximum and
    p = exp2(s c - m)."""
    import jax.numpy as jnp
    from jax import lax

    m_new = jnp.maximum(m, s.max(axis=1) * c)  # c > 0: max(s) c = max(s c)
    rescale = jnp.exp2(m - m_new)  # 0 on the first block (m = -inf), 1 where the maximum held
    p = jnp.exp2(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))
    total = total * rescale + p.sum(axis=1)
    acc = acc * lax.broadcast_in_dim(rescale, acc.shape, [0])
    return m_new, total, acc, p


def wait_slot_free(empty, slot) -> None:
    """The loader waits until every compute warpgroup has released ``slot`` before refilling it."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    plgpu.barrier_wait(empty.at[slot])


def _swizzled(shape, dtype):
    """A 16-bit shared-memory tile in the wgmma's swizzled layout (128, 64 or 32 bytes by its minor dim)."""
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    bits = jnp.finfo(dtype).bits
    swizzle = plgpu.find_swizzle(shape[-1] * bits)
    tiling = plgpu.TilingTransform((8, swizzle * 8 // bits))
    return plgpu.SMEM(shape, dtype, transforms=(tiling, plgpu.SwizzleTransform(swizzle)))


def build(knobs: AttentionKnobs, p: AttentionProblem, dtype, into: bool = False):
    """``f(q, k, v) -> o`` in the family's layout (module docstring). ``dtype``: jnp.bfloat16 or jnp.float16,
    the inputs' and the output's. ``into=True``: ``f(q, k, v, out)``, the kernel writing into ``out``'s buffer
    (``output_buffer.py``: the capture's NaN poison then reaches it). Raises ValueError (one line) where
    :func:`check` refuses."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if knobs.kernel not in (None, "project"):
        raise ValueError(f"kernels/attention.py is the project's kernel, not kernel={knobs.kernel!r}")
    why = check(knobs, p)
    if why:
        raise ValueError(why)
    wgs, bq, bkv, d = knobs.compute_wgs, knobs.block_q, knobs.block_kv, p.head_dim
    all_steps = p.seq // bkv
    ring = min(knobs.max_concurrent_steps, all_steps)  # never more slots than key blocks
    cta_rows = wgs * bq
    n_tiles = p.seq // cta_rows
    causal, group = p.causal, p.group
    c = p.scale * LOG2_E
    turns = wgs == 2 and knobs.use_schedule_barrier
    p_in_smem, carried = knobs.p_operand == "smem", knobs.pv_accumulator == "carried"

    def steps_for(rows_end):
        """Key blocks that query rows up to ``rows_end`` (exclusive) need."""
        if not causal:
            return jnp.int32(all_steps)
        return lax.div(rows_end + (bkv - 1), jnp.int32(bkv))

    def body(q_gmem, k_gmem, v_gmem, o_gmem, q_smem, k_smem, v_smem, p_smem,
             q_full, k_full, v_full, k_empty, v_empty, turn):
        tile, head, b = lax.axis_index("q_tiles"), lax.axis_index("heads"), lax.axis_index("batch")
        if causal:  # the longest walks (the last query rows) launch first, the short ones fill the tail
            tile = (n_tiles - 1) - tile
        wg = lax.axis_index("wg")
        kv_head = kv_head_of(head, group)
        cta_row0 = tile * cta_rows
        cta_steps = steps_for(cta_row0 + cta_rows)  # what the CTA's last compute warpgroup needs

        @pl.when(wg == wgs)
        def _loader():
            if wgs == 2:
                plgpu.set_max_registers(LOADER_REGISTERS, action="decrease")

            @pl.loop(0, cta_steps)
            def _load(step):
                slot = lax.rem(step, jnp.int32(ring))
                keys = pl.ds(step * bkv, bkv)
                for src, dst, full, empty in ((k_gmem, k_smem, k_full, k_empty),
                                              (v_gmem, v_smem, v_full, v_empty)):
                    @pl.when(step >= ring)
                    def _(empty=empty):
                        wait_slot_free(empty, slot)

                    plgpu.copy_gmem_to_smem(src.at[b, kv_head, keys], dst.at[slot], full.at[slot])

            # the last blocks' releases too: a warpgroup observes every phase of a barrier it waits on
            @pl.loop(jnp.maximum(cta_steps - ring, 0), cta_steps)
            def _drain(step):
                slot = lax.rem(step, jnp.int32(ring))
                plgpu.barrier_wait(k_empty.at[slot])
                plgpu.barrier_wait(v_empty.at[slot])

        @pl.when(wg < wgs)
        def _compute():
            if wgs == 2:
                plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            row0 = cta_row0 + wg * bq
            q_tile = q_smem.at[wg]
            plgpu.copy_gmem_to_smem(q_gmem.at[b, head, pl.ds(row0, bq)], q_tile, q_full.at[wg])

            def take_turn():
                if turns:
                    plgpu.barrier_wait(turn.at[wg])

            def pass_turn():
                if turns:
                    plgpu.barrier_arrive(turn.at[1 - wg])

            if turns:  # warpgroup 0 goes first: warpgroup 1 hands it the first turn
                pl.when(wg == 1)(lambda: plgpu.barrier_arrive(turn.at[0]))
            plgpu.barrier_wait(q_full.at[wg])

            def scores(slot):
                def mma(s_acc):
                    plgpu.wgmma(s_acc, q_tile, k_smem.at[slot].T)
                    return s_acc[...]

                take_turn()
                s = pl.run_scoped(mma, plgpu.ACC((bq, bkv), jnp.float32))
                pass_turn()
                return s

            def add_pv(acc, probs, slot):
                p_op = probs
                if p_in_smem:
                    p_smem.at[wg][...] = probs
                    plgpu.commit_smem()  # the stores reach the wgmma's async proxy, the whole warpgroup's
                    p_op = p_smem.at[wg]
                take_turn()
                if carried:
                    def mma_into(acc_ref):
                        plgpu.wgmma(acc_ref, p_op, v_smem.at[slot])

                    acc = pl.run_state(mma_into)(plgpu.ACC.init(acc))
                else:
                    def mma_fresh(pv_acc):
                        plgpu.wgmma(pv_acc, p_op, v_smem.at[slot])
                        return pv_acc[...]

                    acc = acc + pl.run_scoped(mma_fresh, plgpu.ACC((bq, d), jnp.float32))
                pass_turn()
                return acc

            def step(masked, kv_step, carry):
                m, total, acc = carry
                slot = lax.rem(kv_step, jnp.int32(ring))
                plgpu.barrier_wait(k_full.at[slot])
                s = scores(slot)
                plgpu.barrier_arrive(k_empty.at[slot])  # this slot's K may be refilled
                if masked:
                    s = causal_mask(s, row0, kv_step * bkv)
                m, total, acc, probs = online_softmax(m, total, acc, s, c)
                plgpu.barrier_wait(v_full.at[slot])
                acc = add_pv(acc, probs.astype(dtype), slot)
                plgpu.barrier_arrive(v_empty.at[slot])
                return m, total, acc

            def pass_through(kv_step, carry):
                """A block loaded for the other warpgroup: observe it land, release it, keep the turns."""
                slot = lax.rem(kv_step, jnp.int32(ring))
                for full, empty in ((k_full, k_empty), (v_full, v_empty)):
                    plgpu.barrier_wait(full.at[slot])
                    take_turn()
                    pass_turn()
                    plgpu.barrier_arrive(empty.at[slot])
                return carry

            row_layout = plgpu.Layout.WGMMA.reduce(1)
            carry = (plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), row_layout),
                     plgpu.layout_cast(jnp.full((bq,), 0.0, jnp.float32), row_layout),
                     plgpu.layout_cast(jnp.full((bq, d), 0.0, jnp.float32), plgpu.Layout.WGMMA))
            if causal:
                own_steps = steps_for(row0 + bq)
                left_of_diagonal = lax.div(row0, jnp.int32(bkv))
                carry = lax.fori_loop(0, left_of_diagonal, functools.partial(step, False), carry)
                carry = lax.fori_loop(left_of_diagonal, own_steps, functools.partial(step, True), carry)
                if wgs > 1:
                    lax.fori_loop(own_steps, cta_steps, pass_through, 0)
            else:
                carry = lax.fori_loop(0, all_steps, functools.partial(step, False), carry)
            _, total, acc = carry
            if turns:  # the turn warpgroup 1 handed over last
                pl.when(wg == 0)(lambda: plgpu.barrier_wait(turn.at[0]))

            o = acc * lax.broadcast_in_dim(1.0 / total, acc.shape, [0])
            q_tile[...] = o.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_tile, o_gmem.at[b, head, pl.ds(row0, bq)])
            plgpu.wait_smem_to_gmem(0)

    scratch = dict(
        q_smem=_swizzled((wgs, bq, d), dtype),
        k_smem=_swizzled((ring, bkv, d), dtype),
        v_smem=_swizzled((ring, bkv, d), dtype),
        p_smem=_swizzled((wgs, bq, bkv), dtype) if p_in_smem else None,
        q_full=plgpu.Barrier(num_barriers=wgs),
        k_full=plgpu.Barrier(num_barriers=ring),
        v_full=plgpu.Barrier(num_barriers=ring),
        k_empty=plgpu.Barrier(num_arrivals=wgs, num_barriers=ring),
        v_empty=plgpu.Barrier(num_arrivals=wgs, num_barriers=ring),
        turn=plgpu.Barrier(num_barriers=2) if turns else None,
    )
    out_shape = (p.batch, p.heads, p.seq, d)
    call = plgpu.kernel(
        body,
        out_type=() if into else jax.ShapeDtypeStruct(out_shape, dtype),
        scratch_types=scratch,
        grid=(n_tiles, p.heads, p.batch), grid_names=("q_tiles", "heads", "batch"),
        num_threads=wgs + 1, thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=knobs.approx_math),
    )
    if into:
        from mosaic_target_pallas.output_buffer import writing_into

        return writing_into(call, out_shape, out_shape)
    return call
