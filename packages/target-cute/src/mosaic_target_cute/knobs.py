"""Knob classes of the CuTe families (validated at construction; a bad value raises RecordError).

``gemm`` has three kernels, chosen by ``kernel``:

* ``hopper`` — the project's warp-specialised Hopper GEMM (``kernels/hopper_gemm.py``): TMA loads into a
  ``stages``-deep mbarrier pipeline, wgmma on ``tile_mn[0] // 64`` consumer warpgroups, one producer
  warpgroup (setmaxnreg), TMA-store epilogue in ``epi_tile`` sub-tiles, optional persistent tile
  scheduler (raster order, swizzle) and clusters with TMA multicast. An epilogue sub-tile is 64 rows
  high (each consumer warpgroup stores its own 64 rows) or ``tile_mn[0]`` rows (all consumer warpgroups
  write one sub-tile together); its width is a multiple of 16 (the stmatrix copy's width).
* ``blackwell`` — the project's warp-specialised Blackwell GEMM for sm_100a (``kernels/blackwell_gemm.py``):
  TMA loads (multicast across the cluster) into a ``stages``-deep ring, one warp issuing tcgen05.mma into
  an accumulator in tensor memory (``acc_stages`` stages of ``tile_mn[1]`` columns), ``cta_group`` 1 or 2
  (2: two CTAs of the cluster's M dimension share one MMA of ``2 * tile_mn[0]`` rows), four epilogue warps
  reading tensor memory (tcgen05.ld) ``epi_tile[1]`` columns at a time. ``tile_mn[0]`` is 128 (one
  tensor-memory lane per row), ``epi_tile[0]`` is ``tile_mn[0]``. Its budget rules (shared memory, tensor
  memory columns, cluster) are data in ``blackwell_budget.py``.
* ``naive`` — the deliberately naive first translation (``kernels/naive_gemm.py``): one thread per output
  element, plain global loads, fp32 FMA, no shared memory, no pipelining, no TMA, no tensor cores.

``attention`` (:class:`AttentionKnobs`, problem :class:`AttentionShape`) has two: ``hopper``
(``kernels/hopper_attention.py``, FlashAttention-3 style: producer warpgroup, TMA, wgmma for both products,
online softmax in registers) and ``naive`` (``kernels/naive_attention.py``, one thread per query row). Its budget
rules are in :mod:`mosaic_target_cute.budget` (``attention_diagnose``); :data:`AttentionKnobs.DEPENDENCIES` ties
the knobs those rules name.
"""

from __future__ import annotations

import attrs
from mosaic.fields import fail, one_of

KERNELS = ("hopper", "blackwell", "naive")
ATTENTION_KERNELS = ("hopper", "naive")


def _pair(allowed_a: tuple, allowed_b: tuple):
    def conv(value):
        return tuple(value) if isinstance(value, list | tuple) else value

    def check(inst, attribute, value):
        if not (isinstance(value, tuple) and len(value) == 2 and value[0] in allowed_a and value[1] in allowed_b):
            fail(inst, attribute, value, f"a pair (first in {allowed_a}, second in {allowed_b})")

    return conv, check


def _in(*allowed):
    def check(inst, attribute, value):
        if isinstance(value, bool) or value not in allowed:
            fail(inst, attribute, value, "one of " + ", ".join(map(str, allowed)))

    return check


_TILE = _pair((64, 128), (64, 128, 192, 256))
_CLUSTER = _pair((1, 2), (1, 2))
_EPI = _pair((32, 64, 128), (16, 32, 64, 128))
_BLOCK = _pair((8, 16, 32), (8, 16, 32))


@attrs.frozen
class GemmKnobs:
    kernel: str = attrs.field(default="hopper", validator=one_of(*KERNELS))
    tile_mn: tuple = attrs.field(default=(128, 128), converter=_TILE[0], validator=_TILE[1])
    tile_k: int = attrs.field(default=64, validator=_in(64))
    cluster_mn: tuple = attrs.field(default=(1, 1), converter=_CLUSTER[0], validator=_CLUSTER[1])
    stages: int = attrs.field(default=4, validator=_in(*range(2, 9)))
    # whether a persistent tile loop pays depends on the tiles each SM walks (tile and cluster): a persistent=True
    # rejected on one tiling is a new edit on another (the knobs proposer's retry rule reads "interacts")
    persistent: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool),
                                   metadata={"interacts": ("tile_mn", "cluster_mn")})
    raster: str = attrs.field(default="m", validator=one_of("m", "n"))
    swizzle: int = attrs.field(default=1, validator=_in(1, 2, 4, 8))
    epi_tile: tuple = attrs.field(default=(64, 32), converter=_EPI[0], validator=_EPI[1])
    # blackwell kernel only: CTAs per tcgen05 MMA (cta_group::1 | cta_group::2), accumulator stages in TMEM;
    # keyed only when set, so the candidates of campaigns recorded before they existed keep their keys
    cta_group: int = attrs.field(default=1, validator=_in(1, 2), metadata={"keyed": "when-set"})
    acc_stages: int = attrs.field(default=1, validator=_in(1, 2, 3, 4), metadata={"keyed": "when-set"})
    # naive kernel only: threads per block (x along n, y along m)
    block_mn: tuple = attrs.field(default=(16, 16), converter=_BLOCK[0], validator=_BLOCK[1])

    def __attrs_post_init__(self):
        f = attrs.fields(GemmKnobs)
        if self.kernel == "naive":
            for a in ("tile_mn", "cluster_mn", "stages", "persistent", "raster", "swizzle", "epi_tile", "cta_group",
                      "acc_stages"):
                if getattr(self, a) != getattr(f, a).default:
                    fail(self, getattr(f, a), getattr(self, a), f"{getattr(f, a).default!r}: it does not apply "
                          "to kernel='naive'")
            return
        if self.block_mn != f.block_mn.default:
            fail(self, f.block_mn, self.block_mn, f"{f.block_mn.default!r}: it only applies to kernel='naive'")
        if self.kernel != "blackwell":
            for a in ("cta_group", "acc_stages"):
                if getattr(self, a) != getattr(f, a).default:
                    fail(self, getattr(f, a), getattr(self, a), f"{getattr(f, a).default!r}: it only applies to "
                          "kernel='blackwell'")
        else:
            _blackwell_checks(self, f)
        if self.tile_mn[0] % self.epi_tile[0] or self.tile_mn[1] % self.epi_tile[1]:
            fail(self, f.epi_tile, self.epi_tile, f"a divisor of tile_mn {self.tile_mn}")
        if self.epi_tile[0] not in (64, self.tile_mn[0]):
            fail(self, f.epi_tile, self.epi_tile, f"a height of 64 (one sub-tile per consumer warpgroup) or "
                  f"tile_mn[0]={self.tile_mn[0]} (the sub-tile spans all consumer warpgroups)")
        if self.raster != "m" and self.swizzle == 1:
            fail(self, f.raster, self.raster, "'m' unless swizzle > 1 (the scheduler ignores raster order "
                  "without swizzle)")

    @property
    def consumer_warpgroups(self) -> int:
        if self.kernel == "blackwell":
            return 1  # four epilogue warps; the producer and MMA warps are one warp each
        return self.tile_mn[0] // 64

    @property
    def threads(self) -> int:
        if self.kernel == "naive":
            return self.block_mn[0] * self.block_mn[1]
        if self.kernel == "blackwell":
            return 192
        return 128 * (1 + self.consumer_warpgroups)

    def check_shape(self, m: int, n: int, k: int) -> None:
        f = attrs.fields(GemmKnobs)
        if self.kernel == "naive":
            bm, bn = self.block_mn
            if m % bm or n % bn:
                fail(self, f.block_mn, self.block_mn, f"a block that divides m={m}, n={n}")
            return
        cm = self.tile_mn[0] * self.cluster_mn[0]
        cn = self.tile_mn[1] * self.cluster_mn[1]
        if m % cm or n % cn:
            fail(self, f.tile_mn, self.tile_mn, f"tiles x cluster ({cm}, {cn}) that divide m={m}, n={n}")
        if k % self.tile_k:
            fail(self, f.tile_k, self.tile_k, f"a divisor of k={k}")


def _blackwell_checks(k: GemmKnobs, f) -> None:
    """The kernel's own shape rules (what it can be built for); budget limits are checked elsewhere."""
    if k.tile_mn[0] != 128:
        fail(k, f.tile_mn, k.tile_mn, "tile_mn[0] == 128 for kernel='blackwell' (one TMEM lane per row)")
    if k.epi_tile[0] != k.tile_mn[0]:
        fail(k, f.epi_tile, k.epi_tile, f"epi_tile[0] == tile_mn[0]={k.tile_mn[0]} for kernel='blackwell'")
    if k.cluster_mn[0] % k.cta_group:
        fail(k, f.cluster_mn, k.cluster_mn, f"a cluster M that pairs CTAs for cta_group={k.cta_group}")
    if k.acc_stages > 1 and not k.persistent:
        fail(k, f.acc_stages, k.acc_stages, "1 unless persistent=True (one tile per CTA has no next tile)")


ATTENTION_DIMS = ("batch", "seq", "heads", "head_dim")


@attrs.frozen
class AttentionShape:
    """One attention problem as the kernels see it (mosaic.families.attention's shape, defaults filled):
    ``seq`` queries and ``seq`` keys per (batch, head), ``kv_heads`` key/value heads shared by ``heads // kv_heads``
    query heads each, ``causal`` bottom-right aligned (with equal query and key lengths: key j <= query i)."""

    batch: int
    seq: int
    heads: int
    head_dim: int
    kv_heads: int
    causal: bool

    @classmethod
    def from_shape(cls, shape) -> AttentionShape:
        missing = [d for d in ATTENTION_DIMS if d not in shape]
        if missing:
            raise KeyError(", ".join(missing))
        heads = shape["heads"]
        return cls(batch=shape["batch"], seq=shape["seq"], heads=heads, head_dim=shape["head_dim"],
                   kv_heads=shape.get("kv_heads", heads), causal=bool(shape.get("causal", 0)))

    @property
    def group(self) -> int:
        """Query heads per key/value head (1: multi-head attention)."""
        return self.heads // self.kv_heads


def _multiple_of_8(lo: int, hi: int):
    def check(inst, attribute, value):
        if isinstance(value, bool) or not isinstance(value, int) or value % 8 or not lo <= value <= hi:
            fail(inst, attribute, value, f"a multiple of 8 in [{lo}, {hi}] (setmaxnreg)")

    return check


def _int_text(value):
    """``--knob stages=3`` gives the string '3': an integer's text becomes the integer (anything else is left for the
    validator to refuse)."""
    return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value


def _bool_text(value):
    """'true'/'false' (also 1/0, yes/no) from the command line become the bool."""
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    return value


BLOCK_N = tuple(range(64, 257, 16))
HEAD_DIMS = (64, 96, 128, 192, 256)


@attrs.frozen
class AttentionKnobs:
    """Knobs of the CuTe attention forward (``kernel``: ``hopper`` -- kernels/hopper_attention.py, the project's
    FlashAttention-3-style sm_90a kernel; ``naive`` -- kernels/naive_attention.py, one thread per query row).

    hopper: a CTA computes ``block_m`` query rows of one (batch, head) against ``block_n``-key blocks; warpgroup 0
    produces (TMA: Q once, K and V blocks into ``stages``-deep mbarrier rings, its registers cut to
    ``producer_regs`` by setmaxnreg), ``consumer_warpgroups`` warpgroups consume (``block_m //
    consumer_warpgroups`` rows each, 64 or 128; registers raised to ``consumer_regs``): S = Q K^T by wgmma,
    online softmax in registers, O += P V by a second wgmma whose A operand P is read from registers
    (``p_in='registers'``) or staged through shared memory (``p_in='smem'``). ``pingpong`` (two consumer
    warpgroups) takes turns at the tensor cores through named barriers, so one warpgroup's softmax runs under the
    other's GEMMs. ``causal_skip`` (causal problems): visit only the key blocks at or below the diagonal
    (False: visit every block and mask). ``persistent``: ``sm_count`` CTAs loop over the (m block, head, batch)
    tiles of a static scheduler instead of one CTA per tile.
    naive: ``rows_per_block`` threads per CTA, one query row each.
    """

    kernel: str = attrs.field(default="hopper", validator=one_of(*ATTENTION_KERNELS))
    block_m: int = attrs.field(default=128, converter=_int_text, validator=_in(64, 128, 192, 256))
    block_n: int = attrs.field(default=128, converter=_int_text, validator=_in(*BLOCK_N))
    stages: int = attrs.field(default=2, converter=_int_text, validator=_in(1, 2, 3, 4, 5, 6))
    consumer_warpgroups: int = attrs.field(default=2, converter=_int_text, validator=_in(1, 2, 3))
    producer_regs: int = attrs.field(default=24, converter=_int_text, validator=_multiple_of_8(24, 256),
                                     metadata={"interacts": ("consumer_warpgroups", "consumer_regs")})
    consumer_regs: int = attrs.field(default=240, converter=_int_text, validator=_multiple_of_8(24, 256),
                                     metadata={"interacts": ("consumer_warpgroups", "block_m", "block_n")})
    pingpong: bool = attrs.field(default=False, converter=_bool_text, validator=attrs.validators.instance_of(bool))
    p_in: str = attrs.field(default="registers", validator=one_of("registers", "smem"))
    causal_skip: bool = attrs.field(default=True, converter=_bool_text, validator=attrs.validators.instance_of(bool))
    persistent: bool = attrs.field(default=False, converter=_bool_text, validator=attrs.validators.instance_of(bool))
    # naive kernel only: query rows (threads) per CTA
    rows_per_block: int = attrs.field(default=128, converter=_int_text, validator=_in(32, 64, 128, 256))

    def __attrs_post_init__(self):
        f = attrs.fields(AttentionKnobs)
        if self.kernel == "naive":
            for a in ("block_m", "block_n", "stages", "consumer_warpgroups", "producer_regs", "consumer_regs",
                      "pingpong", "p_in", "persistent"):
                if getattr(self, a) != getattr(f, a).default:
                    fail(self, getattr(f, a), getattr(self, a), f"{getattr(f, a).default!r}: it does not apply "
                         "to kernel='naive'")
            return
        if self.rows_per_block != f.rows_per_block.default:
            fail(self, f.rows_per_block, self.rows_per_block,
                 f"{f.rows_per_block.default!r}: it only applies to kernel='naive'")
        if self.block_m % self.consumer_warpgroups or self.block_m // self.consumer_warpgroups not in (64, 128):
            fail(self, f.block_m, self.block_m, f"64 or 128 rows per consumer warpgroup "
                 f"(consumer_warpgroups={self.consumer_warpgroups})")
        if self.pingpong and self.consumer_warpgroups != 2:
            fail(self, f.pingpong, self.pingpong, "False unless consumer_warpgroups=2 (two warpgroups take turns)")

    @property
    def rows_per_warpgroup(self) -> int:
        return self.block_m // self.consumer_warpgroups

    @property
    def threads(self) -> int:
        if self.kernel == "naive":
            return self.rows_per_block
        return 128 * (1 + self.consumer_warpgroups)

    def check_shape(self, shape: AttentionShape) -> None:
        """The problem this kernel builds for: a head_dim the wgmma tiles and TMA boxes take, kv_heads dividing
        heads (any seq: partial blocks are masked, their loads zero-filled, their stores clipped)."""
        f = attrs.fields(AttentionKnobs)
        if shape.heads % shape.kv_heads:
            fail(self, f.kernel, self.kernel, f"a problem whose kv_heads={shape.kv_heads} divides "
                 f"heads={shape.heads}")
        if self.kernel == "hopper" and shape.head_dim not in HEAD_DIMS:
            fail(self, f.kernel, self.kernel, f"'naive' for head_dim={shape.head_dim} (hopper builds head_dim "
                 f"{', '.join(map(str, HEAD_DIMS))})")
        if self.kernel == "naive" and (shape.head_dim % 8 or shape.head_dim > 256):
            fail(self, f.kernel, self.kernel, f"a problem with head_dim a multiple of 8 up to 256, not "
                 f"{shape.head_dim}")


FAMILY_KNOBS = {"gemm": GemmKnobs, "attention": AttentionKnobs}


# -- knob dependencies (data for the ``knobs`` proposer's compound edits; mosaic.proposers.dependencies) ------

def mainloop_smem_bytes(k: GemmKnobs) -> int:
    """A lower bound of the shared memory a hopper build asks: its A and B stages (16-bit elements)."""
    return k.stages * (k.tile_mn[0] + k.tile_mn[1]) * k.tile_k * 2


def can_implement(knobs: GemmKnobs, spec, gpu) -> list:
    """The CPU predicate (no compile): the tiling divides the shape, and the stages of the tile fit shared memory
    and the cluster fits the GPU (mosaic.budget's rules); the lowering's own budget check stays the truth."""
    from mosaic import budget
    from mosaic.errors import Diagnostic, RecordError

    out = []
    if knobs.kernel == "naive":
        return out
    try:
        knobs.check_shape(spec.shape["m"], spec.shape["n"], spec.shape["k"])
    except (RecordError, KeyError) as exc:
        out.append(Diagnostic("CUTE-SHAPE", "tile_mn", "a tiling that divides the shape", knobs.tile_mn, str(exc)))
    fp = budget.Footprint(where="stages", smem_bytes=mainloop_smem_bytes(knobs),
                          cluster_size=knobs.cluster_mn[0] * knobs.cluster_mn[1])
    out += budget.diagnose(fp, gpu, ("smem-per-block", "cluster-size"))
    return out


def _wants_multicast(k: dict) -> bool:
    tile, cluster = tuple(k["tile_mn"]), tuple(k["cluster_mn"])
    return k.get("kernel", "hopper") == "hopper" and tile[1] >= 2 * tile[0] and cluster == (1, 1)


def _dependencies():
    from mosaic.proposers.dependencies import Dependencies, Dependency

    return Dependencies(check=can_implement, rules=(
        Dependency("smem-per-block", ("tile_mn", "tile_k", "stages"), {"stages": (4, 3, 2)},
                   "tile x stages share the shared memory: a bigger tile leaves room for fewer stages"),
        Dependency("CUTE-SHAPE", ("tile_mn", "cluster_mn"), {"cluster_mn": ((1, 1),)},
                   "tiles x cluster must divide the problem"),
        Dependency("cluster-size", ("cluster_mn",), {"cluster_mn": ((1, 1),)}, "the cluster must fit the GPU"),
        Dependency("CUTE-MULTICAST", ("tile_mn", "cluster_mn"), {"cluster_mn": ((2, 1),)},
                   "a tile twice as wide as tall loads twice as much B as A per stage: a 2x1 cluster multicasts B "
                   "to both CTAs (128x256 persistent 2x1 measured 172.74 us at 4096^3 on the H200, "
                   "tests/data/h200/cute-128x256-s4-persistent-c2x1-sw8.bundle; CUTLASS's rule CUTLASS-MULTICAST)",
                   needs=_wants_multicast),
    ))


GemmKnobs.DEPENDENCIES = _dependencies()


def attention_can_implement(knobs: AttentionKnobs, spec, gpu) -> list:
    """The CPU predicate (no compile) of an attention configuration: it builds for the problem (CUTE-SHAPE) and
    breaks no budget rule (mosaic_target_cute.budget.attention_diagnose: shared memory, threads, the setmaxnreg
    split, the consumers' accumulators); the lowering's own checks of the compiled kernel stay the truth."""
    from mosaic.errors import Diagnostic, RecordError

    from mosaic_target_cute import budget

    try:
        shape = AttentionShape.from_shape(spec.shape)
        knobs.check_shape(shape)
    except (RecordError, KeyError) as exc:
        return [Diagnostic("CUTE-SHAPE", "kernel", "a kernel that builds the problem", knobs.kernel, str(exc))]
    return budget.attention_diagnose(knobs, shape, gpu)


def _attention_dependencies():
    from mosaic.proposers.dependencies import Dependencies, Dependency

    return Dependencies(check=attention_can_implement, rules=(
        Dependency("smem-per-block", ("block_n", "stages", "p_in"), {"stages": (2, 1), "p_in": ("registers",)},
                   "Q + stages x (K + V) [+ P] share the shared memory: a wider key block leaves room for fewer "
                   "stages"),
        Dependency("CUTE-REG-SPLIT", ("consumer_warpgroups", "producer_regs", "consumer_regs"),
                   {"consumer_regs": (240, 232, 224, 160), "producer_regs": (24, 32)},
                   "128 x (producer + warpgroups x consumer) registers must fit the SM: three consumer warpgroups "
                   "get 160 each"),
        Dependency("CUTE-ACC-REGS", ("block_m", "consumer_warpgroups", "block_n", "consumer_regs"),
                   {"consumer_regs": (240, 256), "block_n": (128, 64)},
                   "a consumer holds S (rows x block_n) and O (rows x head_dim) fp32 over 128 threads: more rows or "
                   "a wider key block need more registers"),
    ))


AttentionKnobs.DEPENDENCIES = _attention_dependencies()
