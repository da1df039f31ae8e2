"""The blocked RoPE order (``ScheduleConfig.rope_order = "blocked"``): how q and the K cache can be cut into tasks of
a few rows without splitting a RoPE pair.

Rotate-half RoPE pairs dim ``j`` of a head with dim ``j + head_dim/2``, so a task of the standard order that rotates
its own rows must hold whole heads (the q/k/v stage then runs 48 whole-head tasks on the Llama-3.2-1B shape, where
132 SMs could stream it). In the blocked order each head is stored as blocks of ``BLOCK`` = 8 floats: dims
``4b .. 4b+3`` of the first half, then their partners ``half+4b .. half+4b+3``. A run of whole blocks then holds
whole pairs (stored row ``r``'s partner is ``r ^ 4``), and 16-byte chunks (4 floats) hold 4 consecutive standard
dims, so the attention can read q and K back in the standard dim order chunk by chunk and sum ``q . k`` in the
standard order: every bit is the standard order's.

The q/k projection rows (and biases) are stored permuted the same way: a weight buffer named
``<checkpoint name>@rope_blocked<head_dim>`` (:func:`weight_name`) is the checkpoint tensor with its rows in the
blocked order, derived when a VM binds it (:func:`resolve`). The ops (ops.py ``rope_block`` parameter) read and
write stored rows; only their RoPE partner and cos/sin index, and the attention's read order, know the layout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

BLOCK = 8  # floats per block: 4 dims of a head's first half, then their 4 partners
SUFFIX = "@rope_blocked"
_NAME = re.compile(r"^(.*)@rope_blocked(\d+)$")


def dims(head_dim: int) -> np.ndarray:
    """``dims(hd)[s]``: the standard dim stored at position ``s`` of a head in the blocked order."""
    if head_dim % BLOCK:
        raise ValueError(f"head_dim {head_dim} is not a multiple of {BLOCK}")
    half = head_dim // 2
    s = np.arange(head_dim)
    b, w = s // BLOCK, s % BLOCK
    return np.where(w < 4, 4 * b + w, half + 4 * b + w - 4)


def rows(n_rows: int, head_dim: int) -> np.ndarray:
    """Stored row ``r`` of an ``n_rows``-row projection (whole heads) holds standard row ``rows(...)[r]``."""
    if n_rows % head_dim:
        raise ValueError(f"{n_rows} rows are not whole heads of {head_dim}")
    d = dims(head_dim)
    return (np.arange(n_rows) // head_dim * head_dim + d[np.arange(n_rows) % head_dim]).astype(np.int64)


def to_standard(x: np.ndarray, head_dim: int) -> np.ndarray:
    """The standard dim order of ``x`` (last axis: heads of ``head_dim`` in the blocked order)."""
    inv = np.argsort(dims(head_dim))
    shape = x.shape
    return x.reshape(*shape[:-1], shape[-1] // head_dim, head_dim)[..., inv].reshape(shape)


def weight_name(name: str, head_dim: int) -> str:
    """The buffer name of checkpoint tensor ``name`` with its rows in the blocked order of ``head_dim``."""
    return f"{name}{SUFFIX}{head_dim}"


def split_name(name: str) -> tuple[str, int] | None:
    """(checkpoint name, head_dim) of a blocked weight buffer name, or None for a plain name."""
    m = _NAME.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def resolve(get: Callable[[str], Any], name: str) -> Any:
    """The array bound to weight buffer ``name``: ``get(name)`` for a plain name; for a blocked name the checkpoint
    tensor's rows permuted (numpy, torch or cupy; a new contiguous array), None when the tensor is missing or its
    rows are not whole heads."""
    got = split_name(name)
    if got is None:
        return get(name)
    base, hd = got
    arr = get(base)
    if arr is None or not arr.shape or arr.shape[0] % hd or hd % BLOCK:
        return None
    idx = rows(arr.shape[0], hd)
    if hasattr(arr, "take_rows"):  # a quant.QuantizedTensor: whole rows move with their blocks
        return arr.take_rows(idx)
    if isinstance(arr, np.ndarray):
        return np.ascontiguousarray(arr[idx])
    if hasattr(arr, "index_select"):  # torch
        import torch

        return arr.index_select(0, torch.as_tensor(idx, device=arr.device)).contiguous()
    import cupy

    return cupy.ascontiguousarray(arr[cupy.asarray(idx)])
