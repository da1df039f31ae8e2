"""Launch the AMK VM: one cooperative block per (logical) SM, through cupy (``cupy.RawModule`` with
``enable_cooperative_groups``, i.e. ``cuLaunchCooperativeKernel``).

- :func:`gate` is the launch policy: a schedule the validator rejects is never launched unless
  ``unsafe=True`` (tests and the planted-deadlock demonstration).
- :class:`Launcher` owns the device tables (task table, queues, buffer table), the counters (zeroed by
  the VM itself before its entry grid sync, i.e. before every launch), the control block (sticky abort
  flag, error bits, per-block dump) and the buffers it allocates (activations, outputs, the KV cache,
  which persists between launches). Weights are bound by pointer (zero copy from torch/cupy arrays).
- The watchdog: a wait longer than ``timeout_s`` sets the sticky abort flag; every block then leaves its
  queue and reaches the exit grid sync, so the kernel ends normally and the context stays usable.
  :meth:`Launcher.check` raises :class:`WatchdogAbort` carrying the per-block dump (which task, which
  counter, its value, the threshold); :meth:`Launcher.clear_abort` re-arms it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
from mosaic.errors import CheckFailed, MosaicError

from mosaic_amk import rope_order
from mosaic_amk.cuda import encode as E
from mosaic_amk.schedule import Schedule
from mosaic_amk.validate import ValidationResult, validate

CTRL_HEAD, DUMP_WORDS = 16, 8
C_ABORT, C_ERROR, C_ABORTED = 0, 1, 2
STATES = {0: "idle", 1: "running", 2: "done", 3: "timeout", 4: "peer-abort", 5: "skipped"}
ERRORS = {1: "embed token outside the table", 2: "position outside the KV cache / RoPE table",
          4: "attention context longer than the score buffer in shared memory",
          8: "a GEMV's x (with a fused GEMV's rows and cos/sin) does not fit the block's shared memory",
          16: "attention over K rows in the blocked RoPE order that could not be staged in shared memory",
          32: "a quantized weight in a VM built without AMK_QUANT=1 (the bf16-only build)"}
MODES = {"f32": 0, "hf-bf16": 1}
# vm.cu sync_flags (SYNC_* there; test_cuda_launcher checks they agree): bit 0 relaxed waits, bits 1-2 the
# signal mode, bit 3 side-warp prefetch
WAIT_FLAGS = {"acquire": 0, "relaxed": 1}
SIGNAL_FLAGS = {"inline": 0 << 1, "merged": 1 << 1, "side": 2 << 1}
PREFETCH_FLAGS = {"inline": 0, "side": 8}


def sync_flags(wait_mode: str = "acquire", signal_mode: str = "inline", prefetch_mode: str = "inline") -> int:
    """The VM's sync_flags launch argument for the three synchronisation modes (config.WAIT_MODES etc.)."""
    for what, table, value in (("wait_mode", WAIT_FLAGS, wait_mode), ("signal_mode", SIGNAL_FLAGS, signal_mode),
                               ("prefetch_mode", PREFETCH_FLAGS, prefetch_mode)):
        if value not in table:
            raise DeviceError(f"{what} must be one of {', '.join(table)}, got {value!r}")
    return WAIT_FLAGS[wait_mode] | SIGNAL_FLAGS[signal_mode] | PREFETCH_FLAGS[prefetch_mode]
SKIPPABLE = {name: 1 << code for name, code in E.OP_CODE.items()}


class DeviceError(MosaicError):
    """The GPU side failed: no CUDA device or cupy, a launch error, or an error bit the VM raised."""


class WatchdogAbort(MosaicError):
    """A wait exceeded the watchdog timeout; the launch was aborted. ``dump`` has one entry per block."""

    exit_code = 1

    def __init__(self, dump: list[dict], timeout_s: float):
        self.dump = dump
        origin = [d for d in dump if d["state"] == "timeout"]
        first = origin[0] if origin else (dump[0] if dump else {})
        what = (f"watchdog: block {first.get('block')} (SM {first.get('smid')}) waited > {timeout_s:g} s on task "
                f"{first.get('task')}: counter {first.get('counter')} = {first.get('value')}, needs >= "
                f"{first.get('threshold')}; {sum(d['state'] == 'peer-abort' for d in dump)} other block(s) "
                f"aborted, {sum(d['state'] == 'done' for d in dump)} had finished")
        super().__init__(what)


def gate(schedule: Schedule, unsafe: bool = False) -> ValidationResult:
    """Validate; refuse (CheckFailed, exit 1) a rejected schedule unless ``unsafe``."""
    result = validate(schedule)
    if not result.ok and not unsafe:
        raise CheckFailed("the validator rejects this schedule; the CUDA VM does not launch it "
                          "(--unsafe forces a launch, for tests)", list(result.diagnostics))
    return result


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise DeviceError(f"the CUDA VM needs cupy ({exc})") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise DeviceError("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise DeviceError(f"no usable CUDA device: {exc}") from None
    return cupy


ATT_NB, MAX_HEAD_DIM = 8, 512  # kernels/attention.cuh: heads per attention batch; encode.py: largest head_dim


def attention_smem_floats(tokens: int, threads: int, head_dim: int = MAX_HEAD_DIM) -> int:
    """Dynamic shared memory (floats) the attention micro-kernel needs for one head over ``tokens`` cached
    tokens: q of ATT_NB heads, the per-warp reduction slots, the p @ v partial sums, one score per token."""
    return ATT_NB * head_dim + (threads // 32) * ATT_NB + 4 * threads + tokens


def staged_tokens(head_dim: int, heads: int, threads: int, smem_bytes: int) -> int:
    """The longest context (cached tokens, this step's included) an attention task of ``heads`` query heads of one
    KV group stages in ``smem_bytes`` of general area (kernels/attention.cuh att_shape: q, reductions, partial sums, the
    scores, then K and V rows of head_dim + 4 floats). A task with K rows in the blocked RoPE order (rope_order.py)
    runs only staged."""
    room = smem_bytes // 4 - (ATT_NB * head_dim + (threads // 32) * ATT_NB + 4 * threads)
    nbt, ld = min(heads, ATT_NB), head_dim + 4
    n = max(0, room // (nbt + 2 * ld))
    while n > 0 and ((nbt * n + 3) & ~3) + 2 * n * ld > room:
        n -= 1
    return n


def blocked_attention_problem(enc: E.Encoded, threads: int, smem_bytes: int) -> str | None:
    """Why an attention task with K rows in the blocked RoPE order (F_ROPE_BLOCK) could not always run staged, as
    it must (not flagged F_KV_STAGE, heads of two KV groups, or more cached tokens than the staging holds); None
    when every such task can."""
    for rec in enc.tasks:
        if rec[E.W_OP] != E.OP_CODE["attention"] or not rec[E.W_FLAGS] & E.F_ROPE_BLOCK:
            continue
        hd, rep = int(rec[E.W_HD]), int(rec[E.W_NH]) // max(1, int(rec[E.W_NKV]))
        h0, h1 = int(rec[E.W_ROW0]) // hd, int(rec[E.W_ROW1]) // hd
        if not rec[E.W_FLAGS] & E.F_KV_STAGE:
            return (f"attention task {int(rec[E.W_ID])} has K rows in the blocked RoPE order but may not be staged "
                    "(F_KV_STAGE: it or a writer of its caches is not at the launch's position)")
        if h0 // rep != (h1 - 1) // rep:
            return f"attention task {int(rec[E.W_ID])}: blocked RoPE order with heads of two KV groups"
        most = staged_tokens(hd, h1 - h0, threads, smem_bytes)
        if enc.max_attention_tokens > most:
            return (f"rope_order blocked: attention over up to {enc.max_attention_tokens} cached tokens, the staging "
                    f"holds {most} (head_dim {hd}, {h1 - h0} heads per task, {smem_bytes} bytes): lower "
                    "kv_max_tokens or use rope_order standard")
    return None


def rope_table(inv_freq: np.ndarray, head_dim: int, attention_scaling: float, positions: int) -> np.ndarray:
    """[positions, 2 * head_dim] float32: cos then sin of every position, exactly ops.rope_tables."""
    from mosaic_amk.ops import rope_tables

    out = np.empty((positions, 2 * head_dim), np.float32)
    for p in range(positions):
        cos, sin = rope_tables(inv_freq, p, attention_scaling)
        out[p, :head_dim], out[p, head_dim:] = cos, sin
    return out


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        r[nan] = 0x7FC0
    return r


def bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 and back (what the device stores for a weight)."""
    return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32).reshape(np.shape(a))


def _ptr(arr: Any) -> int:
    if hasattr(arr, "data_ptr"):  # torch
        return int(arr.data_ptr())
    if hasattr(arr, "data") and hasattr(arr.data, "ptr"):  # cupy
        return int(arr.data.ptr)
    if isinstance(arr, int):
        return arr
    raise DeviceError(f"cannot take a device pointer of {type(arr).__name__}")


def _nbytes(arr: Any) -> int:
    if hasattr(arr, "element_size"):
        return int(arr.numel() * arr.element_size())
    return int(arr.nbytes)


@attrs.define
class Launcher:
    """Device state for one encoded schedule. ``bind`` weights, then ``launch`` (asynchronous) and
    ``check`` (synchronises; raises on a watchdog abort or a VM error bit)."""

    enc: E.Encoded
    cubin: str
    threads: int = 512
    smem_bytes: int = 0
    ring_bytes: int = 0  # the weight stream's ring (a cubin built with AMK_WSTREAM), after the smem_bytes area
    table_in_smem: bool = True  # copy the buffer table and producer counts into shared memory (vm.cu) when they fit
    table_bytes: int = attrs.field(default=0, init=False)
    mode: str = "hf-bf16"
    timeout_s: float = 1.0
    prefetch_depth: int = 1
    wait_mode: str = "acquire"
    signal_mode: str = "inline"
    prefetch_mode: str = "inline"
    trace: bool = False  # a cubin built with AMK_TRACE: per-task timestamps of the last step (trace_stamps)
    cp: Any = None
    fn: Any = None
    dev: dict = attrs.field(factory=dict)  # name -> owned cupy array
    ptrs: np.ndarray | None = None
    keep: list = attrs.field(factory=list)  # external arrays kept alive
    tables: dict = attrs.field(factory=dict)
    rope_positions: int = attrs.field(default=0, init=False)
    sync: int = attrs.field(default=0, init=False)  # sync_flags of the three modes

    def __attrs_post_init__(self) -> None:
        if self.mode not in MODES:
            raise DeviceError(f"precision mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.sync = sync_flags(self.wait_mode, self.signal_mode, self.prefetch_mode)
        cp = self.cp = _cupy()
        dev = cp.cuda.Device()
        attr = lambda code: int(cp.cuda.runtime.deviceGetAttribute(code, dev.id))  # noqa: E731
        # cudaDevAttrMultiProcessorCount 16, MaxSharedMemoryPerBlockOptin 97, MaxSharedMemoryPerMultiprocessor 81,
        # CooperativeLaunch 95
        sms, optin, per_sm = attr(16), attr(97), attr(81)
        if not attr(95):
            raise DeviceError("this GPU does not support cooperative launches")
        if self.enc.num_sms > sms:
            raise DeviceError(f"the schedule uses {self.enc.num_sms} SMs, this GPU has {sms}")
        mod = cp.RawModule(path=self.cubin, enable_cooperative_groups=True)
        self.fn = mod.get_function("amk_vm")
        # static shared memory (task records, reductions, the stream's barriers) counts against the same opt-in limit
        static = getattr(self.fn, "shared_size_bytes", None)
        optin -= int(static) if static is not None else 4096
        # one block per SM: ask for more than half of an SM's shared memory so two blocks never share one
        # (with a ring and no smem_bytes asked for: the ScheduleConfig default general area, 96 KB)
        want = max(self.smem_bytes or (96 * 1024 if self.ring_bytes else 0), per_sm // 2 + 1024 - self.ring_bytes)
        self.smem_bytes = min(want, optin - self.ring_bytes) // 16 * 16
        need = 4 * attention_smem_floats(self.enc.max_attention_tokens, self.threads)
        if need > self.smem_bytes:
            raise DeviceError(f"attention over {self.enc.max_attention_tokens} cached tokens needs {need} bytes of "
                              f"shared memory for scores; the block has {self.smem_bytes} (lower kv_max_tokens)")
        problem = blocked_attention_problem(self.enc, self.threads, self.smem_bytes)
        if problem:
            raise DeviceError(problem)
        # the buffer table (8-byte pointer + AMK_BUF_META ints per buffer) and the producer counts, after the ring
        nbuf = len(self.enc.buffers)
        table = -(-(nbuf * (8 + 4 * E.BUF_META) + 4 * max(1, self.enc.num_counters)) // 16) * 16
        if self.table_in_smem and self.smem_bytes + self.ring_bytes + table <= optin:
            self.table_bytes = table
        self._raise_smem_limit()
        e = self.enc
        self.tables = {"tasks": cp.asarray(e.tasks), "qoff": cp.asarray(e.queue_offsets),
                       "queue": cp.asarray(e.queue), "meta": cp.asarray(e.buf_meta),
                       "counters": cp.zeros(max(1, e.num_counters), cp.int32),
                       "producers": cp.asarray(e.producers if e.producers is not None
                                               else np.zeros(max(1, e.num_counters), np.int32)),
                       "control": cp.zeros(CTRL_HEAD + DUMP_WORDS * e.num_sms, cp.int32),
                       "rope": cp.zeros(2, cp.float32)}
        if self.trace:
            self.tables["trace"] = cp.zeros(3 * max(1, len(e.queue)), cp.uint64)
        self.ptrs = np.zeros(max(1, len(e.buffers)), np.uint64)
        self.rope_positions = 0

    # ------------------------------------------------------------------------------------ buffers
    def bind(self, weights: Mapping[str, Any], inputs: Mapping[str, np.ndarray] | None = None) -> None:
        """Bind every weight buffer to a device array of the right dtype and size (torch tensor or cupy
        array; a numpy float32 array is converted: bf16 for bf16 buffers) and allocate the rest (KV cache
        zeroed, activations NaN-filled so a read of an unwritten value poisons the result)."""
        cp = self.cp
        inputs = inputs or {}
        for i, b in enumerate(self.enc.buffers):
            if b.kind == "weight":
                arr = rope_order.resolve(weights.get, b.name)  # a blocked RoPE-order name: rows permuted (a copy)
                if arr is None:
                    raise DeviceError(f"no array for weight buffer {b.name}")
                if hasattr(arr, "device_bytes"):  # a quant.QuantizedTensor: its planes, as the micro-kernels read them
                    if E.QUANT_DT.get(arr.format) != b.dtype:
                        raise DeviceError(f"weight {b.name} is {arr.format}, the schedule's buffer is "
                                          f"{E.DTYPE_NAMES[b.dtype]}")
                    arr = cp.asarray(arr.device_bytes())
                    self.dev[b.name] = arr
                elif isinstance(arr, np.ndarray):
                    if b.dtype in E.QUANT_DT.values():
                        raise DeviceError(f"weight {b.name}: a float array for a {E.DTYPE_NAMES[b.dtype]} buffer")
                    host = bf16_bits(arr) if b.dtype == E.DT_BF16 else np.ascontiguousarray(arr, np.float32)
                    arr = cp.asarray(host)
                    self.dev[b.name] = arr
                else:
                    self.keep.append(arr)
                    dt = str(getattr(arr, "dtype", ""))
                    want = {E.DT_BF16: "bfloat16", E.DT_F32: "float32", E.DT_I32: "int32"}[b.dtype]
                    if want not in dt and not (b.dtype == E.DT_BF16 and dt == "uint16"):
                        raise DeviceError(f"weight {b.name} is {dt} on the device, the VM reads {want}")
                    if hasattr(arr, "is_contiguous") and not arr.is_contiguous():
                        raise DeviceError(f"weight {b.name} is not contiguous")
                if _ptr(arr) % 16:
                    raise DeviceError(f"weight {b.name} is not 16-byte aligned (the GEMV reads 16-byte vectors)")
                if _nbytes(arr) != b.nbytes:
                    raise DeviceError(f"weight {b.name}: {_nbytes(arr)} bytes on the device, the schedule needs "
                                      f"{b.nbytes} ({list(b.shape)} {E.DTYPE_NAMES[b.dtype]})")
                self.ptrs[i] = _ptr(arr)
            else:
                dtype = {E.DT_F32: cp.float32, E.DT_I32: cp.int32, E.DT_BF16: cp.uint16}[b.dtype]
                if b.kind == "input" and b.name in inputs:
                    arr = cp.asarray(np.ascontiguousarray(inputs[b.name]).astype(dtype).reshape(b.shape))
                elif b.kind == "kv_cache":
                    arr = cp.zeros(b.shape, dtype)
                elif dtype == cp.float32:
                    arr = cp.full(b.shape, np.nan, dtype)
                else:
                    arr = cp.full(b.shape, -1, dtype)
                self.dev[b.name] = arr
                self.ptrs[i] = _ptr(arr)
        self.tables["bptr"] = cp.asarray(self.ptrs)
        if self.enc.rope is not None:
            name, hd, ascale = self.enc.rope
            inv = weights.get(name)
            inv = inv.detach().float().cpu().numpy() if hasattr(inv, "detach") else (
                cp.asnumpy(inv) if not isinstance(inv, np.ndarray) else inv)
            positions = max(self.enc.max_attention_tokens, int(self.enc.tasks[:, E.W_POS].max()) + 1, 1)
            self.tables["rope"] = cp.asarray(rope_table(np.asarray(inv, np.float32), hd, ascale, positions))
            self.rope_positions = positions

    def reset_kv(self) -> None:
        for b in self.enc.buffers:
            if b.kind == "kv_cache":
                self.dev[b.name].fill(0)

    def array(self, name: str):
        return self.dev[name]

    # ------------------------------------------------------------------------------------ launching
    def _raise_smem_limit(self) -> None:
        """Make the kernel's dynamic shared memory limit at least what this launcher launches with. The limit is an
        attribute of the CUDA function, and cupy shares one loaded module (one CUfunction) between every RawModule of
        the same cubin path (``_get_raw_module`` is memoized per device): a Launcher created later with a smaller
        table (fewer buffers / counters: a fused schedule) used to set it LOWER, so an earlier launcher of the same
        build asked for more than the limit, cupy's cooperative occupancy query found 0 blocks per SM ("grid size
        will be reduced from 132 to 0") and the launch failed with CUDA_ERROR_INVALID_VALUE (the unfused bench
        candidates after the fused ones). Only ever raised, checked before every launch."""
        need = self.smem_bytes + self.ring_bytes + self.table_bytes
        if int(self.fn.max_dynamic_shared_size_bytes) < need:
            self.fn.max_dynamic_shared_size_bytes = need

    def launch(self, position: int | None = None, token_in: int = 0, token_out: int = 0, *,
               skip_ops: int = 0, prefetch_depth: int | None = None, n_steps: int = 1, token_stride: int = 0,
               sync: int | None = None) -> None:
        """Enqueue one launch (asynchronous). ``token_in``/``token_out`` are device pointers that replace
        the ``token``/``next_token`` buffers (0: use the bound buffers). ``n_steps`` > 1 runs that many decode
        steps in the one launch, at positions ``position ..``, step s reading ``token_in + s * token_stride``
        and writing ``token_out + s * token_stride`` (a grid sync between steps; see vm.cu). ``sync`` overrides
        the launcher's sync_flags (:func:`sync_flags`) for this launch."""
        e, t = self.enc, self.tables
        if n_steps < 1 or (n_steps > 1 and token_stride and not (token_in and token_out)):
            raise DeviceError("a multi-step launch needs n_steps >= 1 (and device token pointers to step through)")
        pos = e.position if position is None else position
        tok_b = e.token_buf if token_in else -1
        nxt_b = e.next_buf if token_out else -1
        args = (np.uint64(_ptr(t["tasks"])), np.uint64(_ptr(t["qoff"])), np.uint64(_ptr(t["queue"])),
                np.uint64(_ptr(t["bptr"])), np.uint64(_ptr(t["meta"])), np.uint64(_ptr(t["counters"])),
                np.uint64(_ptr(t["producers"])), np.int32(e.num_counters), np.uint64(_ptr(t["control"])), np.uint64(token_in), np.uint64(token_out),
                np.int32(tok_b), np.int32(nxt_b), np.uint64(_ptr(t["rope"])), np.int32(self.rope_positions),
                np.int32(pos if pos is not None else 0), np.int32(MODES[self.mode]),
                np.int64(int(self.timeout_s * 1e9)),
                np.int32(self.prefetch_depth if prefetch_depth is None else prefetch_depth),
                np.int32(skip_ops), np.int32(self.smem_bytes), np.int32(n_steps), np.int32(token_stride),
                np.int32(self.sync if sync is None else sync),
                np.int32(len(e.buffers) if self.table_bytes else 0),
                np.uint64(_ptr(t["trace"]) if "trace" in t else 0))
        self._raise_smem_limit()
        try:
            self.fn((e.num_sms,), (self.threads,), args,
                    shared_mem=self.smem_bytes + self.ring_bytes + self.table_bytes)
        except Exception as exc:  # cupy raises CUDADriverError / CUDARuntimeError
            raise DeviceError(f"VM launch failed: {exc}") from None

    def control(self) -> np.ndarray:
        return self.cp.asnumpy(self.tables["control"])

    def trace_stamps(self) -> np.ndarray:
        """The last launch's last step, per queue entry: (top of the iteration, waits held, outputs stored) in
        %globaltimer ns, int64 [queue entries, 3] (zeros for entries that did not run). Needs ``trace=True`` and a
        cubin built with AMK_TRACE=1 (bench/trace.py turns them into a timeline)."""
        if "trace" not in self.tables:
            raise DeviceError("this launcher was made without trace=True")
        return self.cp.asnumpy(self.tables["trace"]).astype(np.int64).reshape(-1, 3)

    def dump(self, ctrl: np.ndarray | None = None) -> list[dict]:
        ctrl = self.control() if ctrl is None else ctrl
        out = []
        for b in range(self.enc.num_sms):
            d = [int(v) for v in ctrl[CTRL_HEAD + DUMP_WORDS * b: CTRL_HEAD + DUMP_WORDS * (b + 1)]]
            out.append({"block": b, "state": STATES.get(d[0], str(d[0])), "task": d[1], "counter": d[2],
                        "value": d[3], "threshold": d[4], "queue_pos": d[5], "smid": d[6], "elapsed_us": d[7]})
        return out

    def check(self) -> None:
        """Synchronise; raise WatchdogAbort (with the dump) or DeviceError (VM error bits)."""
        try:
            self.cp.cuda.Device().synchronize()
        except Exception as exc:
            raise DeviceError(f"the VM kernel failed: {exc}") from None
        ctrl = self.control()
        if ctrl[C_ABORT]:
            raise WatchdogAbort(self.dump(ctrl), self.timeout_s)
        if ctrl[C_ERROR]:
            bits = [msg for bit, msg in ERRORS.items() if ctrl[C_ERROR] & bit]
            raise DeviceError("the VM reported: " + "; ".join(bits))

    def clear_abort(self) -> None:
        self.tables["control"].fill(0)

    def sm_ids(self) -> list[int]:
        """%smid of every block at its last launch (distinct when each block had an SM to itself)."""
        return [d["smid"] for d in self.dump()]
