"""The AMK micro-ops' declared memory footprints: which elements of each operand an op touches.

``ops.OpSpec.footprint`` returns one element interval of the flattened buffer per operand (inputs, then
outputs): exact for writes (every element in it is written, none outside), a superset for reads. A plain
row-split op declares its ``row_roles`` (:func:`rows_footprint`); the ops whose footprint is not that simple
declare one of the functions below as their ``footprint_fn`` (named after the op). The validator's rules, its
numpy screen and the oracle's shadow memory all read these declarations; the oracle's probe runs the op
itself to check that they are true (docs/amk-schedule.md "Op footprints").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

from mosaic_amk import rope_order

Interval = tuple[int, int]  # [lo, hi) of a buffer's flattened elements (row-major)
Shape = Sequence[int]


numel = prod  # elements of a shape (1 for rank 0)


def row_len(shape: Shape) -> int:
    """Elements in one row of axis 0."""
    return prod(shape) // shape[0]


_INT = frozenset((int,))


def _is_int(v: Any) -> bool:
    return type(v) is int




def rows_footprint(roles: Sequence[str], row_roles: Sequence[str], p: Mapping[str, Any],
                   shapes: Sequence[Shape]) -> list[Interval] | str:
    """Roles in ``row_roles``: rows [row_start, row_end) of axis 0; every other role: the whole buffer."""
    out = []
    rs = re = None
    if row_roles:
        rs, re = p.get("row_start"), p.get("row_end")
        if type(rs) is not int or type(re) is not int or not 0 <= rs < re:
            return f"row_start/row_end {rs!r}/{re!r} not integers with 0 <= start < end"
    for role, shape in zip(roles, shapes, strict=True):
        n = prod(shape)
        if role in row_roles:
            rows = shape[0]
            if re > rows:
                return f"rows [{rs}, {re}) beyond {role} ({rows} rows)"
            out.append((rs * n // rows, re * n // rows))
        else:
            out.append((0, n))
    return out


def _whole(shapes: Sequence[Shape]) -> list[Interval]:
    return [(0, prod(s)) for s in shapes]


def _ints(p: Mapping[str, Any], *names: str) -> list[int] | None:
    vals = list(map(p.get, names))
    return vals if set(map(type, vals)) <= _INT else None


def _kv_slot(p: Mapping[str, Any], cache: Shape) -> tuple[int, int] | str:
    """(first element, elements per slot) of the cache slot at ``position``."""
    got = _ints(p, "position", "page_tokens")
    if got is None or got[0] < 0 or got[1] < 1:
        return f"position/page_tokens {p.get('position')!r}/{p.get('page_tokens')!r} invalid"
    pos, pt = got
    if len(cache) != 3 or cache[1] != pt:
        return f"cache shape {list(cache)} is not [pages, {pt}, kv_dim]"
    if pos // pt >= cache[0]:
        return f"position {pos} beyond the cache ({cache[0] * pt} tokens)"
    return pos * cache[2], cache[2]


def kv_append(p, ins, outs):
    got = _kv_slot(p, outs[0])
    if isinstance(got, str):
        return got
    start, d = got
    return [*_whole(ins), (start, start + d)]


def argmax(p, ins, outs):
    return [*_whole(ins), (0, 1)]


def _visible(p: Mapping[str, Any]) -> tuple[int, int] | str:
    """Cached tokens [first, position] an attention at ``position`` reads (``window`` > 0: the last
    ``window`` of them)."""
    got = _ints(p, "position", "window")
    if got is None or got[0] < 0 or got[1] < 0:
        return "position/window must be integers >= 0"
    pos, window = got
    return (max(0, pos - window + 1) if window > 0 else 0), pos + 1


def _attn_heads(p, q: Shape, y: Shape, caches: Sequence[Shape], aligned: bool = False
                ) -> tuple[int, int, int] | str:
    got = _ints(p, "head_dim", "row_start", "row_end", "num_heads", "num_kv_heads", "position")
    if got is None:
        return "attention parameters must be integers"
    hd, rs, re, nh, nkv, pos = got
    if hd < 1 or not 0 <= rs < re or nkv < 1 or nh % nkv or (aligned and (rs % hd or re % hd)):
        return "attention parameters out of range"
    h0, h1 = rs // hd, re // hd
    if h1 <= h0:
        return f"rows [{rs}, {re}) hold no whole head of {hd}"
    if h1 * hd > min(numel(q), numel(y)) or h1 > nh:
        return f"heads [{h0}, {h1}) beyond q/y"
    for cache in caches:
        if len(cache) != 3:
            return f"cache shape {list(cache)} is not [pages, page_tokens, kv_dim]"
        if pos >= cache[0] * cache[1] or cache[2] != nkv * hd:
            return f"cache {list(cache)} does not hold position {pos} of {nkv} kv heads"
    return h0, h1, hd


def attention(p, ins, outs):
    heads = _attn_heads(p, ins[0], outs[0], ins[1:3])
    if isinstance(heads, str):
        return heads
    if isinstance(_attn_block(p), str):
        return _attn_block(p)
    h0, h1, hd = heads
    vis = _visible(p)
    if isinstance(vis, str):
        return vis
    first, end = vis
    d = ins[1][2]
    return [(h0 * hd, h1 * hd), (first * d, end * d), (first * d, end * d), (h0 * hd, h1 * hd)]


def split_range(first: int, end: int, split: int, num_splits: int) -> tuple[int, int]:
    """Tokens [lo, hi) of chunk ``split`` of ``num_splits`` over [first, end) (ceil-sized chunks, the
    last ones possibly empty: lo == hi)."""
    size = -(-(end - first) // num_splits)
    lo = min(end, first + split * size)
    return lo, min(end, lo + size)


def attention_partial(p, ins, outs):
    heads = _attn_heads(p, ins[0], ins[0], ins[1:3], aligned=True)
    if isinstance(heads, str):
        return heads
    if isinstance(_attn_block(p), str):
        return _attn_block(p)
    h0, h1, hd = heads
    got = _ints(p, "split", "num_splits", "num_heads")
    if got is None or not 0 <= got[0] < got[1]:
        return "split/num_splits must be integers with 0 <= split < num_splits"
    split, ns, nh = got
    part, ml = outs
    qd = numel(ins[0])
    if tuple(part) != (ns, qd) or tuple(ml) != (ns, nh, 2):
        return f"partial buffers {list(part)}/{list(ml)} are not [{ns}, {qd}] and [{ns}, {nh}, 2]"
    vis = _visible(p)
    if isinstance(vis, str):
        return vis
    lo, hi = split_range(*vis, split, ns)
    d = ins[1][2]
    return [(h0 * hd, h1 * hd), (lo * d, hi * d), (lo * d, hi * d),
            (split * qd + h0 * hd, split * qd + h1 * hd), ((split * nh + h0) * 2, (split * nh + h1) * 2)]


def attention_combine(p, ins, outs):
    got = _ints(p, "row_start", "row_end", "head_dim", "num_heads", "num_splits")
    if got is None:
        return "attention_combine parameters must be integers"
    rs, re, hd, nh, ns = got
    if hd < 1 or ns < 1 or not 0 <= rs < re or rs % hd or re % hd or re // hd > nh:
        return "attention_combine parameters out of range (rows must hold whole heads)"
    part, ml, y = ins[0], ins[1], outs[0]
    qd = nh * hd
    if tuple(part) != (ns, qd) or tuple(ml) != (ns, nh, 2) or re > y[0]:
        return f"partial buffers {list(part)}/{list(ml)} are not [{ns}, {qd}] and [{ns}, {nh}, 2]"
    h0, h1 = rs // hd, re // hd
    # reads the heads' columns of every split: the hull from split 0 to the last (a superset)
    return [(rs, (ns - 1) * qd + re), (h0 * 2, ((ns - 1) * nh + h1) * 2), (rs, re)]


def argmax_partial(p, ins, outs):
    got = _ints(p, "row_start", "row_end", "part")
    if got is None:
        return "row_start/row_end/part must be integers"
    rs, re, k = got
    if not 0 <= rs < re or re > numel(ins[0]):
        return f"rows [{rs}, {re}) outside the logits ({numel(ins[0])})"
    if not 0 <= k < min(numel(outs[0]), numel(outs[1])):
        return f"part {k} outside the partial buffers"
    return [(rs, re), (k, k + 1), (k, k + 1)]


def gemv_rope(p, ins, outs):
    from mosaic_amk.ops import OP_SPECS  # the op table declares these functions: read at call time

    spec = OP_SPECS["gemv_rope"]
    fp = rows_footprint(spec.input_roles(p) + spec.outputs, ("w", "b", "y"), p, (*ins, *outs))
    if isinstance(fp, str):
        return fp
    return _head_aligned(p, fp)


def _head_aligned(p, fp):
    """fp when the rows hold whole RoPE pairs: whole heads, or (``rope_block``) whole blocks of the blocked order."""
    hd, blk = p.get("head_dim"), p.get("rope_block", 0)
    if blk not in (0, rope_order.BLOCK) or type(blk) is not int:
        return f"rope_block {blk!r} is not 0 or {rope_order.BLOCK}"
    if not _is_int(hd) or hd < 2 or hd % 2 or (blk and hd % blk):
        return f"head_dim {hd!r} is not even{f' and a multiple of {blk}' if blk else ''}"
    unit = blk or hd
    if p["row_start"] % unit or p["row_end"] % unit:
        what = f"blocks of {blk}" if blk else f"heads of {hd}"
        return f"rows [{p['row_start']}, {p['row_end']}) do not hold whole {what}"
    return fp


def _attn_block(p) -> int | str:
    """The attention's ``rope_block`` (0: q and the K cache in the standard order), or a problem."""
    blk, hd = p.get("rope_block", 0), p.get("head_dim")
    if type(blk) is not int or blk not in (0, rope_order.BLOCK) or (blk and (not _is_int(hd) or hd % blk)):
        return f"rope_block {blk!r} is not 0 or {rope_order.BLOCK} (with head_dim a multiple of it)"
    return blk


def gemv_rope_append(p, ins, outs):
    from mosaic_amk.ops import OP_SPECS

    spec = OP_SPECS["gemv_rope_append"]
    roles = spec.input_roles(p)
    fp = rows_footprint(roles, ("w", "b"), p, ins)
    if isinstance(fp, str):
        return fp
    if p.get("rope") and isinstance(_head_aligned(p, fp), str):
        return _head_aligned(p, fp)
    got = _kv_slot(p, outs[0])
    if isinstance(got, str):
        return got
    start, d = got
    if p["row_end"] > d:
        return f"rows [{p['row_start']}, {p['row_end']}) beyond the slot ({d})"
    return [*fp, (start + p["row_start"], start + p["row_end"])]
