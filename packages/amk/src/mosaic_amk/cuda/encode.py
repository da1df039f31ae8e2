"""Schedule -> the CUDA VM's packed tables: a task table (int32 [tasks, 64]), the per-SM queues and a
buffer table (device dtype, kind, rank, dims, row length per buffer). The word layout is abi.h's.

The encoder is the VM's memory-safety gate and runs even for ``--unsafe`` launches: every buffer id,
counter, SM and row range is checked against the buffers it indexes, every op's buffers must have the
device dtypes and shapes its micro-kernel reads, and the ABI capacities (8 inputs, 4 outputs, 8 waits,
rank 4) hold. It does not judge synchronisation (deadlocks, races): that is the validator's job, and
the launcher refuses what the validator rejects unless ``unsafe=True``.

Device dtypes (the precision contract, docs/amk-cuda.md): weight buffers are stored in bf16 (whatever the
schedule declares: the schedule's float32 is the reference semantics), except a weight used as RoPE
``inv_freq`` (float32) and a quantized weight (schedule dtype int8 / q8_0 / q4_1: its own format, QUANT_DT, read
natively by the GEMVs and the embedding, quant.py); activations, outputs, scratch and the KV cache are float32;
``i32`` stays int32.

Position: tasks whose ``position`` parameter equals the schedule's position are flagged
``F_RUNTIME_POS``; the VM then uses the launch's position argument, so one encoding serves every decode
step of a schedule whose structure does not depend on the position (``structure_key`` checks that).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import attrs
import numpy as np
from mosaic.errors import BadInput

from mosaic_amk import ops as _ops
from mosaic_amk import rope_order
from mosaic_amk.lowering import NEXT_TOKEN, TOKEN
from mosaic_amk.schedule import BUFFER_KINDS, Schedule, Task

ABI_H = Path(__file__).with_name("abi.h")

TASK_WORDS, BUF_META = 64, 8
MAX_IN, MAX_OUT, MAX_WAIT, MAX_PF, MAX_RANK = 8, 4, 8, 3, 4
W_OP, W_NIN, W_NOUT, W_NWAIT, W_SIGNAL, W_FLAGS, W_ROW0, W_ROW1 = range(8)
W_IN, W_OUT, W_WAIT = 8, 16, 20
W_NH, W_NKV, W_HD, W_WINDOW, W_PAGE, W_EPS, W_SCALE, W_ASCALE, W_POS = range(36, 45)
W_PART, W_PF, W_ID = 45, 48, 60
F_BIAS, F_RESID, F_RUNTIME_POS, F_NORM, F_ROPE, F_KV_STAGE, F_ROPE_BLOCK = 1, 2, 4, 8, 16, 32, 64
DT_F32, DT_BF16, DT_I32 = 0, 1, 2
DT_Q8_0, DT_Q4_1, DT_INT8 = 3, 4, 5  # quantized weights (quant.py): planes of codes, scales (, mins)
QUANT_DT = {"q8_0": DT_Q8_0, "q4_1": DT_Q4_1, "int8": DT_INT8}
DTYPE_NAMES = {DT_F32: "f32", DT_BF16: "bf16", DT_I32: "i32", DT_Q8_0: "q8_0", DT_Q4_1: "q4_1", DT_INT8: "int8"}
ITEMSIZE = {DT_F32: 4, DT_BF16: 2, DT_I32: 4}  # per element; quantized buffers: quant.device_nbytes
B_DTYPE, B_KIND, B_RANK, B_D0, B_ROW = 0, 1, 2, 3, 7

# op codes: the order of abi.h's OP_* constants
OPS = ("embed", "rmsnorm", "gemv", "gemv_silu_mul", "silu_mul", "add", "rope", "kv_append", "rope_append",
       "attention", "argmax", "rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append",
       "argmax_partial", "argmax_combine")
OP_CODE = {name: i for i, name in enumerate(OPS)}
assert set(OPS) == set(_ops.SPECS), "encode.OPS must cover ops.SPECS exactly"

_W, _A, _I = DT_BF16, DT_F32, DT_I32
# device dtype the micro-kernel reads for each input role / writes for each output role
ROLE_DTYPES: dict[str, dict[str, int]] = {
    "embed": {"table": _W, "token": _I, "x": _A},
    "rmsnorm": {"x": _A, "weight": _W, "y": _A},
    "gemv": {"x": _A, "w": _W, "b": _W, "res": _A, "y": _A},
    "gemv_silu_mul": {"x": _A, "w_gate": _W, "w_up": _W, "b_gate": _W, "b_up": _W, "y": _A},
    "silu_mul": {"gate": _A, "up": _A, "y": _A},
    "add": {"a": _A, "b": _A, "y": _A},
    "rope": {"x": _A, "inv_freq": DT_F32, "y": _A},
    "kv_append": {"x": _A, "cache": _A},
    "rope_append": {"x": _A, "inv_freq": DT_F32, "cache": _A},
    "attention": {"q": _A, "k_cache": _A, "v_cache": _A, "y": _A},
    "argmax": {"logits": _A, "token": _I},
    "rmsnorm_gemv": {"x": _A, "nw": _W, "w": _W, "b": _W, "res": _A, "y": _A},
    "rmsnorm_gemv_silu_mul": {"x": _A, "nw": _W, "w_gate": _W, "w_up": _W, "b_gate": _W, "b_up": _W, "y": _A},
    "gemv_rope": {"x": _A, "w": _W, "inv_freq": DT_F32, "nw": _W, "b": _W, "y": _A},
    "gemv_rope_append": {"x": _A, "w": _W, "inv_freq": DT_F32, "nw": _W, "b": _W, "cache": _A},
    "argmax_partial": {"logits": _A, "val": _A, "idx": _I},
    "argmax_combine": {"val": _A, "idx": _I, "token": _I},
}
# the weight roles whose micro-kernel also reads a quantized weight natively (kernels/gemv_quant.cuh; embed: a row
# dequantised): the buffer may then be any of QUANT_DT instead of bf16
QUANT_ROLES = {("embed", "table"), ("gemv", "w"), ("rmsnorm_gemv", "w"), ("gemv_rope", "w"), ("gemv_rope_append", "w"),
               ("gemv_silu_mul", "w_gate"), ("gemv_silu_mul", "w_up"), ("rmsnorm_gemv_silu_mul", "w_gate"),
               ("rmsnorm_gemv_silu_mul", "w_up")}
# ops whose inv_freq input is read as float32 (the host builds the RoPE table from it)
ROPE_OPS = ("rope", "rope_append", "gemv_rope", "gemv_rope_append")
F32_WEIGHT_ROLES = {(op, "inv_freq") for op in ROPE_OPS}
# ops that stream rows [row_start, row_end) of their weights (prefetch regions are those rows; a norm weight
# ``nw`` is read whole)
ROW_WEIGHT_OPS = ("gemv", "gemv_silu_mul", "rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append")


class EncodeError(BadInput):
    """The schedule cannot be represented in (or would be memory-unsafe under) the VM's ABI."""


@attrs.frozen
class DeviceBuffer:
    name: str
    dtype: int  # DT_*
    kind: str
    shape: tuple

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        if self.dtype in DTYPE_NAMES and DTYPE_NAMES[self.dtype] in QUANT_DT:
            from mosaic_amk.quant import device_nbytes

            return device_nbytes(DTYPE_NAMES[self.dtype], self.shape)
        return self.size * ITEMSIZE[self.dtype]

    @property
    def row(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1


@attrs.frozen(eq=False)
class Encoded:
    """What the VM reads. ``tasks[i]`` is the record of ``schedule.tasks[i]``; SM ``s``'s queue is
    ``queue[queue_offsets[s]:queue_offsets[s + 1]]`` (task indices in list order)."""

    tasks: np.ndarray
    queue_offsets: np.ndarray
    queue: np.ndarray
    buffers: tuple
    buf_meta: np.ndarray
    num_sms: int
    num_counters: int
    position: int | None
    token_buf: int
    next_buf: int
    rope: tuple | None  # (inv_freq buffer name, head_dim, attention_scaling) shared by every rope task
    max_attention_tokens: int  # the most cached tokens an attention task can read (KV capacity)
    structure_key: str
    outputs: tuple = ()
    producers: np.ndarray | None = None  # int32 [counters]: tasks signalling each counter (multi-step waits)

    def buffer_id(self, name: str) -> int:
        for i, b in enumerate(self.buffers):
            if b.name == name:
                return i
        raise KeyError(name)

    def weight_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers if b.kind == "weight")

    def summary(self) -> dict:
        return {"tasks": int(self.tasks.shape[0]), "sms": self.num_sms, "counters": self.num_counters,
                "buffers": len(self.buffers), "weight_bytes": self.weight_bytes(),
                "task_table_bytes": int(self.tasks.nbytes), "structure_key": self.structure_key[:16]}


def _f32_bits(v: float) -> int:
    return int(np.array([v], np.float32).view(np.int32)[0])


def _bits_f32(v: int) -> float:
    return float(np.array([v], np.int32).view(np.float32)[0])


def _int_param(t: Task, name: str) -> int:
    v = t.params.get(name)
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise EncodeError(f"task {t.id} ({t.op}): parameter {name} must be an integer, got {v!r}")
    if not -(2 ** 31) <= int(v) < 2 ** 31:
        raise EncodeError(f"task {t.id} ({t.op}): parameter {name}={v} does not fit int32")
    return int(v)


def _float_param(t: Task, name: str) -> float:
    v = t.params.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float | np.floating | np.integer):
        raise EncodeError(f"task {t.id} ({t.op}): parameter {name} must be a number, got {v!r}")
    return float(v)


def _role_buffer(t: Task, role: str) -> str | None:
    """The buffer ``t`` passes for input ``role`` (None for an unknown op, an absent role or a wrong arity)."""
    spec = _ops.SPECS.get(t.op)
    if spec is None:
        return None
    roles = spec.input_roles(t.params)
    if role not in roles or len(t.inputs) != len(roles):
        return None
    return t.inputs[roles.index(role)]


def device_dtypes(schedule: Schedule) -> dict[str, int]:
    """The device dtype of every buffer (see the module docstring)."""
    f32_weights = {_role_buffer(t, "inv_freq") for t in schedule.tasks if t.op in ROPE_OPS} - {None}
    out = {}
    for b in schedule.buffers:
        if b.dtype in ("i8", "i4"):
            raise EncodeError(f"buffer {b.name}: dtype {b.dtype} is not run by the CUDA VM (bf16, f32, i32; "
                              "int8 / q8_0 / q4_1 weights)")
        if b.dtype in QUANT_DT:
            if b.kind != "weight" or len(b.shape) != 2 or b.shape[1] % 32:
                raise EncodeError(f"buffer {b.name}: a {b.dtype} buffer must be a 2-D weight with a multiple of 32 "
                                  "columns")
            out[b.name] = QUANT_DT[b.dtype]
        elif b.dtype == "i32":
            out[b.name] = DT_I32
        elif b.kind == "weight":
            out[b.name] = DT_F32 if b.name in f32_weights else DT_BF16
        elif b.dtype == "bf16":
            raise EncodeError(f"buffer {b.name}: the CUDA VM keeps {b.kind} buffers in f32, not bf16")
        else:
            out[b.name] = DT_F32
    return out


def structure_key(schedule: Schedule) -> str:
    """SHA-256 of everything about a schedule but its decode position: buffers, counters, SMs, and each
    task's op, SM, buffers, waits, signal and non-position parameters (ranges excluded: the KV slot and
    attention ranges are the position-dependent part)."""
    body = {"num_sms": schedule.num_sms, "num_counters": schedule.num_counters,
            "buffers": [b.to_json() for b in schedule.buffers], "outputs": list(schedule.outputs),
            "tasks": [[t.id, t.op, t.sm, list(t.inputs), list(t.outputs), [[w.counter, w.threshold] for w in t.waits],
                       t.signal, {k: v for k, v in sorted(t.params.items()) if k != "position"}]
                      for t in schedule.tasks]}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


# ------------------------------------------------------------------------------------ per-op checks

def _len(b: DeviceBuffer) -> int:
    return b.size


def _check_op(t: Task, roles: dict[str, DeviceBuffer], out_roles: dict[str, DeviceBuffer]) -> None:
    """Shape checks that keep each micro-kernel's accesses inside its buffers."""
    def bad(msg: str):
        raise EncodeError(f"task {t.id} ({t.op}): {msg}")

    op = t.op
    if op == "embed":
        table = roles["table"]
        if len(table.shape) != 2 or _len(out_roles["x"]) < table.shape[1]:
            bad(f"table {table.name} must be [vocab, hidden] with an output of at least hidden elements")
        if _len(roles["token"]) < 1:
            bad("token buffer is empty")
    elif op == "rmsnorm":
        n = roles["x"].shape[0] if roles["x"].shape else 1
        if not (_len(roles["x"]) == _len(roles["weight"]) == _len(out_roles["y"]) == n):
            bad("x, weight and y must be 1-D of one length")
    elif op in ("gemv", "gemv_silu_mul"):
        ws = [roles["w"]] if op == "gemv" else [roles["w_gate"], roles["w_up"]]
        r0, r1 = _int_param(t, "row_start"), _int_param(t, "row_end")
        for w in ws:
            if len(w.shape) != 2:
                bad(f"weight {w.name} must be 2-D")
            if w.shape != ws[0].shape:
                bad("gate and up weights differ in shape")
        rows, k = ws[0].shape
        _check_weight_format(ws, k, bad)
        if _len(roles["x"]) != k:
            bad(f"x has {_len(roles['x'])} elements, the weight has {k} columns")
        if not 0 <= r0 < r1 <= rows or r1 > _len(out_roles["y"]):
            bad(f"rows [{r0}, {r1}) outside the weight ({rows} rows) or the output ({_len(out_roles['y'])})")
        for name in ("b", "res", "b_gate", "b_up"):
            if name in roles and _len(roles[name]) < r1:
                bad(f"{name} buffer {roles[name].name} is shorter than row {r1}")
    elif op in ("silu_mul", "add"):
        a, b = list(roles.values())
        if not _len(a) == _len(b) == _len(out_roles["y"]):
            bad("inputs and output must have one length")
    elif op in ("rope", "rope_append"):
        nh, hd = _int_param(t, "num_heads"), _int_param(t, "head_dim")
        if hd <= 0 or hd % 2 or nh <= 0:
            bad("num_heads > 0 and an even head_dim > 0 are required")
        if _len(roles["x"]) < nh * hd or _len(roles["inv_freq"]) != hd // 2:
            bad(f"x must hold num_heads*head_dim={nh * hd} and inv_freq head_dim/2={hd // 2} elements")
        out = out_roles.get("y") or out_roles["cache"]
        if op == "rope" and _len(out) < nh * hd:
            bad("output shorter than num_heads*head_dim")
        if op == "rope_append" and (len(out.shape) != 3 or out.shape[2] != nh * hd):
            bad("cache must be [pages, page_tokens, num_heads*head_dim]")
    elif op == "kv_append":
        cache = out_roles["cache"]
        if len(cache.shape) != 3 or _len(roles["x"]) != cache.shape[2]:
            bad("cache must be [pages, page_tokens, kv_dim] with x of kv_dim elements")
    elif op == "attention":
        nh, nkv, hd = (_int_param(t, k) for k in ("num_heads", "num_kv_heads", "head_dim"))
        r0, r1 = _int_param(t, "row_start"), _int_param(t, "row_end")
        if nkv <= 0 or nh % nkv or hd <= 0:
            bad("num_heads must be a positive multiple of num_kv_heads, head_dim > 0")
        if hd % 4 or hd > 512:
            bad(f"head_dim {hd} must be a multiple of 4 and <= 512 (the micro-kernel reads K/V rows as float4)")
        for name in ("k_cache", "v_cache"):
            c = roles[name]
            if len(c.shape) != 3 or c.shape[2] != nkv * hd:
                bad(f"{name} must be [pages, page_tokens, num_kv_heads*head_dim]")
        if r0 % hd or r1 % hd or not 0 <= r0 < r1 <= nh * hd or r1 > _len(out_roles["y"]) or _len(roles["q"]) < nh * hd:
            bad(f"rows [{r0}, {r1}) must be whole heads inside q and y")
        _int_param(t, "window")
        _rope_block(t, hd, bad)
    elif op == "argmax":
        if _len(roles["logits"]) < 1:
            bad("empty logits")
    elif op == "argmax_partial":
        r0, r1, part = (_int_param(t, k) for k in ("row_start", "row_end", "part"))
        if not 0 <= r0 < r1 <= _len(roles["logits"]):
            bad(f"rows [{r0}, {r1}) outside the logits ({_len(roles['logits'])})")
        if _len(out_roles["val"]) != _len(out_roles["idx"]) or not 0 <= part < _len(out_roles["val"]):
            bad(f"part {part} outside val / idx, or val and idx of different lengths")
    elif op == "argmax_combine":
        if not 1 <= _len(roles["val"]) == _len(roles["idx"]) or _len(out_roles["token"]) < 1:
            bad("val and idx must have one length >= 1, token at least one element")
    elif op in ("rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append"):
        _check_fused_gemv(t, roles, out_roles, bad)


def _check_weight_format(ws: list[DeviceBuffer], k: int, bad) -> None:
    """A GEMV's weights: bf16 with in-features a multiple of 8 (16-byte vector loads), or quantized (one format for
    gate and up) with a multiple of 32 (whole blocks)."""
    if len({w.dtype for w in ws}) != 1:
        bad("gate and up weights differ in device dtype")
    if ws[0].dtype == DT_BF16 and k % 8:
        bad(f"in-features {k} of {ws[0].name} must be a multiple of 8 (16-byte bf16 vector loads)")
    if ws[0].dtype != DT_BF16 and k % 32:
        bad(f"in-features {k} of {ws[0].name} must be a multiple of 32 (whole quantization blocks)")


def _rope_block(t: Task, hd: int, bad) -> int:
    """The task's ``rope_block`` (0, or rope_order.BLOCK with head_dim a multiple of it): flag F_ROPE_BLOCK."""
    blk = t.params.get("rope_block", 0)
    if type(blk) is not int or blk not in (0, rope_order.BLOCK) or (blk and hd % blk):
        bad(f"rope_block {blk!r} must be 0 or {rope_order.BLOCK} (head_dim {hd} a multiple of it)")
    return blk


def _check_fused_gemv(t: Task, roles: dict[str, DeviceBuffer], out_roles: dict[str, DeviceBuffer], bad) -> None:
    """The fused GEMVs: the GEMV's checks (2-D weights of one shape, in-features a multiple of 8, x of
    in-features elements, rows inside the weight, biases/residual long enough), a norm weight ``nw`` of
    in-features elements, and for the RoPE ones whole heads and an inv_freq of head_dim/2; the KV-slot op
    writes columns [row_start, row_end) of one slot, so row_end must not pass kv_dim. The micro-kernel keeps
    x (+ its rows and cos/sin) in shared memory: it checks the fit itself (error bit, no access)."""
    op = t.op
    ws = [roles["w_gate"], roles["w_up"]] if op == "rmsnorm_gemv_silu_mul" else [roles["w"]]
    r0, r1 = _int_param(t, "row_start"), _int_param(t, "row_end")
    for w in ws:
        if len(w.shape) != 2 or w.shape != ws[0].shape:
            bad(f"weight {w.name} must be 2-D (gate and up of one shape)")
    rows, k = ws[0].shape
    _check_weight_format(ws, k, bad)
    if _len(roles["x"]) != k:
        bad(f"x has {_len(roles['x'])} elements, the weight has {k} columns")
    if "nw" in roles and _len(roles["nw"]) != k:
        bad(f"norm weight {roles['nw'].name} has {_len(roles['nw'])} elements, x has {k}")
    if not 0 <= r0 < r1 <= rows:
        bad(f"rows [{r0}, {r1}) outside the weight ({rows} rows)")
    for name in ("b", "res", "b_gate", "b_up"):
        if name in roles and _len(roles[name]) < r1:
            bad(f"{name} buffer {roles[name].name} is shorter than row {r1}")
    if op in ("rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope") and r1 > _len(out_roles["y"]):
        bad(f"rows [{r0}, {r1}) outside the output ({_len(out_roles['y'])})")
    rope = op == "gemv_rope" or (op == "gemv_rope_append" and bool(t.params.get("rope")))
    if op in ("gemv_rope", "gemv_rope_append"):
        hd = _int_param(t, "head_dim")
        if hd <= 0 or hd % 2:
            bad(f"head_dim {hd} must be even and > 0")
        blk = _rope_block(t, hd, bad) if rope else 0
        if rope and (r0 % (blk or hd) or r1 % (blk or hd)):
            what = f"8-row blocks (rope_block {blk})" if blk else f"heads of {hd}"
            bad(f"rows [{r0}, {r1}) must hold whole {what} (RoPE rotates within a head)")
        if rope and _len(roles["inv_freq"]) != hd // 2:
            bad(f"inv_freq must hold head_dim/2={hd // 2} elements")
        _float_param(t, "attention_scaling")
    if op == "gemv_rope_append":
        cache = out_roles["cache"]
        page = _int_param(t, "page_tokens")
        if len(cache.shape) != 3 or cache.shape[1] != page:
            bad(f"cache must be [pages, page_tokens={page}, kv_dim]")
        if r1 > cache.shape[2]:
            bad(f"rows [{r0}, {r1}) beyond the cache slot (kv_dim {cache.shape[2]})")


def _prefetch_regions(t: Task, roles: dict[str, tuple[int, DeviceBuffer]], max_bytes: int = 0
                      ) -> list[tuple[int, int, int]]:
    """(buffer id, offset/16, size/16) of the weight bytes this task will read, largest first; with ``max_bytes``
    the regions are cut to their first ``max_bytes / len(regions)`` bytes each (the rows the task reads first)."""
    regions = []
    for role, (bid, b) in roles.items():
        if b.kind != "weight" or b.dtype != DT_BF16 or t.op == "embed":
            continue
        row_bytes = b.row * ITEMSIZE[b.dtype]
        if t.op in ROW_WEIGHT_OPS and role != "nw":
            r0, r1 = int(t.params["row_start"]), int(t.params["row_end"])
            lo, size = r0 * row_bytes, (r1 - r0) * row_bytes
        else:
            lo, size = 0, b.nbytes
        size -= size % 16
        if lo % 16 == 0 and size >= 16:
            regions.append((size, bid, lo // 16, size // 16))
    regions.sort(reverse=True)
    regions = regions[:MAX_PF]
    if max_bytes and regions:
        each = max(16, max_bytes // len(regions) // 16 * 16) // 16
        regions = [(size, bid, lo, min(n, each)) for size, bid, lo, n in regions]
    return [(bid, lo, n) for _, bid, lo, n in regions]


# ------------------------------------------------------------------------------------------ encode

def encode(schedule: Schedule, *, runtime_position: bool = True, prefetch_max_bytes: int = 0) -> Encoded:
    """Pack ``schedule`` for the VM (raises EncodeError for anything the ABI cannot run safely).
    ``prefetch_max_bytes``: L2-prefetch at most this many bytes of each task's weights (0: all of them)."""
    if not isinstance(schedule, Schedule):
        raise EncodeError(f"expected a Schedule, got {type(schedule).__name__}")
    if schedule.num_sms < 1:
        raise EncodeError(f"num_sms must be >= 1, got {schedule.num_sms}")
    dts = device_dtypes(schedule)
    bufs: list[DeviceBuffer] = []
    index: dict[str, int] = {}
    for b in schedule.buffers:
        if b.name in index:
            raise EncodeError(f"duplicate buffer name {b.name}")
        if len(b.shape) > MAX_RANK or any(d < 1 for d in b.shape):
            raise EncodeError(f"buffer {b.name}: shape {list(b.shape)} (rank <= {MAX_RANK}, dims >= 1)")
        index[b.name] = len(bufs)
        bufs.append(DeviceBuffer(b.name, dts[b.name], b.kind, tuple(b.shape)))
    meta = np.zeros((max(1, len(bufs)), BUF_META), np.int32)
    for i, b in enumerate(bufs):
        dims = list(b.shape) + [1] * (MAX_RANK - len(b.shape))
        if any(d >= 2 ** 31 for d in dims) or b.row >= 2 ** 31:
            raise EncodeError(f"buffer {b.name}: a dimension does not fit int32")
        meta[i] = [b.dtype, BUFFER_KINDS.index(b.kind), len(b.shape), *dims, b.row]

    n = len(schedule.tasks)
    table = np.full((max(1, n), TASK_WORDS), -1, np.int32)
    table[:, W_NIN:W_ROW1 + 1] = 0
    table[:, W_NH:W_PF] = 0
    positions = {int(t.params["position"]) for t in schedule.tasks if "position" in t.params
                 and isinstance(t.params["position"], int) and not isinstance(t.params["position"], bool)}
    meta_pos = schedule.meta.get("position")
    position = meta_pos if isinstance(meta_pos, int) and not isinstance(meta_pos, bool) else (
        next(iter(positions)) if len(positions) == 1 else None)
    rope = None
    max_tokens = 0
    seen_ids = set()
    for i, t in enumerate(schedule.tasks):
        spec = _ops.SPECS.get(t.op)
        if spec is None:
            raise EncodeError(f"task {t.id}: unknown op {t.op!r}")
        if t.id in seen_ids:
            raise EncodeError(f"duplicate task id {t.id}")
        seen_ids.add(t.id)
        if not 0 <= t.sm < schedule.num_sms:
            raise EncodeError(f"task {t.id}: sm {t.sm} outside 0 .. {schedule.num_sms - 1}")
        if not 0 <= t.signal < schedule.num_counters:
            raise EncodeError(f"task {t.id}: signal counter {t.signal} outside 0 .. {schedule.num_counters - 1}")
        missing = [p for p in spec.params if p not in t.params]
        if missing:
            raise EncodeError(f"task {t.id} ({t.op}): missing parameter(s) {', '.join(missing)}")
        in_roles = spec.input_roles(t.params)
        if len(t.inputs) != len(in_roles) or len(t.outputs) != len(spec.outputs):
            raise EncodeError(f"task {t.id} ({t.op}): {len(t.inputs)} inputs/{len(t.outputs)} outputs, "
                              f"the op takes {len(in_roles)}/{len(spec.outputs)}")
        if len(t.inputs) > MAX_IN or len(t.outputs) > MAX_OUT or len(t.waits) > MAX_WAIT:
            raise EncodeError(f"task {t.id}: more than {MAX_IN} inputs, {MAX_OUT} outputs or {MAX_WAIT} waits "
                              "(the VM's fixed descriptor)")
        roles: dict[str, tuple[int, DeviceBuffer]] = {}
        for role, name in (*zip(in_roles, t.inputs, strict=True), *zip(spec.outputs, t.outputs, strict=True)):
            if name not in index:
                raise EncodeError(f"task {t.id} ({t.op}): unknown buffer {name!r}")
            b = bufs[index[name]]
            want = ROLE_DTYPES[t.op][role]
            if b.dtype != want and not (want == DT_BF16 and b.dtype in QUANT_DT.values() and (t.op, role) in QUANT_ROLES):
                raise EncodeError(f"task {t.id} ({t.op}): {role} buffer {name} is {DTYPE_NAMES[b.dtype]} on the "
                                  f"device, the micro-kernel reads {DTYPE_NAMES[want]}")
            roles[role] = (index[name], b)
        for name in t.outputs:
            if bufs[index[name]].kind in ("weight", "input"):
                raise EncodeError(f"task {t.id} ({t.op}): writes {bufs[index[name]].kind} buffer {name}")
        n_in = len(in_roles)
        _check_op(t, {r: roles[r][1] for r in in_roles}, {r: roles[r][1] for r in spec.outputs})
        rec = table[i]
        rec[W_OP], rec[W_NIN], rec[W_NOUT], rec[W_NWAIT], rec[W_SIGNAL] = (
            OP_CODE[t.op], n_in, len(t.outputs), len(t.waits), t.signal)
        flags = 0
        if t.params.get("bias"):
            flags |= F_BIAS
        if t.params.get("residual"):
            flags |= F_RESID
        if t.params.get("norm"):
            flags |= F_NORM
        if t.params.get("rope"):
            flags |= F_ROPE
        if t.params.get("rope_block"):
            flags |= F_ROPE_BLOCK
        if "part" in t.params:
            rec[W_PART] = _int_param(t, "part")
        if "position" in t.params:
            pos = _int_param(t, "position")
            rec[W_POS] = pos
            if runtime_position and position is not None and pos == position:
                flags |= F_RUNTIME_POS
        rec[W_FLAGS] = flags
        if "row_start" in t.params:
            rec[W_ROW0], rec[W_ROW1] = _int_param(t, "row_start"), _int_param(t, "row_end")
        else:
            rec[W_ROW0], rec[W_ROW1] = 0, 0
        for k, name in enumerate(t.inputs):
            rec[W_IN + k] = index[name]
        for k, name in enumerate(t.outputs):
            rec[W_OUT + k] = index[name]
        for k, w in enumerate(t.waits):
            if not 0 <= w.counter < schedule.num_counters:
                raise EncodeError(f"task {t.id}: waits on counter {w.counter} outside 0 .. {schedule.num_counters - 1}")
            if not -(2 ** 31) <= w.threshold < 2 ** 31:
                raise EncodeError(f"task {t.id}: threshold {w.threshold} does not fit int32")
            rec[W_WAIT + 2 * k], rec[W_WAIT + 2 * k + 1] = w.counter, w.threshold
        for key, word in (("num_heads", W_NH), ("num_kv_heads", W_NKV), ("head_dim", W_HD), ("window", W_WINDOW),
                          ("page_tokens", W_PAGE)):
            if key in t.params:
                rec[word] = _int_param(t, key)
        for key, word in (("eps", W_EPS), ("scale", W_SCALE), ("attention_scaling", W_ASCALE)):
            if key in t.params:
                rec[word] = _f32_bits(_float_param(t, key))
        inv = _role_buffer(t, "inv_freq") if t.op in ROPE_OPS else None
        if inv is not None:
            this = (inv, int(t.params["head_dim"]), float(np.float32(t.params["attention_scaling"])))
            if rope is not None and rope != this:
                raise EncodeError(f"task {t.id}: RoPE tasks use different inv_freq/head_dim/scaling ({rope} vs "
                                  f"{this}); the VM holds one RoPE table")
            rope = this
        if t.op == "attention":
            kc = roles["k_cache"][1]
            max_tokens = max(max_tokens, kc.shape[0] * kc.shape[1])
        for k, (bid, lo, cnt) in enumerate(_prefetch_regions(t, roles, prefetch_max_bytes)):
            if lo >= 2 ** 31 or cnt >= 2 ** 31:
                continue
            rec[W_PF + 3 * k: W_PF + 3 * k + 3] = (bid, lo, cnt)
        rec[W_ID] = t.id
    _flag_kv_stage(schedule, table, index)
    queues: list[list[int]] = [[] for _ in range(schedule.num_sms)]
    for i, t in enumerate(schedule.tasks):
        queues[t.sm].append(i)
    offsets = np.zeros(schedule.num_sms + 1, np.int32)
    offsets[1:] = np.cumsum([len(q) for q in queues])
    queue = np.array([i for q in queues for i in q] or [0], np.int32)
    producers = np.zeros(max(1, schedule.num_counters), np.int32)
    for t in schedule.tasks:
        producers[t.signal] += 1
    return Encoded(tasks=table, queue_offsets=offsets, queue=queue, buffers=tuple(bufs), buf_meta=meta,
                   num_sms=schedule.num_sms, num_counters=schedule.num_counters, position=position,
                   token_buf=index.get(TOKEN, -1), next_buf=index.get(NEXT_TOKEN, -1), rope=rope,
                   max_attention_tokens=max_tokens, structure_key=structure_key(schedule),
                   outputs=tuple(schedule.outputs), producers=producers)


def _flag_kv_stage(schedule: Schedule, table: np.ndarray, index: Mapping[str, int]) -> None:
    """Set ``F_KV_STAGE`` on the attention tasks whose cached rows before the step's position may be read before
    the task's wait (the ``AMK_ATT_STAGE`` build copies them to shared memory while thread 0 waits): the task runs
    at the launch's position (``F_RUNTIME_POS``) and every task that writes its K or V cache does too, so within a
    launch step a cache is written only at the step's own position, and every row before it was written in an
    earlier step (the step boundary's grid sync, or the kernel boundary, orders it before this step's reads)."""
    runtime = (table[:, W_FLAGS] & F_RUNTIME_POS) != 0
    writers: dict[int, list[int]] = {}
    for i, t in enumerate(schedule.tasks):
        for name in t.outputs:
            writers.setdefault(index[name], []).append(i)
    for i, t in enumerate(schedule.tasks):
        if t.op != "attention" or not runtime[i]:
            continue
        caches = (int(table[i, W_IN + 1]), int(table[i, W_IN + 2]))
        if all(runtime[w] for b in caches for w in writers.get(b, ())):
            table[i, W_FLAGS] |= F_KV_STAGE
