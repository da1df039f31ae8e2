"""flash-attn-4's CuTe DSL Hopper forward (``flash_attn.cute.flash_fwd_sm90.FlashAttentionForwardSm90``, Tri Dao et
al., ``pip install flash-attn-4``) behind Mosaicist's kernel-file contract (docs/kernel-files.md). This file is an
adapter, not a kernel: its entry builds flash-attn-4's own sm_90 forward object from the installed package and
calls it; no flash-attn code is copied here.

    mosaic capture --file examples/kernels/cute/fa4_attention.py --lang cute --family attention \\
        --shape batch=4,seq=4096,heads=32,head_dim=128 --dtype bf16 --lower-only -o fa4.bundle

The kernel is what ``flash_attn.cute.flash_attn_func(q, k, v, causal=)`` builds on sm_90 for a dense bf16/f16
forward (``interface._flash_attn_fwd``): no varlen, paging, window, softcap, score/mask mod, sink or split-KV;
the softmax scale 1/sqrt(head_dim) (the family's and flash-attn's default); no LSE output (the family checks
``o`` only; ``flash_attn_func`` writes none either unless a gradient or ``return_lse`` asks for it).

* The operands cross in the attention family's layouts, ``q``/``o`` (batch, heads, seq, head_dim) and ``k``/``v``
  (batch, kv_heads, seq, head_dim), row-major. flash-attn takes (batch, seq, heads, head_dim) with head_dim
  contiguous: the entry hands it the same memory with the seq and heads modes swapped (a trace-time relabel of
  the layout, no copy; its TMA descriptors take the strides as they are), and with dynamic extents and strides,
  as ``flash_attn_func`` compiles it (``as_flash_attn_sees``).
* Grouped-query heads: ``qhead_per_kvhead = heads // kv_heads`` from the tensors' shapes, and ``pack_gqa``
  (the query heads of one key/value head packed into one M tile) as flash-attn chooses it (on when
  ``qhead_per_kvhead > 1``) unless the knob says otherwise.
* ``causal`` is the problem's (``--shape ...,causal=1``: bottom-right aligned, as flash-attn masks it): the knob of
  that name takes the shape's value (``mosaic_target_cute.kernel_file``: a knob named after one of the family's
  optional shape flags is that flag), and a ``--knob causal=`` that contradicts the shape is refused. Causal
  problems use flash-attn's LPT tile scheduler (its own choice for causal on sm_90), others its single-tile one.

The knobs are flash-attn's own sm_90 forward tuning parameters, each defaulting to flash-attn's choice
(``0`` / ``"auto"``: ``interface._tile_size_fwd_sm90(head_dim, head_dim_v, causal, local)``, the table
``_flash_attn_fwd`` uses; for head_dim 128: 128 x 128 tiles, P from registers, intra-warpgroup overlap):
``tile_m`` (query rows per CTA: 64 per consumer warp group, 1-3 of them), ``tile_n`` (keys per block),
``mma_pv_is_rs`` (P V with P from registers, else P staged in shared memory), ``intra_wg_overlap`` (the next
block's Q K^T issued before this block's softmax), ``num_stages`` (the K/V ring depth; flash-attn launches 2),
``pack_gqa``. A value flash-attn does not build is refused by flash-attn's own checks (``_validate_head_dims``
and the kernel's asserts) or, for values it would not even try, by the knob class: one error line either way.
"""

import dataclasses
import math

import cutlass
import cutlass.cute as cute
from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90
from flash_attn.cute.interface import _tile_size_fwd_sm90, _validate_head_dims
from quack import layout_utils

ENTRY = "attention"
INPUTS = {"q": ("batch", "heads", "seq", "head_dim"), "k": ("batch", "kv_heads", "seq", "head_dim"),
          "v": ("batch", "kv_heads", "seq", "head_dim")}
OUTPUTS = {"o": ("batch", "heads", "seq", "head_dim")}
# flash-attn's TMA rows are 16-byte aligned: head_dim a multiple of 8 16-bit elements (its _validate_head_dims)
MULTIPLE_OF = {"head_dim": 8}

TRISTATE = {"auto": None, "true": True, "false": False}
TILE_M = (64, 128, 192)  # one to three consumer warp groups of 64 rows (FlashAttentionForwardSm90: num_wg_mma 1-3)


@dataclasses.dataclass(frozen=True)
class Knobs:
    tile_m: int = 0  # query rows per CTA: 64, 128, 192; 0: flash-attn's choice for head_dim
    tile_n: int = 0  # keys per K/V block: a multiple of 16 up to 256 (one wgmma N); 0: flash-attn's choice
    mma_pv_is_rs: str = "auto"  # true: P V with P in registers (RS wgmma), false: P through shared memory (SS)
    intra_wg_overlap: str = "auto"  # true: the next block's S = Q K^T issued before this block's softmax
    num_stages: int = 2  # K/V shared-memory ring depth (flash_attn_func's sm_90 launch uses 2)
    pack_gqa: str = "auto"  # pack the query heads sharing a kv head into one M tile; auto: on when GQA
    causal: bool = False  # the problem's causal flag (from --shape ...,causal=1; see the module docstring)

    def __post_init__(self):
        if self.tile_m not in (0, *TILE_M):
            raise ValueError(f"tile_m={self.tile_m}: one of {', '.join(map(str, TILE_M))} (0: flash-attn's choice)")
        if self.tile_n < 0 or self.tile_n % 16 or self.tile_n > 256:
            raise ValueError(f"tile_n={self.tile_n}: a multiple of 16, at most 256 (0: flash-attn's choice)")
        for name in ("mma_pv_is_rs", "intra_wg_overlap", "pack_gqa"):
            if getattr(self, name) not in TRISTATE:
                raise ValueError(f"{name}={getattr(self, name)!r}: auto, true or false")
        if self.num_stages < 1:
            raise ValueError(f"num_stages={self.num_stages}: at least 1")


def fa4_config(knobs: Knobs, head_dim: int, qhead_per_kvhead: int) -> dict:
    """flash-attn's sm_90 forward choices for this head_dim (``_tile_size_fwd_sm90``, what ``_flash_attn_fwd``
    uses without overrides), with the knobs that are set replacing its fields."""
    base = _tile_size_fwd_sm90(head_dim, head_dim, knobs.causal, False)

    def pick(name, default):
        value = TRISTATE[getattr(knobs, name)]
        return default if value is None else value

    return {"tile_m": knobs.tile_m or base.m_block_size, "tile_n": knobs.tile_n or base.n_block_size,
            "mma_pv_is_rs": pick("mma_pv_is_rs", base.mma_pv_is_rs),
            "intra_wg_overlap": pick("intra_wg_overlap", base.intra_wg_overlap),
            "pack_gqa": pick("pack_gqa", qhead_per_kvhead > 1)}


def fa4_forward(knobs: Knobs, dtype, head_dim: int, qhead_per_kvhead: int) -> FlashAttentionForwardSm90:
    """flash-attn's sm_90 forward object for these knobs, built as ``_flash_attn_fwd`` builds it on sm_90."""
    arch = cutlass.base_dsl.BaseDSL._get_dsl().get_arch_enum()  # the compile target (--gpu-arch)
    if arch.major != 9:
        raise ValueError(f"this adapter builds flash-attn's sm_90 forward; the compile target is {arch}")
    _validate_head_dims(head_dim, head_dim, 9, 16 // (dtype.width // 8))
    cfg = fa4_config(knobs, head_dim, qhead_per_kvhead)
    return FlashAttentionForwardSm90(dtype, head_dim, head_dim, qhead_per_kvhead, is_causal=knobs.causal,
                                     is_local=False, pack_gqa=cfg["pack_gqa"], tile_m=cfg["tile_m"],
                                     tile_n=cfg["tile_n"], num_stages=knobs.num_stages, num_threads=384,
                                     Q_in_regs=False, intra_wg_overlap=cfg["intra_wg_overlap"],
                                     mma_pv_is_rs=cfg["mma_pv_is_rs"])


def as_flash_attn_sees(t: cute.Tensor) -> cute.Tensor:
    """The family's (batch, heads, seq, head_dim) tensor as flash-attn's (batch, seq, heads, head_dim) over the same
    memory (the seq and heads modes swapped), with the layout ``flash_attn_func`` hands its compile: every extent
    a dynamic Int32 and every stride but head_dim's a dynamic Int64 (``to_cute_tensor``: ``from_dlpack(t)
    .mark_layout_dynamic(leading_dim=3)``, ``(?,?,?,?):(?{i64},?{i64},?{i64},1)``). The values are this problem's;
    the kernel receives them as parameters, as flash-attn's does, so the device code is the kernel flash-attn
    compiles for any shape (its causal scheduler does not even trace with static extents)."""
    t = layout_utils.select(t, [0, 2, 1, 3])
    shape = tuple(cutlass.Int32(x) for x in t.shape)
    stride = (*(cutlass.Int64(x) for x in t.stride[:3]), 1)
    return cute.make_tensor(t.iterator, cute.make_layout(shape, stride=stride))


@cute.jit
def attention(q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor, knobs: cutlass.Constexpr, stream):
    head_dim = cute.size(q, mode=[3])
    qhead_per_kvhead = cute.size(q, mode=[1]) // cute.size(k, mode=[1])
    op = fa4_forward(knobs, q.element_type, head_dim, qhead_per_kvhead)
    mq, mk, mv, mo = [as_flash_attn_sees(t) for t in (q, k, v, o)]
    # FlashAttentionForwardSm90.__call__(mQ, mK, mV, mO, mLSE, softmax_scale, cu_seqlens_q, cu_seqlens_k,
    # seqused_q, seqused_k, page_table, window_size_left, window_size_right, learnable_sink, blocksparse_tensors,
    # aux_data, cu_total_m_blocks, cu_total_splits_m_blocks, stream): the dense forward, no LSE
    op(mq, mk, mv, mo, None, cutlass.Float32(1.0 / math.sqrt(head_dim)), stream=stream)
