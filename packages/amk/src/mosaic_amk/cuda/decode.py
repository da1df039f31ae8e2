"""The encoding read back: :func:`decode` (task table -> Schedule, the inverse of ``encode.encode`` up to
ranges and float32 rounding) and the Python view of abi.h (:func:`abi_constants` parses the header,
:func:`expected_abi` is encode.py's constants, name for name; test_cuda_encode compares them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mosaic_amk import ops as _ops
from mosaic_amk import rope_order
from mosaic_amk.cuda import encode as E
from mosaic_amk.cuda.encode import ABI_H, OPS, Encoded, _bits_f32
from mosaic_amk.schedule import Buffer, Schedule, Task, Wait


def decode(enc: Encoded) -> Schedule:
    """The schedule an encoding represents (task order, ops, SMs, buffers, waits, signals, the op's
    parameters; ``ranges`` are not part of the encoding). ``decode(encode(s))`` equals ``s`` with ranges
    dropped and float parameters rounded to float32: test_cuda_encode checks it."""
    sm_of = {}
    for s in range(enc.num_sms):
        for q in range(enc.queue_offsets[s], enc.queue_offsets[s + 1]):
            sm_of[int(enc.queue[q])] = s
    names = [b.name for b in enc.buffers]
    tasks = []
    for i in range(len(sm_of)):
        rec = [int(v) for v in enc.tasks[i]]
        op = OPS[rec[E.W_OP]]
        spec = _ops.SPECS[op]
        params: dict[str, Any] = {}
        words = {"row_start": E.W_ROW0, "row_end": E.W_ROW1, "num_heads": E.W_NH, "num_kv_heads": E.W_NKV,
                 "head_dim": E.W_HD, "window": E.W_WINDOW, "page_tokens": E.W_PAGE, "position": E.W_POS, "part": E.W_PART}
        for p in spec.params:
            if p in words:
                params[p] = rec[words[p]]
            elif p in ("eps", "scale", "attention_scaling"):
                params[p] = _bits_f32(rec[{"eps": E.W_EPS, "scale": E.W_SCALE, "attention_scaling": E.W_ASCALE}[p]])
            elif p == "bias":
                params[p] = bool(rec[E.W_FLAGS] & E.F_BIAS)
            elif p == "residual":
                params[p] = bool(rec[E.W_FLAGS] & E.F_RESID)
            elif p == "norm":
                params[p] = bool(rec[E.W_FLAGS] & E.F_NORM)
            elif p == "rope":
                params[p] = bool(rec[E.W_FLAGS] & E.F_ROPE)
        if rec[E.W_FLAGS] & E.F_ROPE_BLOCK:
            params["rope_block"] = rope_order.BLOCK
        tasks.append(Task(id=rec[E.W_ID], op=op, sm=sm_of[i],
                          inputs=tuple(names[rec[E.W_IN + k]] for k in range(rec[E.W_NIN])),
                          outputs=tuple(names[rec[E.W_OUT + k]] for k in range(rec[E.W_NOUT])),
                          waits=tuple(Wait(rec[E.W_WAIT + 2 * k], rec[E.W_WAIT + 2 * k + 1]) for k in range(rec[E.W_NWAIT])),
                          signal=rec[E.W_SIGNAL], params=params))
    dtype_back = {E.DT_BF16: "bf16", E.DT_F32: "f32", E.DT_I32: "i32", **{d: f for f, d in E.QUANT_DT.items()}}
    buffers = tuple(Buffer(b.name, dtype_back[b.dtype], b.shape, b.kind) for b in enc.buffers)
    return Schedule(num_sms=enc.num_sms, buffers=buffers, num_counters=enc.num_counters, tasks=tuple(tasks),
                    outputs=tuple(enc.outputs),
                    meta={"position": enc.position} if enc.position is not None else {})


def abi_constants(path: Path = ABI_H) -> dict[str, int]:
    """The ``#define NAME <int>`` constants of abi.h (the test compares them with this module's)."""
    out = {}
    for m in re.finditer(r"^#define\s+(\w+)\s+(-?\d+)\b", path.read_text(), re.M):
        out[m.group(1)] = int(m.group(2))
    return out


def expected_abi() -> Mapping[str, int]:
    """This module's view of abi.h, name for name."""
    d = {"AMK_TASK_WORDS": E.TASK_WORDS, "AMK_BUF_META": E.BUF_META, "AMK_MAX_IN": E.MAX_IN, "AMK_MAX_OUT": E.MAX_OUT,
         "AMK_MAX_WAIT": E.MAX_WAIT, "AMK_MAX_PF": E.MAX_PF, "W_OP": E.W_OP, "W_NIN": E.W_NIN, "W_NOUT": E.W_NOUT,
         "W_NWAIT": E.W_NWAIT, "W_SIGNAL": E.W_SIGNAL, "W_FLAGS": E.W_FLAGS, "W_ROW0": E.W_ROW0, "W_ROW1": E.W_ROW1,
         "W_IN": E.W_IN, "W_OUT": E.W_OUT, "W_WAIT": E.W_WAIT, "W_NH": E.W_NH, "W_NKV": E.W_NKV, "W_HD": E.W_HD,
         "W_WINDOW": E.W_WINDOW, "W_PAGE": E.W_PAGE, "W_EPS": E.W_EPS, "W_SCALE": E.W_SCALE, "W_ASCALE": E.W_ASCALE,
         "W_POS": E.W_POS, "W_PART": E.W_PART, "W_PF": E.W_PF, "W_ID": E.W_ID, "F_BIAS": E.F_BIAS, "F_RESID": E.F_RESID,
         "F_RUNTIME_POS": E.F_RUNTIME_POS, "F_NORM": E.F_NORM, "F_ROPE": E.F_ROPE, "F_KV_STAGE": E.F_KV_STAGE,
         "F_ROPE_BLOCK": E.F_ROPE_BLOCK, "DT_F32": E.DT_F32, "DT_BF16": E.DT_BF16, "DT_I32": E.DT_I32,
         "DT_Q8_0": E.DT_Q8_0, "DT_Q4_1": E.DT_Q4_1, "DT_INT8": E.DT_INT8,
         "B_DTYPE": E.B_DTYPE, "B_KIND": E.B_KIND, "B_RANK": E.B_RANK, "B_D0": E.B_D0, "B_ROW": E.B_ROW,
         "AMK_NUM_OPS": len(OPS)}
    d.update({f"OP_{name.upper()}": code for name, code in E.OP_CODE.items()})
    return d
