"""Knob classes of the Pallas families, validated at construction (a bad value raises RecordError).

``gemm`` covers two kernels, chosen by the ``kernel`` knob:

* ``jax-hopper`` — jax's ``hopper_matmul_mgpu`` (warp-specialised: one TMA warpgroup and two wgmma
  warpgroups, persistent over ``sm_count`` CTAs). Its knobs are exactly jax's ``TuningConfig``.
* ``jax-blackwell`` — jax's ``blackwell_matmul_mgpu`` (tcgen05 MMA into TMEM: sm_100a only). Its knobs are
  jax's ``TuningConfig``: tile_m/n/k, max_concurrent_steps, epi_tile_n (its ``epilogue_tile_n``),
  grid_minor_dim, grid_tile_width; ``cluster_dimension="m"`` is its ``collective`` (2-CTA MMA, a cluster of 2:
  the cluster tile is 2*tile_m x 2*tile_n).
* ``pipelined`` — the project's own kernel (``kernels/pipelined_matmul.py``): one warpgroup, no warp
  specialisation, optional persistence, ``delay_release``; it reaches configurations jax's kernel cannot
  (a CTA tile of one warpgroup's tile, a non-persistent grid).

Knobs that do not apply to the chosen kernel must stay at their defaults, so a configuration never
carries a setting that silently does nothing.
"""

from __future__ import annotations

import attrs
from mosaic.fields import fail, one_of

GEMM_KERNELS = ("jax-hopper", "pipelined", "jax-blackwell")
DIMS = ("m", "n")


def _pow2_in(lo: int, hi: int):
    def check(inst, attribute, value):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi or value & (value - 1):
            fail(inst, attribute, value, f"a power of two in [{lo}, {hi}]")

    return check


def _int_in(lo: int, hi: int):
    def check(inst, attribute, value):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            fail(inst, attribute, value, f"an integer in [{lo}, {hi}]")

    return check


def _bool(inst, attribute, value):
    if not isinstance(value, bool):
        fail(inst, attribute, value, "true or false")


# Knob values arrive as strings from the command line (``mosaic capture --knob tile_m=128 --knob causal=true``):
# each knob's converter turns the strings of its type into values and leaves anything else to the validator,
# whose message then names the field and what it takes.

def _int(value):
    """``"128"`` -> 128 (digits only; ``"1.5"`` or ``"x"`` stay strings and fail the validator)."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def _optional_int(value):
    """``"none"`` (any case) -> None, digits -> int."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    return _int(value)


def _optional_str(value):
    """``"none"`` (any case) -> None."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    return value


def _flag(value):
    """true/false/1/0 (any case) -> bool; anything else is left for the validator."""
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
        return value.strip().lower() in ("true", "1")
    return value


@attrs.frozen
class GemmKnobs:
    kernel: str = attrs.field(default="jax-hopper", validator=one_of(*GEMM_KERNELS))
    tile_m: int = attrs.field(default=128, converter=_int, validator=_pow2_in(64, 256))
    tile_n: int = attrs.field(default=128, converter=_int, validator=_pow2_in(8, 256))
    tile_k: int = attrs.field(default=64, converter=_int, validator=_pow2_in(16, 256))
    max_concurrent_steps: int = attrs.field(default=4, converter=_int, validator=_int_in(1, 8))
    epi_tile_m: int | None = attrs.field(default=64, converter=_optional_int)
    epi_tile_n: int | None = attrs.field(default=64, converter=_optional_int)
    grid_minor_dim: str = attrs.field(default="n", validator=one_of(*DIMS))
    grid_tile_width: int = attrs.field(default=1, converter=_int, validator=_int_in(1, 64))
    # jax-hopper only
    wg_dimension: str = attrs.field(default="n", validator=one_of(*DIMS))
    cluster_dimension: str | None = attrs.field(default=None, converter=_optional_str)
    # pipelined only
    persistent: bool = attrs.field(default=True, converter=_flag, validator=_bool)
    delay_release: int = attrs.field(default=0, converter=_int, validator=_int_in(0, 1))

    @epi_tile_m.validator
    @epi_tile_n.validator
    def _epi(self, attribute, value):
        if value is not None:
            _pow2_in(8, 256)(self, attribute, value)

    @cluster_dimension.validator
    def _cluster(self, attribute, value):
        if value not in (None, "m", "n"):
            fail(self, attribute, value, "None, 'm' or 'n'")

    def __attrs_post_init__(self):
        for name, tile in (("epi_tile_m", self.tile_m), ("epi_tile_n", self.tile_n)):
            epi = getattr(self, name)
            if epi is not None and tile % epi:
                fail(self, getattr(attrs.fields(GemmKnobs), name), epi, f"a divisor of the tile ({tile})")
        own = {"persistent": True, "delay_release": 0}
        jax_only = {"wg_dimension": "n", "cluster_dimension": None}
        foreign = {"jax-hopper": own, "pipelined": jax_only,
                   "jax-blackwell": {**own, "wg_dimension": "n", "epi_tile_m": 64}}[self.kernel]
        for name, default in foreign.items():
            if getattr(self, name) != default:
                fail(self, getattr(attrs.fields(GemmKnobs), name), getattr(self, name),
                      f"{default!r}: it does not apply to kernel={self.kernel!r}")
        if self.kernel == "jax-blackwell" and self.cluster_dimension == "n":
            fail(self, attrs.fields(GemmKnobs).cluster_dimension, self.cluster_dimension,
                 "None or 'm' (jax-blackwell's collective 2-CTA MMA pairs CTAs along M)")
        if self.kernel == "pipelined" and self.max_concurrent_steps <= self.delay_release:
            fail(self, attrs.fields(GemmKnobs).max_concurrent_steps, self.max_concurrent_steps,
                  f"> delay_release ({self.delay_release})")

    def cta_tile(self) -> tuple[int, int]:
        """The (M, N) tile one CTA computes (jax's kernel runs two compute warpgroups side by side)."""
        if self.kernel in ("pipelined", "jax-blackwell"):
            return self.tile_m, self.tile_n
        tm = self.tile_m * (2 if self.wg_dimension == "m" else 1)
        tn = self.tile_n * (2 if self.wg_dimension == "n" else 1)
        return tm, tn

    def cluster_size(self) -> int:
        return 1 if self.cluster_dimension is None else 2

    def cluster_tile(self) -> tuple[int, int]:
        tm, tn = self.cta_tile()
        if self.kernel == "jax-blackwell":  # collective: the CTA pair covers twice the tile in M and in N
            return (tm * 2, tn * 2) if self.cluster_dimension == "m" else (tm, tn)
        return (tm * (2 if self.cluster_dimension == "m" else 1), tn * (2 if self.cluster_dimension == "n" else 1))

    def check_shape(self, m: int, n: int, k: int) -> None:
        """Raise RecordError naming the dimension that the tiling does not divide."""
        cm, cn = self.cluster_tile()
        for dim, size, tile in (("m", m, cm), ("n", n, cn), ("k", k, self.tile_k)):
            if size % tile:
                fail(self, attrs.fields(GemmKnobs).tile_k if dim == "k" else attrs.fields(GemmKnobs).tile_m,
                      tile, f"a tile that divides {dim}={size} ({dim}={size} must be divisible by {tile})")


ATTENTION_KERNELS = ("project", "jax")
P_OPERANDS = ("registers", "smem")
PV_ACCUMULATORS = ("carried", "fresh")


@attrs.frozen
class AttentionKnobs:
    """The attention forward's knobs. ``kernel`` picks the kernel:

    * ``project`` -- the project's own (``kernels/attention.py``): bf16 and f16, lowers without jax's CUDA
      plugin, runs in jax's GPU interpreter (``p_operand=smem, pv_accumulator=fresh``). Adds ``compute_wgs``
      (1 or 2 compute warpgroups per CTA, each ``block_q`` rows; ``use_schedule_barrier`` needs 2),
      ``p_operand`` (P into the second wgmma from registers or staged in shared memory), ``pv_accumulator``
      (``carried``: acc is the wgmma's accumulator; ``fresh``: P V into a zeroed one, added in registers)
      and ``approx_math`` (approximate ex2 and reciprocal).
    * ``jax`` -- jax's ``attention_mgpu.TuningConfig`` (forward only; f16 only in jax 0.11.2).
    * None (the default) -- the dtype's default: ``project`` for bf16, ``jax`` for f16 (backend.py).

    Knobs that do not apply to the chosen kernel must stay at their defaults.
    """

    kernel: str | None = attrs.field(default=None, converter=_optional_str)
    block_q: int = attrs.field(default=64, converter=_int, validator=_pow2_in(64, 256))
    block_kv: int = attrs.field(default=64, converter=_int, validator=_pow2_in(64, 256))
    max_concurrent_steps: int = attrs.field(default=2, converter=_int, validator=_int_in(2, 8))
    use_schedule_barrier: bool = attrs.field(default=True, converter=_flag, validator=_bool)
    #: must agree with the problem (``--shape ...,causal=1``): causality is not a tuning choice
    causal: bool = attrs.field(default=False, converter=_flag, validator=_bool)
    # project only
    compute_wgs: int = attrs.field(default=2, converter=_int, validator=_int_in(1, 2))
    p_operand: str = attrs.field(default="registers", validator=one_of(*P_OPERANDS))
    pv_accumulator: str = attrs.field(default="carried", validator=one_of(*PV_ACCUMULATORS))
    approx_math: bool = attrs.field(default=True, converter=_flag, validator=_bool)

    @kernel.validator
    def _kernel(self, attribute, value):
        if value is not None and value not in ATTENTION_KERNELS:
            fail(self, attribute, value, "None or one of " + ", ".join(ATTENTION_KERNELS))

    def __attrs_post_init__(self):
        own = {"compute_wgs": 2, "p_operand": "registers", "pv_accumulator": "carried", "approx_math": True}
        if self.kernel is None:  # checked once the dtype has picked the kernel (:meth:`resolved`)
            return
        field = attrs.fields(AttentionKnobs)
        if self.kernel == "jax":
            for name, default in own.items():
                if getattr(self, name) != default:
                    fail(self, getattr(field, name), getattr(self, name),
                         f"{default!r}: it does not apply to kernel='jax'")
        elif self.compute_wgs == 1 and not self.use_schedule_barrier:
            fail(self, field.use_schedule_barrier, False,
                 "True: it does not apply to compute_wgs=1 (the turns are between two compute warpgroups)")

    def resolved(self, dtype: str) -> AttentionKnobs:
        """These knobs with ``kernel`` set (None becomes the dtype's default kernel), checked against it: a
        knob of the other kernel raises RecordError."""
        if self.kernel is not None:
            return self
        return attrs.evolve(self, kernel=DEFAULT_ATTENTION_KERNEL.get(dtype, "project"))


#: the kernel a dtype gets when ``kernel`` is not set: jax's kernel keeps f16 (its H200-checked path), bf16
#: (which jax 0.11.2's kernel cannot lower) gets the project's
DEFAULT_ATTENTION_KERNEL = {"bf16": "project", "f16": "jax"}


FAMILY_KNOBS = {"gemm": GemmKnobs, "attention": AttentionKnobs}


# -- knob dependencies (data for the ``knobs`` proposer's compound edits; mosaic.proposers.dependencies) ------

def pipeline_smem_bytes(k: GemmKnobs) -> int:
    """A lower bound of the shared memory: ``max_concurrent_steps`` A and B blocks of the CTA tile (16-bit)."""
    tm, tn = k.cta_tile()
    return k.max_concurrent_steps * (tm + tn) * k.tile_k * 2


def can_implement(knobs: GemmKnobs, spec, gpu) -> list:
    """The CPU predicate (no lowering): the tiling divides the shape and the steps of the tile fit shared
    memory (mosaic.budget's rule)."""
    from mosaic import budget
    from mosaic.errors import Diagnostic, RecordError

    out = []
    try:
        knobs.check_shape(spec.shape["m"], spec.shape["n"], spec.shape["k"])
    except (RecordError, KeyError) as exc:
        out.append(Diagnostic("PALLAS-SHAPE", "tile", "a tiling that divides the shape", knobs.cta_tile(), str(exc)))
    out += budget.diagnose(budget.Footprint(where="steps", smem_bytes=pipeline_smem_bytes(knobs)), gpu,
                           ("smem-per-block",))
    return out


def _dependencies():
    from mosaic.proposers.dependencies import Dependencies, Dependency

    return Dependencies(check=can_implement, rules=(
        Dependency("smem-per-block", ("tile_m", "tile_n", "tile_k", "max_concurrent_steps"),
                   {"max_concurrent_steps": (4, 3, 2)},
                   "tile x steps share the shared memory: a bigger tile leaves room for fewer steps"),
    ))


GemmKnobs.DEPENDENCIES = _dependencies()
