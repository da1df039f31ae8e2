"""ScheduleConfig: the structured object an agent or tuner edits instead of kernel code.

Lowering turns (ModelSpec, ScheduleConfig, GpuTarget, position) into a Schedule deterministically; the
validator then gates the result. Field values are checked at construction (types, ranges, vocabularies);
``check(gpu)`` checks them against a GPU record (SM count, threads and shared memory per block) and
returns every problem, and ``for_gpu(gpu)`` raises one BadInput line listing them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
from mosaic import budget
from mosaic.errors import BadInput
from mosaic.fields import fail, non_negative_int, one_of, positive
from mosaic.records import GpuTarget
from mosaic.tomlfile import read_toml

DEFAULT_FUSIONS = ("residual", "gate_up_silu", "rope_append")
# Fusions beyond the defaults (numpy semantics, validator and executor support). rmsnorm_gemv, gemv_rope_append
# and split_argmax also run in the CUDA VM (their ops are in ops.SPECS; ScheduleConfig() leaves them off, the CUDA
# VM's CUDA_DEFAULT below turns the first two on); split_kv uses ops.FUSED_SPECS, which the CUDA VM does not
# implement yet (docs/amk-cuda.md).
CPU_FUSIONS = ("rmsnorm_gemv", "gemv_rope_append", "split_kv", "split_argmax")
FUSIONS = DEFAULT_FUSIONS + CPU_FUSIONS
# every fusion the CUDA VM runs: 5 serial stages per layer instead of 8 (lowering.layer_stages)
VM_FUSIONS = DEFAULT_FUSIONS + ("rmsnorm_gemv", "gemv_rope_append")
SM_POLICIES = ("round_robin", "least_loaded", "single")
# where the attention tasks go (round_robin only): "round_robin" (the next SMs in turn) or "apart" (the last SMs,
# with the o-projection's tasks cut over the other SMs, so no SM runs an attention task and an o-proj task of one
# layer back to back; docs/amk-cuda.md: those o-proj tasks finished last), "apart_qkv" (the attention on the last SMs,
# only the q/k/v blocks kept off them), or "auto": apart when the o-projection over the remaining SMs is at most
# AUTO_APART_MAX_WEIGHTS_PER_SM weights per SM, else apart_qkv
ATTENTION_PLACEMENTS = ("round_robin", "apart", "auto", "apart_qkv")
# how q and the K cache store a head's dims (rope_order.py): "standard", or "blocked" (blocks of 4 dims and their 4
# RoPE partners, so the q/k GEMVs split into 8-row tasks; with gemv_split balanced the q, k and v GEMVs share the SMs
# in proportion to their rows, one task per SM, v cut by rows)
ROPE_ORDERS = ("standard", "blocked")
# "auto"'s bound: 16K weights (32 KB of bf16, about 1 us of one H200 SM's share of HBM bandwidth) per o-proj SM. Apart
# saves about 1.3 us of hand-off per layer and costs the attention SMs' bandwidth. Measured on the H200
# (results/2026-11-30/session5/run1): SmolLM2-135M (2.7K weights per SM apart) 0.764 -> 0.739 ms/token,
# Llama-3.2-1B (42K) 0.959 -> 0.967; apart_qkv there 0.900 -> 0.883 (session5/run9).
AUTO_APART_MAX_WEIGHTS_PER_SM = 16384
# how a GEMV's output rows are cut into tasks: "rows" (gemv_rows_per_task rows each, the last one shorter) or
# "balanced" (as many tasks as SMs, or fewer when the GEMV has fewer row units, sizes differing by at most one unit:
# every GEMV stage then runs one task per SM; a unit is one row, a whole head for the RoPE GEMVs)
GEMV_SPLITS = ("rows", "balanced")
# the CUDA VM's synchronisation variants (vm.cu sync_flags; docs/amk-cuda.md "Synchronisation variants"); the
# first of each is the v0 path, the default until the device run compares them
WAIT_MODES = ("acquire", "relaxed")
SIGNAL_MODES = ("inline", "merged", "side")
PREFETCH_MODES = ("inline", "side")
# weight_preload: 16-byte weight loads per lane issued before a GEMV task's wait (vm.cu / kernels/gemv_rows.cuh
# AMK_WEIGHT_PRELOAD, a build define; docs/amk-cuda.md "Weight preload"); 0 = off. The values whose build is
# spill-free (ptxas, sm_90a, nvcc 13.0; test_cuda_preload builds each): 4 spills 8 bytes, so it is not offered
WEIGHT_PRELOADS = (0, 2, 6, 8)
# weight_stream: ring slots per warp of the TMA weight stream (vm.cu / kernels/gemv_rows.cuh AMK_WSTREAM, a build define;
# docs/amk-cuda.md "Weight stream"), WS_PIECE bytes each; 0 = off. Exclusive with weight_preload.
WEIGHT_STREAMS = (0, 2, 4)
WS_PIECE = 2048  # bytes per ring slot (kernels/common.cuh WS_PIECE)
# pages: the page protocol (docs/amk-schedule.md "Pages"): 0 = off, else the pages of each SM's pool (at most the
# descriptor's MAX_PAGE_OPS acquires per task), page_bytes each, on top of smem_bytes
MAX_CONFIG_PAGES = 8


def _fusion(inst, attribute, value) -> None:
    bad = [f for f in value if f not in FUSIONS]
    if bad or len(set(value)) != len(value):
        fail(inst, attribute, list(value), f"distinct names from {', '.join(FUSIONS)}")


def _pow2(inst, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value & (value - 1):
        fail(inst, attribute, value, "a power of two >= 1")


def _int_pos(inst, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        fail(inst, attribute, value, "an integer")
    positive(inst, attribute, value)


def _preload(inst, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value not in WEIGHT_PRELOADS:
        fail(inst, attribute, value, f"one of {', '.join(map(str, WEIGHT_PRELOADS))}")


def _stream(inst, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value not in WEIGHT_STREAMS:
        fail(inst, attribute, value, f"one of {', '.join(map(str, WEIGHT_STREAMS))}")


def _pages(inst, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not (value == 0 or 2 <= value <= MAX_CONFIG_PAGES):
        fail(inst, attribute, value, f"0 (off) or 2 .. {MAX_CONFIG_PAGES}")


def _warp_multiple(inst, attribute, value) -> None:
    _int_pos(inst, attribute, value)
    if value % 32:
        fail(inst, attribute, value, "a multiple of 32 (whole warps)")


@attrs.frozen
class ScheduleConfig:
    """How one decode step is cut into tasks and placed on SMs.

    - ``gemv_rows_per_task``: output rows per GEMV task (q/k/v/o, gate/up/down); ``lm_head_rows_per_task``
      the same for the LM head (0: same as gemv_rows_per_task).
    - ``gemv_split``: ``rows`` (the GEMVs are cut into ``gemv_rows_per_task``-row tasks) or ``balanced`` (each GEMV
      is cut into ``min(num_sms, row units)`` tasks of near-equal size, a unit being one row, or one whole head for
      the RoPE GEMVs; the LM head too unless ``lm_head_rows_per_task`` is set): one task per SM per GEMV stage.
    - ``attention_kv_heads_per_task``: KV heads (with their query-head group) per attention task;
      ``attention_q_heads_per_task`` (0: the whole group) cuts each KV head's query-head group further into tasks of
      that many query heads (each task reads its KV head's cache rows itself: more SMs, shorter tasks; every head's
      arithmetic is the same, so the results are too). Needs ``attention_kv_heads_per_task`` = 1 when set.
    - ``fusion``: which fusions to apply (see docs/amk.md): ``residual`` (o-proj/down GEMV tasks add the
      residual), ``gate_up_silu`` (one task computes rows of silu(gate)*up), ``rope_append`` (RoPE of k
      and the KV append in one task); off by default (CPU only until the CUDA VM has the ops):
      ``rmsnorm_gemv`` (each GEMV row task normalises its input itself: no RMSNorm stage),
      ``gemv_rope_append`` (q GEMV rows apply RoPE, k/v GEMV rows write their columns of the KV slot:
      no RoPE/append stage), ``split_kv`` (attention per KV chunk, ``attention_kv_splits`` chunks, then a
      combine), ``split_argmax`` (argmax per ``argmax_rows_per_task`` logits, then a combine).
    - ``sm_policy``: ``round_robin`` (task i of the list on SM i mod num_sms), ``least_loaded`` (each task
      on the SM with the fewest weight bytes so far), ``single`` (everything on SM 0; for debugging).
    - ``attention_placement``: ``round_robin`` (attention tasks take the next SMs like every task) or ``apart``
      (sm_policy round_robin only): the attention tasks of a layer on the last SMs, that layer's o-projection cut
      over the other SMs (one task each with the balanced split), so no SM runs an attention task and then an
      o-proj task of the same layer (schedule placement only: the same bits), or ``auto`` (apart when the
      o-projection is small: at most ``AUTO_APART_MAX_WEIGHTS_PER_SM`` weights per remaining SM, else apart_qkv), or
      ``apart_qkv`` (the attention tasks on the last SMs, only the q/k/v blocks of ``rope_order`` blocked kept off
      them; the o-projection over every SM).
    - ``num_sms``: SMs to use (0: all SMs of the GPU).
    - ``prefetch_depth`` / ``prefetch_tile_bytes``: weight tiles in flight per block (cp.async stages); the CUDA VM
      L2-prefetches the weights of the next ``prefetch_depth`` tasks of its queue (the current one included), at most
      ``prefetch_max_bytes`` of each task (0: all of its rows; a cap keeps a stage's prefetch inside the L2).
    - ``threads_per_block``, ``smem_bytes``: the persistent block's shape.
    - ``wait_mode`` / ``signal_mode`` / ``prefetch_mode``: the CUDA VM's task-loop synchronisation (launch
      flags, not schedule structure): ``acquire`` (ld.acquire.gpu every poll) or ``relaxed`` (ld.relaxed.gpu
      polls, one fence.acquire.gpu after the waits hold); ``inline`` (3 block barriers per task, thread 0
      signals), ``merged`` (2 barriers, thread 0 signals the previous task before its wait) or ``side``
      (2 barriers, warp 1 signals while thread 0 waits); ``inline`` (every thread issues the L2 prefetches
      before the head barrier) or ``side`` (warp 1 issues them while thread 0 waits).
    - ``weight_preload``: 0 (off) or N in ``WEIGHT_PRELOADS``: before a GEMV-family task's wait, each lane loads
      the first N 16-byte chunks of its warp's first row (gate and up: N/2 each) into registers, consumed after
      the wait (bit-identical results); a build variant of the VM (``AMK_WEIGHT_PRELOAD``), not schedule
      structure.
    - ``weight_stream``: 0 (off) or N in ``WEIGHT_STREAMS``: each warp streams its GEMV rows through N shared-memory
      slots of ``WS_PIECE`` bytes filled by bulk copies (TMA), the first N issued before the task's wait
      (bit-identical results); a build variant of the VM (``AMK_WSTREAM``) whose ring (``ring_bytes``) comes on top of
      ``smem_bytes``; exclusive with ``weight_preload``.
    - ``gemv_pingpong``: a build variant of the GEMV row loop (``AMK_GEMV_PP``): a lane's weight chunks in two groups
      of 4 double-buffered in the registers of one burst of 8 (loads in flight while a group is added), the same
      order of additions as the bursts of 8 (bit-identical).
    - ``attention_stage``: a build variant of the attention (``AMK_ATT_STAGE``): before an attention task's wait, its
      KV group's cached rows of earlier positions are copied to shared memory (cp.async), so after the wait only q
      and this step's row are read from global memory (bit-identical; needs the encoder's ``F_KV_STAGE``, rows
      that fit the general area and the task's heads in one KV group, else the task reads global memory).
    - ``rope_order``: ``standard`` or ``blocked`` (needs the ``gemv_rope_append`` fusion): q and the K cache store
      each head in blocks of 4 dims and their 4 RoPE partners (rope_order.py; the q/k weights are bound with their
      rows permuted the same way), so the q and k GEMVs split into tasks of whole 8-row blocks instead of whole
      heads; with the balanced split the q, k and v GEMVs share the SMs in proportion to their rows (one task per
      SM; v cut by rows). The attention reads q and K back in the standard order: the same bits. The CUDA VM reads
      blocked K rows only through the attention's staging: without ``attention_stage``, or with a KV capacity the
      staging cannot hold, the CudaVM runs the standard order (cuda_vm.staged_rope_order).
    - ``kv_page_tokens``, ``kv_max_tokens``: KV cache page size and capacity in tokens (0: the model's
      max_position_embeddings rounded up to a page).
    - ``pages`` / ``page_bytes``: the page protocol (schedule structure; docs/amk-schedule.md "Pages"): 0 (off), or
      each SM gets a pool of ``pages`` shared-memory pages of ``page_bytes`` bytes, and every GEMV-family task's
      weight rows (as many of its first rows as fit a page) are prefetched by the SM's loader into a page of a
      ring, acquired ahead (``pages - 1`` GEMV tasks ahead, or as soon as the page's previous reader's stage has
      finished), read by the task and released after it. The CPU VMs and the CUDA VM run such a schedule reading
      global memory (the pages are copies); the validator and the oracle check the protocol. Left out of
      ``to_json`` while both are at their defaults (earlier configs keep their JSON).
    """

    gemv_rows_per_task: int = attrs.field(default=64, validator=_int_pos)
    lm_head_rows_per_task: int = attrs.field(default=0, validator=non_negative_int)
    gemv_split: str = attrs.field(default="rows", validator=one_of(*GEMV_SPLITS))
    attention_kv_heads_per_task: int = attrs.field(default=1, validator=_int_pos)
    attention_q_heads_per_task: int = attrs.field(default=0, validator=non_negative_int)
    fusion: tuple = attrs.field(default=DEFAULT_FUSIONS, converter=tuple, validator=_fusion)
    attention_kv_splits: int = attrs.field(default=4, validator=_int_pos)
    argmax_rows_per_task: int = attrs.field(default=4096, validator=_int_pos)
    sm_policy: str = attrs.field(default="round_robin", validator=one_of(*SM_POLICIES))
    attention_placement: str = attrs.field(default="round_robin", validator=one_of(*ATTENTION_PLACEMENTS))
    num_sms: int = attrs.field(default=0, validator=non_negative_int)
    prefetch_depth: int = attrs.field(default=2, validator=non_negative_int)
    prefetch_tile_bytes: int = attrs.field(default=16384, validator=_int_pos)
    prefetch_max_bytes: int = attrs.field(default=0, validator=non_negative_int)
    threads_per_block: int = attrs.field(default=512, validator=_warp_multiple)
    smem_bytes: int = attrs.field(default=96 * 1024, validator=_int_pos)
    kv_page_tokens: int = attrs.field(default=16, validator=_pow2)
    kv_max_tokens: int = attrs.field(default=0, validator=non_negative_int)
    wait_mode: str = attrs.field(default="acquire", validator=one_of(*WAIT_MODES))
    signal_mode: str = attrs.field(default="inline", validator=one_of(*SIGNAL_MODES))
    prefetch_mode: str = attrs.field(default="inline", validator=one_of(*PREFETCH_MODES))
    weight_preload: int = attrs.field(default=0, validator=_preload)
    weight_stream: int = attrs.field(default=0, validator=_stream)
    gemv_pingpong: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    attention_stage: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    rope_order: str = attrs.field(default="standard", validator=one_of(*ROPE_ORDERS))
    pages: int = attrs.field(default=0, validator=_pages)
    page_bytes: int = attrs.field(default=16384, validator=_int_pos)

    @attention_placement.validator
    def _apart_round_robin(self, attribute, value):
        if value != "round_robin" and self.sm_policy != "round_robin":
            fail(self, attribute, value, "round_robin when sm_policy is not round_robin (apart places by SM number)")

    @weight_stream.validator
    def _stream_alone(self, attribute, value):
        if value and self.weight_preload:
            fail(self, attribute, value, "0 when weight_preload is set (the stream issues the first loads itself)")

    @prefetch_depth.validator
    def _depth(self, attribute, value):
        if value > 8:
            fail(self, attribute, value, "<= 8")

    @attention_q_heads_per_task.validator
    def _q_heads(self, attribute, value):
        if value and self.attention_kv_heads_per_task != 1:
            fail(self, attribute, value, "0 unless attention_kv_heads_per_task is 1")

    @rope_order.validator
    def _rope_order(self, attribute, value):
        if value == "blocked" and "gemv_rope_append" not in self.fusion:
            fail(self, attribute, value, "standard without the gemv_rope_append fusion (only the RoPE GEMVs write "
                                          "q and the K cache in the blocked order)")

    @kv_max_tokens.validator
    def _kv_max(self, attribute, value):
        if value % self.kv_page_tokens:
            fail(self, attribute, value, f"a multiple of kv_page_tokens ({self.kv_page_tokens})")

    # ------------------------------------------------------------------------------------------ gpu
    def check(self, gpu: GpuTarget) -> list[str]:
        """Every way this config does not fit ``gpu`` (empty when it fits): :mod:`mosaic.budget`'s rules, worded
        for a config, then the prefetch ring's own bound."""
        block = budget.Footprint(where="config", smem_bytes=self.smem_bytes, threads=self.threads_per_block,
                                 sms=self.num_sms)
        words = {"sm-count": f"num_sms={self.num_sms} > {gpu.name} sm_count {gpu.sm_count}",
                 "threads-per-block": f"threads_per_block={self.threads_per_block} > {gpu.name} max_threads_per_block "
                                      f"{gpu.max_threads_per_block}",
                 "smem-per-block": f"smem_bytes={self.smem_bytes} > {gpu.name} smem_per_block {gpu.smem_per_block}",
                 "smem-per-sm": f"smem_bytes={self.smem_bytes} + reserved {gpu.smem_reserved_per_block} > {gpu.name} "
                                f"smem_per_sm {gpu.smem_per_sm}"}
        found = {d.code for d in budget.diagnose(block, gpu, words)}
        problems = [text for code, text in words.items() if code in found]
        ring = self.ring_bytes()
        if ring and budget.diagnose(budget.Footprint(where="config", smem_bytes=self.smem_bytes + ring), gpu,
                                    ("smem-per-block",)):
            problems.append(f"smem_bytes={self.smem_bytes} + weight_stream ring {ring} > {gpu.name} "
                            f"smem_per_block {gpu.smem_per_block}")
        pool = self.pool_bytes()
        if pool and budget.diagnose(budget.Footprint(where="config", smem_bytes=self.smem_bytes + ring + pool), gpu,
                                    ("smem-per-block",)):
            problems.append(f"smem_bytes={self.smem_bytes} + weight_stream ring {ring} + page pool {pool} > {gpu.name} "
                            f"smem_per_block {gpu.smem_per_block}")
        need = self.prefetch_depth * self.prefetch_tile_bytes
        if need > self.smem_bytes:
            problems.append(f"prefetch_depth*prefetch_tile_bytes={need} > smem_bytes {self.smem_bytes}")
        return problems

    def ring_bytes(self) -> int:
        """Shared memory of the weight stream's ring (0 without it): every warp's slots."""
        return self.threads_per_block // 32 * self.weight_stream * WS_PIECE

    def pool_bytes(self) -> int:
        """Shared memory of each SM's page pool (0 without pages)."""
        return self.pages * self.page_bytes

    def for_gpu(self, gpu: GpuTarget) -> ScheduleConfig:
        problems = self.check(gpu)
        if problems:
            raise BadInput(f"schedule config does not fit {gpu.name}: " + "; ".join(problems))
        return self

    def sms(self, gpu: GpuTarget) -> int:
        return self.num_sms or gpu.sm_count

    def to_json(self) -> dict:
        out = {a.name: (list(v) if isinstance(v := getattr(self, a.name), tuple) else v)
               for a in attrs.fields(ScheduleConfig)}
        if self.pages == 0 and self.page_bytes == 16384:  # the page protocol off: the JSON of earlier configs
            del out["pages"], out["page_bytes"]
        return out

    @classmethod
    def from_mapping(cls, data: Any, where: str = "config") -> ScheduleConfig:
        if not isinstance(data, dict):
            raise BadInput(f"schedule config must be a table, got {type(data).__name__}", where)
        if set(data) == {"schedule"} and isinstance(data["schedule"], dict):
            data = data["schedule"]
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadInput(f"unknown schedule config key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                           where)
        try:
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise BadInput(str(exc), where) from None


CONFIG_DIR = Path(__file__).parent / "configs"  # the shipped configs and bench candidates (package data)


def named_config(name: str) -> ScheduleConfig:
    """A shipped ScheduleConfig, ``configs/<name>.toml`` (a plain config TOML, read like ``--config``)."""
    path = CONFIG_DIR / f"{name}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))
        raise BadInput(f"no shipped schedule config {name!r}; known: {', '.join(known)}", str(path))
    return load_config(path)


def load_candidates(group: str, vocab_size: int | None = None, file: str = "bench"
                    ) -> list[tuple[str, ScheduleConfig]]:
    """The named candidates of ``configs/<file>.toml``'s ``[[group]]`` array, in file order: each entry's ``name``,
    an optional ``base`` (a shipped config, :func:`named_config`; else ScheduleConfig's defaults) and the fields it
    sets, validated by ScheduleConfig itself. ``lm_head_rows_per_task`` may be ``{vocab_per_sms = S, multiple_of =
    M, at_least = L}``, resolved for a model of ``vocab_size`` rows: max(L, ceil(ceil(vocab / S) / M) * M).
    ``file``: ``bench`` (the bench's ``candidate`` and ``fused`` groups) or ``audit`` (the audit's ``audit`` group)."""
    path = CONFIG_DIR / f"{file}.toml"
    doc = read_toml(path)
    entries = doc.get(group)
    if not isinstance(entries, list) or not entries:
        raise BadInput(f"no [[{group}]] candidates", str(path))
    out = []
    for k, entry in enumerate(entries):
        where = f"{path}: {group}[{k}]"
        entry = dict(entry)
        name, base = entry.pop("name", None), entry.pop("base", None)
        if not isinstance(name, str) or not name:
            raise BadInput("a candidate needs a name", where)
        data = {**(named_config(base).to_json() if base is not None else {}), **entry}
        lm = data.get("lm_head_rows_per_task")
        if isinstance(lm, dict):
            if vocab_size is None:
                raise BadInput("lm_head_rows_per_task per model needs the model's vocab_size", where)
            if set(lm) != {"vocab_per_sms", "multiple_of", "at_least"} or not all(
                    type(v) is int and v > 0 for v in lm.values()):
                raise BadInput("lm_head_rows_per_task as a table needs positive integers vocab_per_sms, multiple_of "
                               f"and at_least, got {lm}", where)
            m = lm["multiple_of"]
            data["lm_head_rows_per_task"] = max(lm["at_least"], -(-vocab_size // lm["vocab_per_sms"] // m) * m)
        out.append((name, ScheduleConfig.from_mapping(data, f"{where} ({name})")))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise BadInput(f"candidate names repeat in [[{group}]]", str(path))
    return out


def load_config(path: str | Path | None, default: ScheduleConfig | None = None) -> ScheduleConfig:
    """Read a ScheduleConfig from TOML (top-level keys or a [schedule] table); ``default`` (ScheduleConfig()) when
    path is None."""
    if path is None:
        return default or ScheduleConfig()
    return ScheduleConfig.from_mapping(read_toml(path), str(path))


# The CUDA VM's default configuration (mosaic amk generate --vm cuda and the parity benchmark without --config; the
# bench's ``balanced-preload-q1-stage-sa-auto-blocked`` candidate): configs/cuda_default.toml says why each switch.
CUDA_DEFAULT = named_config("cuda_default")
