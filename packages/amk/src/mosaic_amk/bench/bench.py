"""``mosaic amk bench``: AMK ms/token against HF eager, HF static cache + CUDA graph and the
weight-bandwidth floor, in one process, interleaved round by round (so clock drift hits every contender
alike), medians reported.

Every AMK candidate config passes a correctness gate before it is timed: parity criterion (2) (bench/gate.py):
teacher-forced over HF eager bf16's own greedy tokens for the gate prompts (the checkpoint's tokenizer over the
parity prompts, or seeded random ids for a random-init shape), every argmax disagreement must be a near-tie
within the envelope measured once per run between HF's own bf16 variants (static cache + CUDA graph, every prompt
in one batch), zero decisive disagreements; and the candidate's one-launch generation (the timed path) must give
the same tokens as its launch-per-step generation. A candidate that fails is reported with its verdict, never
timed; every verdict is printed and recorded in the JSON (``candidates[i].verdict``; ``candidates[i].gate`` only
when it failed, the line saying why; the run's envelope in ``gate``).
AMK runs all timed steps in one launch (the VM loops over decode steps with a grid sync between them);
"one launch per step" re-times it with a launch per token. "Where the time goes" probes re-time the
probed candidates (``probe``: names; default the first passing one) with stages left out, through the VM's
skip mask (one bit per op code): no weight prefetch; every op skipped (the synchronisation skeleton: waits,
signals, launch); the GEMV family skipped (fused GEMVs included: everything but the weight streaming);
attention skipped; RMSNorm skipped (only where the schedule has a separate rmsnorm op); and every op but the
GEMV family skipped (the weight streaming and the skeleton alone). A probe whose ops the schedule lacks is
left out. Skipped variants compute garbage; they are timing probes, named ``amk probe[<candidate>]: ...``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import attrs
from mosaic.records import GpuTarget

from mosaic_amk.config import ScheduleConfig, load_candidates
from mosaic_amk.cuda import encode as E
from mosaic_amk.cuda.launcher import SKIPPABLE

GEMV_OPS = ("gemv", "gemv_silu_mul", "rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append")
ATTENTION_OPS = ("attention",)
NORM_OPS = ("rmsnorm",)


def floor_bytes(enc: E.Encoded) -> int:
    """Weight bytes one decode step must read: every weight a non-embed task reads, whole, plus the one
    embedding row the embed task gathers (the KV cache and activations are not counted)."""
    t = enc.tasks
    read_whole, embed_tables = set(), set()
    for i in range(t.shape[0]):
        op = E.OPS[t[i, E.W_OP]]
        for k in range(t[i, E.W_NIN]):
            b = int(t[i, E.W_IN + k])
            if enc.buffers[b].kind != "weight":
                continue
            (embed_tables if op == "embed" else read_whole).add(b)
    total = sum(enc.buffers[b].nbytes for b in read_whole)
    # one row of each gathered table, in its device bytes (a quantized table's blocks and scales included)
    total += sum(enc.buffers[b].nbytes // enc.buffers[b].shape[0] for b in embed_tables - read_whole)
    return total


def measure_copy_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written) with cupy, median of 5."""
    import cupy as cp

    a = cp.empty(nbytes // 2, cp.uint8)
    b = cp.empty_like(a)
    times = []
    for _ in range(6):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        b[...] = a
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e))
    del a, b
    return nbytes / (statistics.median(times[1:]) * 1e-3) / 1e9


@attrs.define
class Contender:
    name: str
    run: Any  # () -> ms per token
    samples: list = attrs.field(factory=list)
    error: str | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "ms_per_token": statistics.median(self.samples) if self.samples else None,
                "samples": [round(s, 4) for s in self.samples], "error": self.error}


# the bench name of config.CUDA_DEFAULT
DEFAULT_NAME = "balanced-preload-q1-stage-sa-auto-blocked"
BENCH_DEFAULT = ("default", "rows32-lm", "best-measured", "balanced-preload", "balanced-preload-q1",
                 "balanced-preload-q1-stage", "balanced-preload-q1-stage-sa-auto", DEFAULT_NAME)


def all_candidates(spec) -> list[tuple[str, ScheduleConfig]]:
    """Every named schedule config measured on the H200, as data in configs/bench.toml (docs/amk-cuda.md "Performance: where the time goes"):
    ``default`` and two finer splits (rows16-lm, rows32-lm: more tasks than SMs per GEMV stage, the LM head split
    separately); ``best-measured``, the second session's best piece by piece: rows32 + the LM-head split, the fused
    GEMVs (5 stages per layer), no L2 weight prefetch (it cost the 16384x8192 GEMV 84.6 vs 65.9 us), relaxed polling
    (1-2% on both shapes); ``best-measured-preload``: the same with the weight preload (8 chunks per lane, row_dot's
    first burst, in flight before each GEMV task's wait; docs/amk-cuda.md "Weight preload"), a build variant of the
    VM; ``balanced``: best-measured with every GEMV (LM head included) cut into one task per SM (``gemv_split``), with
    and without the preload, with a separate RoPE/append stage instead of the RoPE GEMVs (q/k/v cut by rows, not
    whole heads: 132 tasks instead of q+k+v heads), and on 66 SMs (half the producers per counter);
    ``balanced-stream2/4``: balanced with the weight stream (TMA into 2 or 4 shared-memory slots per warp, the first
    issued before the wait; docs/amk-cuda.md "Weight stream"); ``balanced-preload-pf<d>-<k>k``: balanced-preload
    with the L2 prefetch of the next d tasks (the current one included) capped at k KB per task;
    ``balanced-preload-q1``: balanced-preload with one attention task per query head (not per KV group); its twins
    with preload 6 and with the ping-pong GEMV row loop (``gemv_pingpong``); ``-stage``: with the attention's KV
    staging (``attention_stage``: the cached rows of earlier positions copied to shared memory before the attention
    task's wait); ``-sa``: with the argmax split over the SMs (``split_argmax``, 1024 logits per ``argmax_partial``
    task, one ``argmax_combine``); ``-apart``: the attention tasks on the last SMs and the o-projection over the
    others (``attention_placement``), ``-auto``: apart only when the o-projection is small (SmolLM2 yes, Llama no).
    ``-blocked``: q and the K cache in the blocked RoPE order (``rope_order``: the q/k/v GEMVs cut into 8-row blocks
    over all SMs instead of whole heads); ``-smem160k``: a 160 KB general area (the staging holds longer contexts;
    L1 shrinks); ``-apartqkv-``: the attention on the last SMs, the q/k/v blocks off them, the o-projection over every
    SM (``attention_placement`` apart_qkv). ``balanced-preload-q1-stage-sa-auto-blocked`` is the CUDA VM's default,
    ``config.CUDA_DEFAULT`` (the fastest measured on both bench shapes)."""
    return load_candidates("candidate", spec.vocab_size)  # configs/bench.toml, in file order


def default_candidates(spec) -> list[tuple[str, ScheduleConfig]]:
    """What ``mosaic amk bench`` and benchmarks/amk_bench.py time without --config: ``BENCH_DEFAULT`` of
    :func:`all_candidates` (the default config, the old and new best, CUDA_DEFAULT last)."""
    return [c for c in all_candidates(spec) if c[0] in BENCH_DEFAULT]


def fused_candidates(spec) -> list[tuple[str, ScheduleConfig]]:
    """default_candidates with every fusion the CUDA VM runs switched on (config.VM_FUSIONS: rmsnorm_gemv and
    gemv_rope_append on top of the defaults; 5 serial stages per layer instead of 8), named ``fused-<name>``."""
    return load_candidates("fused", spec.vocab_size)  # configs/bench.toml


# the VM's synchronisation variants (config.WAIT_MODES / SIGNAL_MODES / PREFETCH_MODES; docs/amk-cuda.md
# "Synchronisation variants"): name -> (wait_mode, signal_mode, prefetch_mode); "v0" is the default path
SYNC_VARIANTS = {"v0": ("acquire", "inline", "inline"),
                 "relaxed": ("relaxed", "inline", "inline"),
                 "merged": ("relaxed", "merged", "inline"),
                 "side": ("relaxed", "side", "inline"),
                 "side-pf": ("relaxed", "side", "side")}


def sync_candidates(base: Sequence[tuple[str, ScheduleConfig]], variants: Sequence[str] = tuple(SYNC_VARIANTS)
                    ) -> list[tuple[str, ScheduleConfig]]:
    """Each base candidate under each synchronisation variant, named ``<base>/<variant>``; every one is gated
    with parity criterion (2) like any candidate (a broken variant reports no time)."""
    out = []
    for name, cfg in base:
        for v in variants:
            wait, signal, prefetch = SYNC_VARIANTS[v]
            out.append((f"{name}/{v}", attrs.evolve(cfg, wait_mode=wait, signal_mode=signal, prefetch_mode=prefetch)))
    return out


def probe_masks(enc: E.Encoded) -> list[tuple[str, dict]]:
    """The "where the time goes" probes for one encoded schedule: (what, time_decode keyword arguments); a probe
    whose ops the schedule does not use is left out (it would equal the full run)."""
    present = {E.OPS[int(o)] for o in enc.tasks[:, E.W_OP]}

    def mask(names) -> int:
        return sum(SKIPPABLE[o] for o in names if o in present)

    all_ops, gemv = mask(present), mask(GEMV_OPS)
    out = [("one launch per step", {"steps_per_launch": 1}), ("no prefetch", {"prefetch_depth": 0}),
           ("skip all ops (sync skeleton)", {"skip_ops": all_ops})]
    for what, m in (("skip gemv ops", gemv), ("skip attention", mask(ATTENTION_OPS)), ("skip norms", mask(NORM_OPS)),
                    ("only gemv ops (skip the rest)", all_ops & ~gemv)):
        if m:
            out.append((what, {"skip_ops": m}))
    return out


def fastest(samples: dict, n: int) -> list:
    """The names of the ``n`` smallest samples (None: a failed sample, never kept), fastest first; ties keep the
    given order."""
    if n < 1:
        raise ValueError(f"keep at least one candidate, not {n}")
    ok = [(v, i, k) for i, (k, v) in enumerate(samples.items()) if v is not None]
    return [k for _, _, k in sorted(ok)[:n]]


def run_bench(model, spec, gpu: GpuTarget, candidates: Sequence[tuple[str, ScheduleConfig]] | None = None, *,
              rounds: int = 5, steps: int = 64, hf_steps: int = 16, gate_tokens: int = 32, gate_prompts=None,
              variants: bool = True,
              graph: bool = True, eager: bool = True, log=print, deadline: float | None = None,
              probe: Sequence[str] | None = None, probe_only: Sequence[str] | None = None,
              time_best: int | None = None, gate_deadline: float | None = None) -> dict:
    """Bench one HF model (on the GPU, bf16) against the CUDA VM. Returns a JSON-able dict. ``probe_only``:
    the probe names (probe_masks' first elements) to run on each probed candidate (default: all). ``gate_prompts``:
    the criterion (2) prompts (token-id lists; default gate.gate_prompts of the model's checkpoint dir), each
    teacher-forced over ``gate_tokens`` of HF's tokens. ``deadline`` (time.time()): no timing round starts after
    it (``rounds_run`` says how many did). ``gate_deadline``: a candidate not yet gated by then is recorded as
    not gated and left out (the rounds keep their time). ``time_best``: after the gate, one selection sample of
    every passing candidate (one pass, in candidate order; ``candidates[i].selection_ms``) keeps the fastest
    ``time_best`` (:func:`fastest`) for the interleaved rounds (and the probes, unless ``probe`` names others);
    the others keep their verdict and say why they were not timed (``candidates[i].not_timed``)."""
    from mosaic_amk.bench import gate, hf_gpu
    from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch

    candidates = list(candidates or default_candidates(spec))
    weights = weights_from_torch(model, spec)
    prompts = [list(p) for p in (gate_prompts or gate.gate_prompts(gate.model_dir_of(model), spec.vocab_size))]
    envelope = gate.measure_envelope(model, prompts, gate_tokens, graph=graph)
    log(f"  {envelope.line()}")
    result: dict[str, Any] = {"model": spec.family, "layers": spec.num_layers, "hidden": spec.hidden_size,
                              "vocab": spec.vocab_size, "params": spec.num_params(), "gpu": gpu.name,
                              "steps": steps, "rounds": rounds, "gate": envelope.to_json(), "candidates": [],
                              "contenders": []}
    contenders: list[Contender] = []
    passed: dict[str, Any] = {}  # candidate name -> its CudaVM (gate passed)
    max_positions = max(steps + 64, max(map(len, prompts)) + gate_tokens + 1)
    for name, cfg in candidates:
        entry: dict[str, Any] = {"name": name, "config": cfg.to_json()}
        if gate_deadline is not None and time.time() > gate_deadline:
            entry["gate"] = "not gated: the gate's time was spent (gate_deadline); not timed"
            result["candidates"].append(entry)
            log(f"  candidate {name}: {entry['gate']}")
            continue
        try:
            vm = CudaVM(spec, cfg, gpu, weights=weights, max_positions=max_positions)
            verdict = gate.judge(envelope, vm.forced)
            v = gate.verdict_json(verdict)
            # the timed path (all steps in one launch) against the VM's own launch-per-step generation
            one, _ = vm.generate(prompts[0], gate_tokens, logits=False, steps_per_launch=gate_tokens)
            per, _ = vm.generate(prompts[0], gate_tokens, logits=False, steps_per_launch=1)
            v["launch_consistent"] = one == per
            v["line"] = gate.verdict_line(verdict) + ("" if one == per else
                                                      "; one-launch tokens differ from per-step launches")
            entry.update(tasks=int(vm.enc.tasks.shape[0]), verdict=v)
            if verdict.ok and one == per:
                contenders.append(Contender(f"amk[{name}]", lambda vm=vm: vm.time_decode(steps)))
                passed[name] = vm
                if "floor_bytes" not in result:
                    result["floor_bytes"] = floor_bytes(vm.enc)
            else:
                entry["gate"] = v["line"] + ": not timed"  # set only when the gate fails, as before
        except Exception as exc:  # noqa: BLE001 - a failing candidate is reported, the bench goes on
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
        result["candidates"].append(entry)
        log(f"  candidate {name}: {entry.get('error') or entry.get('gate') or entry['verdict']['line']}")
    if time_best is not None and len(passed) > time_best:
        sel = {}
        for name, vm in passed.items():
            try:
                sel[name] = float(vm.time_decode(steps))
            except Exception as exc:  # noqa: BLE001 - reported; such a candidate is not kept
                sel[name] = None
                log(f"  selection sample of {name}: {type(exc).__name__}: {exc}"[:300])
        keep = fastest(sel, time_best)
        for entry in result["candidates"]:
            if entry["name"] in sel:
                entry["selection_ms"] = sel[entry["name"]]
                if entry["name"] not in keep:
                    entry["not_timed"] = (f"outside the fastest {time_best} by one selection sample "
                                          f"({sel[entry['name']]} ms/token)")
        contenders = [c for c in contenders if c.name[4:-1] in keep]
        passed = {n: vm for n, vm in passed.items() if n in keep}
        result["selection"] = {"kept": keep, "samples_ms": sel, "rule": f"the fastest {time_best} by one sample"}
        if probe is None:  # the probes go to the fastest
            probe = keep[:1]
        log("  selection (one sample each, ms/token): " + ", ".join(f"{n} {v:.4f}" if v is not None else f"{n} -"
                                                                     for n, v in sel.items()) + f"; kept {keep}")
    probed = [n for n in (probe if probe is not None else list(passed)[:1]) if n in passed] if variants else []
    result["probed"] = probed
    for name in probed:
        vm = passed[name]
        for what, kw in probe_masks(vm.enc):
            if probe_only is not None and what not in probe_only:  # e.g. only the sync skeleton per variant
                continue
            contenders.append(Contender(f"amk probe[{name}]: {what}", lambda vm=vm, kw=kw: vm.time_decode(steps, **kw)))
    if eager:
        contenders.append(Contender("hf eager", lambda: hf_gpu.time_eager(model, hf_steps)))
    if graph:
        try:
            dec = hf_gpu.StaticGraphDecoder(model, max_cache_len=max(256, steps + 16))
            contenders.append(Contender("hf static cache + cuda graph", lambda: dec.time(steps)))
        except Exception as exc:  # noqa: BLE001
            contenders.append(Contender("hf static cache + cuda graph", None,
                                        error=f"capture failed: {type(exc).__name__}: {exc}"[:500]))
    for r in range(rounds):
        if deadline is not None and time.time() > deadline:
            result["rounds_run"] = r
            break
        for c in contenders:
            if c.error and not c.samples:
                continue
            try:
                c.samples.append(float(c.run()))
            except Exception as exc:  # noqa: BLE001
                c.error = f"{type(exc).__name__}: {exc}"[:500]
    else:
        result["rounds_run"] = rounds
    result["contenders"] = [c.to_json() for c in contenders]
    fb = result.get("floor_bytes")
    if fb:
        result["floor_ms_datasheet"] = fb / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3
        result["floor_gbs_datasheet"] = gpu.hbm_bandwidth_gbs  # the record's, so an H100 run shows the H100's
        try:
            gbs = measure_copy_gbs()
            result["copy_gbs"] = gbs
            result["floor_ms_measured_copy"] = fb / (gbs * 1e9) * 1e3
        except Exception as exc:  # noqa: BLE001
            result["copy_error"] = str(exc)[:200]
    return result


def format_table(result: dict) -> str:
    how = f" ({result['gpu_provenance']})" if result.get("gpu_provenance") else ""
    lines = [f"bench: {result.get('model')} {result.get('layers')} layers, hidden {result.get('hidden')}, vocab "
             f"{result.get('vocab')}, {result.get('params', 0) / 1e6:.0f}M params on {result.get('gpu')}{how}"]
    fd, fm = result.get("floor_ms_datasheet"), result.get("floor_ms_measured_copy")
    if fd:
        gbs = result.get("floor_gbs_datasheet")
        basis = f"{result.get('gpu')}: {gbs / 1000:g} TB/s datasheet" if gbs else "the GpuTarget's HBM bandwidth"
        lines.append(f"  weight-bandwidth floor: {fd:.3f} ms/token ({basis})"
                     + (f", {fm:.3f} ms at the measured copy bandwidth ({result['copy_gbs']:.0f} GB/s)" if fm else ""))
    lines.append(f"  {'contender':44s} {'ms/token':>10s} {'x floor':>8s}  samples")
    for c in result.get("contenders", []):
        ms = c.get("ms_per_token")
        ratio = f"{ms / fd:8.2f}" if ms and fd else " " * 8
        shown = f"{ms:10.3f}" if ms is not None else f"{'-':>10s}"
        extra = c["error"] if c.get("error") else " ".join(f"{s:.3f}" for s in c["samples"])
        lines.append(f"  {c['name']:44s} {shown} {ratio}  {extra}")
    if result.get("gate"):
        g = result["gate"]
        lines.append(f"  gate, criterion (2): envelope {g['envelope_ulps']} bf16 ulps of HF's own variants "
                     f"({', '.join(f'{n}: {c} flips' for n, c in g['variant_flips'].items())}) over {g['prompts']} "
                     f"prompts x {g['tokens']} tokens")
    for cand in result.get("candidates", []):
        verdict = cand.get("error") or cand.get("gate") or (cand.get("verdict") or {}).get("line")
        if cand.get("not_timed"):
            verdict += f"; not timed: {cand['not_timed']}"
        lines.append(f"  candidate {cand['name']}: {verdict}")
    return "\n".join(lines)
