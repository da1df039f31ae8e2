"""Knob classes of the Pallas row-wise kernels (``rmsnorm``, ``softmax``; kernels in ``rowwise.py``).

Both kernels stage blocks of ``block_rows`` full rows in shared memory with TMA and reduce each row in
registers, one warp per row group. A row of ``cols`` elements is viewed as ``cols / tma_cols`` boxes of
``tma_cols`` elements: jax's TMA copies take at most 256 elements per dimension, so the box, not the row,
is the unit of the copy (one 3-D TMA copy per block: rows x boxes x tma_cols).

==========================  ===============================================================================
knob                        meaning
==========================  ===============================================================================
``block_rows``              rows per pipeline step: from 4 up a warp owns ``block_rows / 4`` rows of each
                            box (row reductions stay in the warp); 2 splits each row over 2 warps (the
                            reduction crosses warps through shared memory) and halves the buffers
``tma_cols``                the TMA box width (elements); the register chunk a warp reduces at a time
``vector``                  elements per register vector of a lane (8 x 16-bit = one 16-byte access); a
                            lane holds ``tma_cols / (32 * vector)`` vectors of each row of a box
``max_concurrent_steps``    TMA loads in flight: blocks staged ahead of the one being reduced
``blocks_per_cta``          row blocks one CTA walks through its pipeline (grid = rows / (block_rows x
                            blocks_per_cta) CTAs)
``out_slots``               shared-memory output buffers: 2 lets one block's TMA store overlap the next
                            block's compute, 1 waits for the store before reusing the buffer, 0 writes
                            the result in place over the input stage (needs two stages: the stage is
                            released one step late, after its store has read it)
``approx_math``             Mosaic GPU's approximate ``exp``/``rsqrt`` (``CompilerParams.approx_math``)
``auto_barriers``           True: Mosaic GPU's conservative warpgroup barriers around every shared- and global-
                            memory store (two ``bar.sync`` per box and pass: the H200's naive rmsnorm SASS held
                            64 per 4-row block, each box's store serialised behind them); False
                            (``CompilerParams.unsafe_no_auto_barriers``): only the kernel's own synchronisation,
                            which orders every cross-thread shared-memory access here (see ``rowwise.py``)
``hold``                    ``reload``: every pass loads the block again (shared memory, or direct: global
                            memory, then L2); ``registers``: the first pass keeps its boxes in registers in the
                            input format and the later passes read them there (more registers per thread)
``copy``                    ``tma``: blocks staged in shared memory by TMA and the result stored from shared
                            memory by TMA (the pipeline knobs apply); ``tma_in``: TMA loads into the stages,
                            the result stored from registers with plain vector stores (the reference's
                            ``st.global``: no output buffer, so ``out_slots`` stays at its default);
                            ``direct``: plain vector loads from global memory into registers and direct
                            stores, no shared memory (the pipeline knobs stay at their defaults)
``online`` (softmax only)   True: one pass keeps a running max and rescales the running sum (two passes
                            over shared memory); False: max pass, then sum pass (three passes, no rescale)
==========================  ===============================================================================

Knobs that constrain each other are tables of data (``DEPENDENCIES``, read by the ``knobs`` proposer):
shared memory (steps + output slots of ``block_rows x cols`` elements, the weight row), the vector width
that must tile the box, and the pipeline depth that cannot exceed the blocks a CTA walks through. ``PREDICTS``
gives the dynamic shared memory and the grid any knob set will launch with, so the proposer knows which edits
move those rows toward the reference's (``mosaic.proposers.predicted``).
"""

from __future__ import annotations

import attrs
from mosaic.fields import one_of

from mosaic_target_pallas.knobs import _bool, _flag, _int, _int_in, _pow2_in

#: Mosaic GPU's TMA limit: at most this many elements along any dimension of one async copy
TMA_MAX_BOX = 256
WARPS = 4
LANES = 32
#: (max_concurrent_steps, out_slots) defaults: what a kernel without a pipeline (copy='direct') keeps
PIPELINE_DEFAULTS = (2, 1)
#: shared memory Mosaic GPU reserves for cross-warp reductions (CompilerParams.reduction_scratch_bytes)
REDUCTION_SCRATCH = 128 * 4 * 4


#: the tuning table: every value each knob takes (field metadata for the ``knobs`` proposer; the tests lower
#: and run every one)
VALUES = {
    "block_rows": (2, 4, 8, 16, 32, 64),
    "tma_cols": (64, 128, 256),
    "vector": (1, 2, 4, 8),
    "max_concurrent_steps": (1, 2, 3, 4),
    # beyond 32 blocks a CTA walks 128+ rows: 16384 rows (the shape) would fill fewer CTAs than the H200 has
    # SMs, so the search does not spend candidates there (the validator still admits up to 256)
    "blocks_per_cta": (1, 2, 4, 8, 16, 32),
    "out_slots": (0, 1, 2),
    "approx_math": (False, True),
    "auto_barriers": (False, True),
    "hold": ("reload", "registers"),
    "copy": ("tma", "direct", "tma_in"),
}
#: out_slots of a kernel without shared-memory output buffers (copy='tma_in'): the field's default
NO_OUTPUT_BUFFER = 1


@attrs.frozen
class RowwiseKnobs:
    block_rows: int = attrs.field(default=4, converter=_int, validator=_pow2_in(2, 64),
                                  metadata={"values": VALUES["block_rows"]})
    tma_cols: int = attrs.field(default=256, converter=_int, validator=_pow2_in(64, TMA_MAX_BOX),
                                metadata={"values": VALUES["tma_cols"]})
    vector: int = attrs.field(default=8, converter=_int, validator=_pow2_in(1, 8),
                              metadata={"values": VALUES["vector"]})
    max_concurrent_steps: int = attrs.field(default=2, converter=_int, validator=_int_in(1, 4),
                                            metadata={"values": VALUES["max_concurrent_steps"]})
    blocks_per_cta: int = attrs.field(default=4, converter=_int, validator=_pow2_in(1, 256),
                                      metadata={"values": VALUES["blocks_per_cta"]})
    out_slots: int = attrs.field(default=1, converter=_int, validator=_int_in(0, 2),
                                 metadata={"values": VALUES["out_slots"]})
    approx_math: bool = attrs.field(default=False, converter=_flag, validator=_bool,
                                    metadata={"values": VALUES["approx_math"]})
    auto_barriers: bool = attrs.field(default=False, converter=_flag, validator=_bool,
                                      metadata={"values": VALUES["auto_barriers"]})
    hold: str = attrs.field(default="reload", validator=one_of(*VALUES["hold"]), metadata={"values": VALUES["hold"]})
    copy: str = attrs.field(default="tma", validator=one_of(*VALUES["copy"]), metadata={"values": VALUES["copy"]})

    def warp_groups_per_row(self) -> int:
        """Warps that share one row of a box: 1 from 4 rows up, 2 for 2-row blocks."""
        return max(1, WARPS // self.block_rows)

    def rows_per_cta(self) -> int:
        return self.block_rows * self.blocks_per_cta

    def problems(self, rows: int, cols: int) -> list[tuple[str, str]]:
        """(code, one line) for each way these knobs cannot run on a rows x cols problem. The codes are the
        DEPENDENCIES rules' (so the ``knobs`` proposer can mend them) or PALLAS-ROWS (the blocking does not
        divide the shape)."""
        out = []
        span = self.warp_groups_per_row() * LANES * self.vector
        if self.tma_cols % span:
            share = f"{self.warp_groups_per_row()} warps x " if self.warp_groups_per_row() > 1 else ""
            out.append(("vector-tiles-box", f"vector={self.vector}: {share}32 lanes x vector must divide "
                                            f"tma_cols={self.tma_cols}"))
        if self.copy != "direct" and self.max_concurrent_steps > self.blocks_per_cta:
            out.append(("steps-within-cta", f"max_concurrent_steps={self.max_concurrent_steps} exceeds "
                                            f"blocks_per_cta={self.blocks_per_cta}: a CTA cannot stage more "
                                            "blocks than it walks through"))
        if self.copy == "direct" and (self.max_concurrent_steps, self.out_slots) != PIPELINE_DEFAULTS:
            out.append(("direct-has-no-pipeline", f"copy='direct' stages nothing: max_concurrent_steps and out_slots "
                                                  f"must stay at their defaults {PIPELINE_DEFAULTS}, got "
                                                  f"({self.max_concurrent_steps}, {self.out_slots})"))
        if self.copy == "tma_in" and self.out_slots != NO_OUTPUT_BUFFER:
            out.append(("tma-in-has-no-output-buffer", f"copy='tma_in' stores from registers: out_slots must stay at "
                                                       f"its default {NO_OUTPUT_BUFFER}, got {self.out_slots}"))
        if self.out_slots == 0 and self.max_concurrent_steps < 2:
            out.append(("in-place-needs-two-stages", "out_slots=0 (in place) needs max_concurrent_steps >= 2: a "
                                                     "stage is released one step late, after its store"))
        if rows % self.rows_per_cta():
            out.append(("PALLAS-ROWS", f"rows={rows} is not divisible by block_rows x blocks_per_cta = "
                                       f"{self.block_rows} x {self.blocks_per_cta}"))
        if cols % self.tma_cols:
            out.append(("PALLAS-ROWS", f"cols={cols} is not divisible by tma_cols={self.tma_cols}"))
        elif cols // self.tma_cols > TMA_MAX_BOX:
            out.append(("PALLAS-ROWS", f"cols={cols} gives {cols // self.tma_cols} boxes of tma_cols="
                                       f"{self.tma_cols} per row; one TMA copy takes at most {TMA_MAX_BOX}"))
        return out

    def smem_bytes(self, cols: int, itemsize: int, weight: bool) -> int:
        """The shared memory the kernel allocates: input stages, output slots, the weight row, reduction scratch
        and an mbarrier per stage and for the weight row (the lowering's own count is checked against the GPU in ``lower``);
        copy='tma_in': no output slots; copy='direct': the reduction scratch only."""
        if self.copy == "direct":
            return REDUCTION_SCRATCH
        block = self.block_rows * cols * itemsize
        slots = 0 if self.copy == "tma_in" else self.out_slots
        return ((self.max_concurrent_steps + slots) * block + (cols * itemsize if weight else 0)
                + REDUCTION_SCRATCH + 8 * (self.max_concurrent_steps + (1 if weight else 0)))


@attrs.frozen
class RmsnormKnobs(RowwiseKnobs):
    """y = x * rsqrt(mean(x^2) + eps) * w; x, w in bf16/f16, float32 accumulation."""


@attrs.frozen
class SoftmaxKnobs(RowwiseKnobs):
    """y = exp(x - max) / sum(exp(x - max)) per row; float32 arithmetic."""

    online: bool = attrs.field(default=True, converter=_flag, validator=_bool, metadata={"values": (True, False)})


ROWWISE_KNOBS = {"rmsnorm": RmsnormKnobs, "softmax": SoftmaxKnobs}

SOFTMAX_VALUES = {**VALUES, "online": (True, False)}


def values(family: str) -> dict:
    return SOFTMAX_VALUES if family == "softmax" else VALUES
ITEMSIZE = {"bf16": 2, "f16": 2}


# -- knob dependencies (data for the ``knobs`` proposer's compound edits; mosaic.proposers.dependencies) ------

def can_implement(knobs: RowwiseKnobs, spec, gpu) -> list:
    """The CPU predicate (no lowering): the knobs agree with each other and with the shape, and the buffers fit
    shared memory (mosaic.budget's rule)."""
    from mosaic import budget
    from mosaic.errors import Diagnostic

    rows, cols = spec.shape.get("rows", 0), spec.shape.get("cols", 0)
    out = [Diagnostic(code, "row blocks", "knobs that fit the problem", None, line)
           for code, line in knobs.problems(rows, cols)]
    smem = knobs.smem_bytes(cols, ITEMSIZE.get(spec.dtype, 2), isinstance(knobs, RmsnormKnobs))
    out += budget.diagnose(budget.Footprint(where="row blocks", smem_bytes=smem), gpu, ("smem-per-block",))
    return out


def _dependencies():
    from mosaic.proposers.dependencies import Dependencies, Dependency

    return Dependencies(check=can_implement, rules=(
        Dependency("smem-per-block", ("block_rows", "max_concurrent_steps", "out_slots"),
                   {"max_concurrent_steps": (3, 2, 1), "out_slots": (1, 0)},
                   "staged blocks and output slots of block_rows full rows share the shared memory: more rows "
                   "per block leave room for fewer stages; writing in place (out_slots=0) frees the output buffer "
                   "for one more stage"),
        Dependency("vector-tiles-box", ("vector", "tma_cols"), {"vector": (4, 2, 1)},
                   "32 lanes x vector elements must tile the TMA box: a narrower box needs a narrower vector"),
        Dependency("in-place-needs-two-stages", ("out_slots", "max_concurrent_steps", "blocks_per_cta"),
                   {"max_concurrent_steps": (2, 3), "blocks_per_cta": (2, 4)},
                   "writing in place releases each stage one step late: the pipeline needs a second stage"),
        Dependency("direct-has-no-pipeline", ("copy", "max_concurrent_steps", "out_slots"),
                   {"max_concurrent_steps": (PIPELINE_DEFAULTS[0],), "out_slots": (PIPELINE_DEFAULTS[1],)},
                   "direct loads stage nothing: the pipeline knobs go back to their defaults"),
        Dependency("tma-in-has-no-output-buffer", ("copy", "out_slots"), {"out_slots": (NO_OUTPUT_BUFFER,)},
                   "storing from registers leaves no output buffer: out_slots goes back to its default"),
        Dependency("steps-within-cta", ("max_concurrent_steps", "blocks_per_cta"),
                   {"max_concurrent_steps": (2, 1), "blocks_per_cta": (2, 4, 8)},
                   "a CTA cannot stage more blocks ahead than it walks through"),
    ))


RmsnormKnobs.DEPENDENCIES = _dependencies()
SoftmaxKnobs.DEPENDENCIES = RmsnormKnobs.DEPENDENCIES


# -- predicted rows (data for the ``knobs`` proposer's direction and reach; mosaic.proposers.predicted) ----------

def _predicted_smem(knobs: RowwiseKnobs, spec) -> int:
    """The dynamic shared memory the lowering allocates (``smem_bytes``; the H200 lowerings of session 12 read the
    same bytes for every knob set the campaign built)."""
    return knobs.smem_bytes(spec.shape["cols"], ITEMSIZE.get(spec.dtype, 2), isinstance(knobs, RmsnormKnobs))


def _predicted_grid(knobs: RowwiseKnobs, spec) -> list[int]:
    """The launch grid: one CTA per ``block_rows x blocks_per_cta`` rows."""
    return [spec.shape["rows"] // knobs.rows_per_cta(), 1, 1]


RmsnormKnobs.PREDICTS = {"smem.dynamic": _predicted_smem, "grid": _predicted_grid}
SoftmaxKnobs.PREDICTS = RmsnormKnobs.PREDICTS


def table_configs(family: str, spec, gpu) -> list[tuple[str, object, dict | None]]:
    """Every value of the tuning table as a single edit of the defaults, each made buildable on ``spec``'s
    shape by the DEPENDENCIES table (the ``knobs`` proposer's compound-edit search): ``(knob, value, knobs)``
    with ``knobs`` None when no compound edit of at most three partners fits this shape."""
    from mosaic.proposers.dependencies import complete

    cls = ROWWISE_KNOBS[family]
    base = attrs.asdict(cls())
    out = []
    for knob, vals in values(family).items():
        for value in vals:
            edit = {**base, knob: value}
            parts = complete(cls.DEPENDENCIES, cls, edit, {knob}, spec, gpu)
            out.append((knob, value, None if parts is None else {**edit, **{p["knob"]: p["value"] for p in parts}}))
    return out
