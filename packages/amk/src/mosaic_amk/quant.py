"""Weight-only quantized tensors and the one arithmetic every AMK VM runs on them.

Three formats, each a 2-D weight ``[rows, cols]`` cut along its columns into blocks of ``BLOCK`` (32) elements:

- ``int8``: symmetric int8 codes, one float32 scale per output row (weight-only W8A16): ``w = scale[r] * q``.
- ``q8_0``: GGUF's Q8_0 blocks, read natively: per block a float16 scale ``d`` and 32 int8 codes: ``w = d * q``.
- ``q4_1``: GGUF's Q4_1 blocks, read natively: per block float16 ``d`` and ``m`` and 32 4-bit codes (16 bytes; byte
  ``j`` holds element ``j`` in its low nibble and element ``j + 16`` in its high nibble, GGUF's order): ``w = d * q + m``.

The GEMV folds the dequantisation into the dot product (the weights are never expanded in memory). Its arithmetic is
defined exactly, in float32, so the ReferenceVM (:func:`matvec`, numpy) and the CUDA micro-kernel
(``kernels/gemv_quant.cuh``) give the same bits:

1. element ``e`` of block ``b`` dequantised: q8_0 ``d * q`` and int8 ``q`` (both exact in float32), q4_1
   ``d * q + m`` (``d * q`` is exact, so one rounding: the same value GGUF's and transformers' dequantiser computes);
2. its product with x: ``p = w * x[32 b + e]``, rounded to float32 (no fused multiply-add);
3. the block's sum: a pairwise tree over the 32 products in element order (``p0 + p1``, ``p2 + p3``, ..., then those
   pairwise, five levels);
4. lane ``l`` of 32 adds the block sums of blocks ``l, l + 32, l + 64, ...`` in that order, from ``+0.0``;
5. the 32 lane sums are reduced by the xor butterfly (offsets 16, 8, 4, 2, 1: ``v[l] + v[l ^ o]``), the CUDA warp's
   ``warp_sum``; lane 0's value is the row's dot product;
6. ``int8`` only: the row's result is ``scale[r] * dot`` (one rounding).

Bias and residual follow as in the float path (ops.op_gemv). A quantized embedding row is dequantised by step 1
(``int8``: times its row's scale).

On the device a quantized weight is one buffer of planes, each 16-byte aligned: the codes (row-major: ``cols`` bytes
per row for int8/q8_0, ``cols / 2`` for q4_1), then the block scales (float16, ``[rows, cols / 32]``; int8: float32
``[rows]``), then (q4_1) the block minima (float16). The values are the file's own, only regrouped (:meth:`device_bytes`).
"""

from __future__ import annotations

import attrs
import numpy as np
from mosaic.errors import BadInput

BLOCK = 32
FORMATS = ("int8", "q8_0", "q4_1")
F32 = np.float32


def _align16(n: int) -> int:
    return -(-n // 16) * 16


@attrs.frozen(eq=False)
class QuantizedTensor:
    """A 2-D weight in one of :data:`FORMATS`. ``codes``: int8 ``[rows, cols]`` (int8, q8_0) or uint8 ``[rows,
    cols / 2]`` (q4_1, GGUF's nibble order); ``scales``: float32 ``[rows]`` (int8) or float16 ``[rows, cols / 32]``;
    ``mins``: float16 ``[rows, cols / 32]`` (q4_1 only)."""

    format: str
    shape: tuple
    codes: np.ndarray = attrs.field(repr=False)
    scales: np.ndarray = attrs.field(repr=False)
    mins: np.ndarray | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        problems = layout_problems(self)
        if problems:
            raise BadInput(f"quantized tensor ({self.format}, shape {list(self.shape)}): {problems[0]}")

    # numpy-array-like surface used by ModelSpec, the lowering and the ReferenceVM
    @property
    def dtype(self) -> str:
        return self.format

    @property
    def size(self) -> int:
        return int(self.shape[0]) * int(self.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the stored format (codes + scales + mins), without device padding."""
        return int(self.codes.nbytes + self.scales.nbytes + (self.mins.nbytes if self.mins is not None else 0))

    def take_rows(self, idx: np.ndarray) -> QuantizedTensor:
        """The tensor with its rows reordered (``rope_order.resolve``): whole rows move with their blocks."""
        idx = np.asarray(idx)
        return QuantizedTensor(self.format, (len(idx), self.shape[1]), np.ascontiguousarray(self.codes[idx]),
                               np.ascontiguousarray(self.scales[idx]),
                               None if self.mins is None else np.ascontiguousarray(self.mins[idx]))

    def int_codes(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        """The integer codes of rows [r0, r1) as float32 ``[n, cols]`` in element order (q4_1 unpacked)."""
        r1 = self.shape[0] if r1 is None else r1
        c = self.codes[r0:r1]
        if self.format != "q4_1":
            return c.astype(F32)
        n, nb = c.shape[0], self.shape[1] // BLOCK
        b = c.reshape(n, nb, BLOCK // 2)
        return np.concatenate([b & 0x0F, b >> 4], axis=2).reshape(n, -1).astype(F32)

    def dequantize(self, r0: int = 0, r1: int | None = None, *, row_scale: bool = True) -> np.ndarray:
        """Rows [r0, r1) dequantised by step 1 of the module's arithmetic (float32 ``[n, cols]``). ``row_scale``
        False leaves int8's row scale out (the GEMV applies it after the sum)."""
        r1 = self.shape[0] if r1 is None else r1
        q = self.int_codes(r0, r1)
        n = q.shape[0]
        if self.format == "int8":
            return q * self.scales[r0:r1, None] if row_scale else q
        qb = q.reshape(n, -1, BLOCK)
        d = self.scales[r0:r1].astype(F32)[:, :, None]
        w = d * qb
        if self.format == "q4_1":
            w = w + self.mins[r0:r1].astype(F32)[:, :, None]
        return w.reshape(n, -1)

    def device_bytes(self) -> np.ndarray:
        """The device buffer (uint8): the code plane, then the scale plane, then (q4_1) the min plane, each padded
        to 16 bytes (module docstring)."""
        planes = [self.codes, self.scales] + ([self.mins] if self.mins is not None else [])
        out = np.zeros(device_nbytes(self.format, self.shape), np.uint8)
        at = 0
        for p in planes:
            raw = np.ascontiguousarray(p).view(np.uint8).reshape(-1)
            out[at:at + raw.size] = raw
            at += _align16(raw.size)
        return out


def layout_problems(t: QuantizedTensor) -> list[str]:
    """What is wrong with a QuantizedTensor's arrays (empty when it is well formed)."""
    if t.format not in FORMATS:
        return [f"format {t.format!r} (supported: {', '.join(FORMATS)})"]
    if len(t.shape) != 2 or not all(isinstance(d, int | np.integer) and d > 0 for d in t.shape):
        return ["the shape must be two positive dimensions [rows, cols]"]
    rows, cols = int(t.shape[0]), int(t.shape[1])
    if cols % BLOCK:
        return [f"cols {cols} is not a multiple of the block size {BLOCK}"]
    nb = cols // BLOCK
    want = {"int8": ((np.int8, (rows, cols)), (np.float32, (rows,)), None),
            "q8_0": ((np.int8, (rows, cols)), (np.float16, (rows, nb)), None),
            "q4_1": ((np.uint8, (rows, cols // 2)), (np.float16, (rows, nb)), (np.float16, (rows, nb)))}[t.format]
    out = []
    for role, arr, spec in (("codes", t.codes, want[0]), ("scales", t.scales, want[1]), ("mins", t.mins, want[2])):
        if spec is None:
            if arr is not None:
                out.append(f"{role} given, the format has none")
            continue
        if not isinstance(arr, np.ndarray) or arr.dtype != spec[0] or arr.shape != spec[1]:
            got = f"{arr.dtype} {list(arr.shape)}" if isinstance(arr, np.ndarray) else type(arr).__name__
            out.append(f"{role} must be {np.dtype(spec[0]).name} {list(spec[1])}, got {got}")
    if not out and not np.isfinite(t.scales).all():
        out.append("scales hold NaN or inf")
    if not out and t.mins is not None and not np.isfinite(t.mins).all():
        out.append("mins hold NaN or inf")
    return out


def device_nbytes(fmt: str, shape: tuple) -> int:
    """Bytes of a quantized weight's device buffer (its planes, each padded to 16 bytes)."""
    rows, cols = int(shape[0]), int(shape[1])
    nb = cols // BLOCK
    if fmt == "int8":
        return _align16(rows * cols) + _align16(4 * rows)
    if fmt == "q8_0":
        return _align16(rows * cols) + _align16(2 * rows * nb)
    if fmt == "q4_1":
        return _align16(rows * cols // 2) + 2 * _align16(2 * rows * nb)
    raise BadInput(f"unknown quantized format {fmt!r} (supported: {', '.join(FORMATS)})")


def bytes_per_weight(fmt: str, cols: int) -> float:
    """Weight-traffic bytes per element of a [rows, cols] matrix in ``fmt`` (bf16 and f32 included), scales counted."""
    return {"bf16": 2.0, "f32": 4.0, "int8": 1.0 + 4.0 / cols, "q8_0": 34 / 32, "q4_1": 20 / 32}[fmt]


# ----------------------------------------------------------------------------------------- arithmetic

def tree_sum_blocks(p: np.ndarray) -> np.ndarray:
    """Step 3: ``p`` [..., 32 * nb] -> [..., nb], each block's 32 values summed pairwise in element order."""
    s = p.reshape(*p.shape[:-1], -1, BLOCK)
    while s.shape[-1] > 1:
        s = s[..., 0::2] + s[..., 1::2]
    return s[..., 0]


def lane_butterfly(block_sums: np.ndarray) -> np.ndarray:
    """Steps 4 and 5: ``block_sums`` [n, nb] -> [n], lane l summing blocks l, l + 32, ... from +0.0, then the warp's
    xor butterfly. Adding +0.0 for a lane without a j-th block is exact (a sum from +0.0 is never -0.0), so padding
    to whole rounds of 32 blocks gives what the lanes without a block (which add nothing) give."""
    n, nb = block_sums.shape
    rounds = -(-nb // 32)
    pad = np.zeros((n, rounds * 32), F32)
    pad[:, :nb] = block_sums
    pad = pad.reshape(n, rounds, 32)
    acc = np.zeros((n, 32), F32)
    for j in range(rounds):
        acc = acc + pad[:, j, :]
    lanes = np.arange(32)
    for o in (16, 8, 4, 2, 1):
        acc = acc + acc[:, lanes ^ o]
    return acc[:, 0]


def matvec(w: QuantizedTensor, x: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of ``w @ x`` by the module's arithmetic (float32)."""
    x = np.asarray(x, F32)
    if x.shape != (w.shape[1],):
        raise BadInput(f"x has shape {list(x.shape)}, the weight has {w.shape[1]} columns")
    p = w.dequantize(r0, r1, row_scale=False) * x  # steps 1-2, float32 products
    y = lane_butterfly(tree_sum_blocks(p))
    if w.format == "int8":
        y = w.scales[r0:r1] * y
    return y.astype(F32, copy=False)


def rows_of(w, r: slice, x: np.ndarray) -> np.ndarray:
    """``w[r] @ x`` for a float32 array (numpy's product) or a QuantizedTensor (:func:`matvec`)."""
    if isinstance(w, QuantizedTensor):
        return matvec(w, x, r.start, r.stop)
    return w[r] @ x


def embed_row(table, token: int) -> np.ndarray:
    """Row ``token`` of an embedding table (float32 array or QuantizedTensor, dequantised by step 1)."""
    if isinstance(table, QuantizedTensor):
        return table.dequantize(token, token + 1)[0]
    return table[token]


# ------------------------------------------------------------------------------------------ quantizing

def quantize_int8(w: np.ndarray) -> QuantizedTensor:
    """Symmetric per-row int8 of a float32 [rows, cols] matrix: scale = max|w_r| / 127 (1 for an all-zero row),
    q = round-half-even(w / scale) clipped to [-127, 127]."""
    w = np.asarray(w, F32)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / F32(127), F32(1)).astype(F32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return QuantizedTensor("int8", tuple(w.shape), q, scale)


def from_gguf_blocks(fmt: str, raw: np.ndarray, shape: tuple) -> QuantizedTensor:
    """A QuantizedTensor from GGUF's raw block bytes ``raw`` (uint8 [rows, bytes per row], as gguf's reader
    returns them) of a [rows, cols] tensor in ``q8_0`` or ``q4_1``."""
    rows, cols = int(shape[0]), int(shape[1])
    nb = cols // BLOCK
    per = {"q8_0": 34, "q4_1": 20}.get(fmt)
    if per is None:
        raise BadInput(f"GGUF block format {fmt!r} is not read natively (supported: q8_0, q4_1)")
    if cols % BLOCK or raw.dtype != np.uint8 or raw.size != rows * nb * per:
        raise BadInput(f"GGUF {fmt} tensor of shape {[rows, cols]}: {raw.size} bytes, expected {rows * nb * per}")
    b = np.ascontiguousarray(raw).reshape(rows, nb, per)
    d = np.ascontiguousarray(b[:, :, 0:2]).view(np.float16).reshape(rows, nb)
    if fmt == "q8_0":
        q = np.ascontiguousarray(b[:, :, 2:]).view(np.int8).reshape(rows, cols)
        return QuantizedTensor("q8_0", (rows, cols), q, d)
    m = np.ascontiguousarray(b[:, :, 2:4]).view(np.float16).reshape(rows, nb)
    q = np.ascontiguousarray(b[:, :, 4:]).reshape(rows, cols // 2)
    return QuantizedTensor("q4_1", (rows, cols), q, d, m)
