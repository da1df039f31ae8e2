"""AMK greedy-token parity on the H200 (<= 4 minutes): where and why the AMK CUDA VM's greedy tokens differ
from transformers' eager bf16 greedy generation, for four random-init shapes x 8 prompts x 128 tokens.

The reference is HF eager bf16 `generate`, batch 1 (what `mosaic amk generate --vm cuda --check-hf` uses).
Against it, per shape:
  amk-vm            the CUDA VM: free-running (its own tokens fed back) and teacher-forced (it reads the
                    reference's sequence; argmax, logits, bf16 bit-equality, ulps at every position)
  hf-static-graph   HF with StaticCache + CUDA graph (hf_gpu.StaticGraphDecoder), batch 1, token-by-token
                    prefill: free-running and teacher-forced
  hf-eager-batch8   HF eager, all 8 prompts in one batch (cuBLAS GEMM instead of GEMV): free and forced
  hf-sdpa-batch8    HF with SDPA attention, batch 8: free-running
  hf-eager-self     HF eager batch 1 teacher-forced over its own tokens, prompt 0 (the forcing path itself:
                    must be bit-equal, 0 disagreements)
A teacher-forced disagreement is a near-tie when the reference's logit of its token exceeds its logit of the
other decoder's token by <= k bf16 ulps (--k, default 4), else DECISIVE (0 expected of a correct VM). The
measured error in the difference of the reference's top-2 logits (pair error) is reported so the reader
can check k against it. The controls show whether HF's own different-summation-order variants diverge at
near-ties too.

Run on the device (repo root), after installing the project:
    pip install --no-deps --no-build-isolation -e packages/core -e packages/gpu-hopper -e packages/amk
    python3 benchmarks/amk_parity.py            # writes $OUT/amk_parity.json (or --json PATH), prints the table
    python3 benchmarks/amk_parity.py --shapes smollm2-135m --prompts 2 --tokens 32   # ~30 s
Every part runs in try/except (a failure is recorded and the run goes on); a time guard (--budget) scales
the prompts down or skips controls, and says so in the JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import numpy as np
from _device import OneLineParser, add_json, checked, json_path, write_json

T0 = time.time()
SHAPE_ORDER = ("smollm2-135m", "llama-3.2-1b", "tinyllama-1.1b", "smollm2-360m")
CONTROLS = ("static", "batch8", "sdpa8", "self")
# HF eager generate on the H200, ms per layer per decode step (results/2026-11-30/amk-device-run.json.xz: batch-8
# generate 1.2-1.4 incl. the first call's warm-up, time_eager 0.8-0.95)
MS_PER_LAYER_STEP = 1.2


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineParser(prog="amk_parity.py", description=__doc__.splitlines()[0])
    add_json(p, "amk_parity")
    p.add_argument("--budget", type=float, default=225.0, help="Seconds after which nothing new starts (default 225).")
    p.add_argument("--tokens", type=int, default=128, help="Generated tokens per prompt.")
    p.add_argument("--prompts", type=int, default=8, help="Prompts per shape (the batch of the batch-8 control).")
    p.add_argument("--prompt-len", type=int, default=16, help="Tokens per prompt.")
    p.add_argument("--shapes", default=",".join(SHAPE_ORDER), help="Comma-separated shapes.")
    p.add_argument("--controls", default=",".join(CONTROLS), help=f"HF-vs-HF controls ({','.join(CONTROLS)}; '' none).")
    p.add_argument("--k", type=int, default=None, help="Near-tie threshold in bf16 ulps (default parity's, 4).")
    args = checked(p, p.parse_args(argv), positive=("tokens", "prompts", "prompt_len"), shapes="shapes")
    if not args.shapes:
        p.error("--shapes is empty")
    if args.budget <= 0:
        p.error("--budget must be > 0")
    if args.k is not None and args.k < 0:
        p.error("--k must be >= 0")
    from mosaic_amk.parity import DEFAULT_NEAR_TIE_ULPS

    args.k = DEFAULT_NEAR_TIE_ULPS if args.k is None else args.k
    args.controls = [c for c in args.controls.split(",") if c]
    bad = [c for c in args.controls if c not in CONTROLS]
    if bad:
        p.error(f"unknown control(s) {bad}; known: {', '.join(CONTROLS)}")
    return args


ARGS: argparse.Namespace
REPORT: dict = {"args": None, "environment": {}, "shapes": {}, "skipped": [], "elapsed_s": 0.0}
STATE: dict = {}  # shape -> live objects (model, spec, weights, prompts, reference, contenders)


def left() -> float:
    return ARGS.budget - (time.time() - T0)


def layers(shape: str) -> int:
    from mosaic_amk.bench.hf_gpu import SHAPES

    return SHAPES[shape][1]["num_hidden_layers"]


def part(shape: str, name: str, need: float, fn) -> bool:
    """Run one part of one shape: timed; an exception is recorded and the run goes on; skipped (and said
    so) when fewer than ``need`` seconds are left."""
    st = STATE[shape]
    if left() < need:
        msg = f"{shape}:{name}: skipped, {left():.0f} s left < {need:.0f} s estimated"
        REPORT["skipped"].append(msg)
        print(msg, flush=True)
        return False
    t = time.time()
    try:
        fn(st)
        ok = True
    except Exception as exc:  # noqa: BLE001 - one failure must not lose the rest
        st["errors"].append(f"{name}: {type(exc).__name__}: {exc}"[:600])
        st["traces"].append(f"{name}: {traceback.format_exc()[-2500:]}")
        ok = False
    st["seconds"][name] = round(time.time() - t, 2)
    print(f"[{shape}:{name}] {'ok' if ok else 'FAILED: ' + st['errors'][-1]} {st['seconds'][name]} s", flush=True)
    save()
    return ok


def record(shape: str):
    from mosaic_amk.parity import ContenderParity, ShapeParity

    st = STATE[shape]
    cons = []
    for name in ("amk-vm", "hf-static-graph", "hf-eager-batch8", "hf-sdpa-batch8", "hf-eager-self"):
        c = st["contenders"].get(name)
        if c:
            cons.append(ContenderParity(name, tuple(c["free"]), tuple(c["forced"]), ARGS.k, tuple(c["errors"])))
    return ShapeParity(shape, "HF eager bf16 generate, batch 1", st.get("n_prompts", 0), ARGS.tokens,
                       ARGS.prompt_len, ARGS.k, tuple(cons), tuple(st["notes"]), tuple(st["errors"]),
                       dict(st["seconds"]))


def save() -> None:
    REPORT["elapsed_s"] = round(time.time() - T0, 1)
    shapes = {}
    for s in STATE:
        try:
            shapes[s] = {**record(s).to_json(), "params": STATE[s].get("params"), "layers": layers(s),
                         "prompts_used": STATE[s].get("prompts"), "reference_tokens": STATE[s].get("ref_tokens"),
                         "traces": STATE[s]["traces"]}
        except Exception as exc:  # noqa: BLE001
            shapes[s] = {"record_error": f"{type(exc).__name__}: {exc}"}
    REPORT["shapes"] = shapes
    write_json(json_path(ARGS), REPORT, indent=1, default=str)


def _prompts(vocab: int, n: int, length: int, seed: int = 1) -> list[list[int]]:
    """Random prompts (the generator and seed of every AMK device run's parity prompts): the runs are comparable."""
    rng = np.random.default_rng(seed)
    return [[int(v) for v in rng.integers(0, vocab, length)] for _ in range(n)]


def contender(st: dict, name: str) -> dict:
    return st["contenders"].setdefault(name, {"free": [], "forced": [], "errors": []})


# ---------------------------------------------------------------------------------------------- parts

def build(st: dict) -> None:
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.cuda.cuda_vm import weights_from_torch

    st["model"] = hf_gpu.random_model(st["shape"], seed=0)
    st["spec"] = hf_gpu.spec_of(st["model"])
    st["weights"] = weights_from_torch(st["model"], st["spec"])
    st["params"] = st["spec"].num_params()
    st["prompts"] = _prompts(st["spec"].vocab_size, st["n_prompts"], ARGS.prompt_len)


def reference(st: dict) -> None:
    from mosaic_amk.bench import hf_gpu

    toks, logits = [], []
    for p in st["prompts"]:
        t, lg = hf_gpu.greedy(st["model"], [p], ARGS.tokens)
        toks.append(t[0])
        logits.append(lg[0])
    st["ref_tokens"], st["ref_logits"] = toks, logits


def amk_vm(st: dict) -> None:
    from mosaic.plugins import host
    from mosaic_amk.config import CUDA_DEFAULT
    from mosaic_amk.cuda.cuda_vm import CudaVM
    from mosaic_amk.parity import forced, free_run

    c = contender(st, "amk-vm")
    t = time.time()
    vm = CudaVM(st["spec"], CUDA_DEFAULT, host().get("gpus", "h200"), weights=st["weights"],
                max_positions=ARGS.prompt_len + ARGS.tokens)
    st["seconds"]["vm_init"] = round(time.time() - t, 2)
    if vm.note:  # e.g. the blocked RoPE order fell back to the standard one (the same bits)
        st["notes"].append(vm.note)
    for i, p in enumerate(st["prompts"]):
        rt, rl = st["ref_tokens"][i], st["ref_logits"][i]
        try:
            toks, lg = vm.generate(p, ARGS.tokens)
            c["free"].append(free_run(rt, rl, toks, lg, ARGS.k))
        except Exception as exc:  # noqa: BLE001
            c["errors"].append(f"free prompt {i}: {type(exc).__name__}: {exc}"[:300])
        try:
            am, lg = vm.forced(p, rt)
            c["forced"].append(forced(rt, rl, am, lg, ARGS.k))
        except Exception as exc:  # noqa: BLE001
            c["errors"].append(f"forced prompt {i}: {type(exc).__name__}: {exc}"[:300])
    del vm


def static_graph(st: dict) -> None:
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.parity import forced, free_run

    c = contender(st, "hf-static-graph")
    try:
        dec = hf_gpu.StaticGraphDecoder(st["model"], max_cache_len=ARGS.prompt_len + ARGS.tokens)
    except Exception as exc:  # noqa: BLE001 - the uncaptured step is the same arithmetic: say so and go on
        c["errors"].append(f"capture failed, ran uncaptured: {type(exc).__name__}: {exc}"[:300])
        dec = hf_gpu.StaticGraphDecoder(st["model"], max_cache_len=ARGS.prompt_len + ARGS.tokens, graph=False)
    for i, p in enumerate(st["prompts"]):
        rt, rl = st["ref_tokens"][i], st["ref_logits"][i]
        toks, lg = dec.decode(p, ARGS.tokens)
        c["free"].append(free_run(rt, rl, toks, list(lg), ARGS.k))
        am, lg = dec.decode(p, ARGS.tokens, forced=rt)
        c["forced"].append(forced(rt, rl, am, list(lg), ARGS.k))
    del dec


def batch8(st: dict) -> None:
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.parity import forced, free_run

    c = contender(st, "hf-eager-batch8")
    toks, lg = hf_gpu.greedy(st["model"], st["prompts"], ARGS.tokens)
    for i in range(len(st["prompts"])):
        c["free"].append(free_run(st["ref_tokens"][i], st["ref_logits"][i], toks[i], list(lg[i]), ARGS.k))
    am, lg = hf_gpu.eager_forced(st["model"], st["prompts"], st["ref_tokens"])
    for i in range(len(st["prompts"])):
        c["forced"].append(forced(st["ref_tokens"][i], st["ref_logits"][i], am[i], list(lg[i]), ARGS.k))


def sdpa8(st: dict) -> None:
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.parity import free_run

    c = contender(st, "hf-sdpa-batch8")
    hf_gpu.attention(st["model"], "sdpa")
    try:
        toks, lg = hf_gpu.greedy(st["model"], st["prompts"], ARGS.tokens)
    finally:
        hf_gpu.attention(st["model"], "eager")
    for i in range(len(st["prompts"])):
        c["free"].append(free_run(st["ref_tokens"][i], st["ref_logits"][i], toks[i], list(lg[i]), ARGS.k))


def self_check(st: dict) -> None:
    """HF eager batch 1 forced over its own first 32 tokens of prompt 0: the forcing path is generate's own
    computation (bit-equal logits, no disagreement) or the teacher-forced numbers above mean nothing."""
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.parity import forced

    c = contender(st, "hf-eager-self")
    n = min(ARGS.tokens, 32)
    rt, rl = st["ref_tokens"][0][:n], st["ref_logits"][0][:n]
    am, lg = hf_gpu.eager_forced(st["model"], [st["prompts"][0]], [rt])
    c["forced"].append(forced(rt, list(rl), am[0], list(lg[0]), ARGS.k))


# ---------------------------------------------------------------------------------------------- main

def environment() -> dict:
    import torch
    import transformers

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
           "argv": sys.argv[1:]}
    try:
        env["gpu"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001
        env["gpu"] = f"none ({type(exc).__name__}: {exc})"
    return env


def main(argv=None) -> int:
    global ARGS
    ARGS = parse_args(argv)
    REPORT["args"] = {k: v for k, v in vars(ARGS).items()}
    REPORT["environment"] = environment()
    t = time.time()
    try:  # the VM's cubin (cached under ~/.cache/mosaic after the first build): its time is not the parity's
        from mosaic_amk.config import CUDA_DEFAULT
        from mosaic_amk.cuda.build import build as build_vm
        from mosaic_amk.cuda.build import config_defines

        REPORT["vm_build"] = {**build_vm(CUDA_DEFAULT.threads_per_block, defines=config_defines(CUDA_DEFAULT)).to_json(),
                              "seconds": round(time.time() - t, 1)}
    except Exception as exc:  # noqa: BLE001 - the VM parts will fail and say why; the controls still run
        REPORT["vm_build"] = {"error": f"{type(exc).__name__}: {exc}"[:600], "seconds": round(time.time() - t, 1)}
    # time plan: the batch-1 reference dominates (HF eager generate ~1.2 ms per layer per step); scale the
    # prompts down uniformly when every shape's reference would not fit beside ~20 s per shape for the
    # model build and the VM; the controls (phase B) get what is left and are skipped, said so, when short
    ref_cost = sum(ARGS.prompts * (ARGS.tokens + 1) * layers(s) * MS_PER_LAYER_STEP / 1000 for s in ARGS.shapes)
    room = left() - 20 * len(ARGS.shapes)
    n_prompts = ARGS.prompts
    if ref_cost > room:
        n_prompts = max(1, int(ARGS.prompts * room / ref_cost))
        REPORT["skipped"].append(f"prompts scaled {ARGS.prompts} -> {n_prompts} (reference estimate "
                                 f"{ref_cost:.0f} s > {room:.0f} s of the budget)")
    for s in ARGS.shapes:
        STATE[s] = {"shape": s, "n_prompts": n_prompts, "contenders": {}, "errors": [], "traces": [], "notes": [],
                    "seconds": {}}
        if n_prompts < ARGS.prompts:
            STATE[s]["notes"].append(f"time guard: {n_prompts} of {ARGS.prompts} prompts")
    # phase A: reference and the VM for every shape first (the numbers that decide the issue)
    for s in ARGS.shapes:
        est_ref = n_prompts * (ARGS.tokens + 1) * layers(s) * MS_PER_LAYER_STEP / 1000
        if not part(s, "build", 10, build):
            continue
        if not part(s, "reference", est_ref + 5, reference):
            continue
        part(s, "amk_vm", 8, amk_vm)
    # phase B: the HF-vs-HF controls, one control for every shape before the next control
    fns = {"static": static_graph, "batch8": batch8, "sdpa8": sdpa8, "self": self_check}
    for name in ARGS.controls:
        for s in ARGS.shapes:
            if "ref_tokens" not in STATE[s]:
                continue
            step = (ARGS.tokens + ARGS.prompt_len) * layers(s) * MS_PER_LAYER_STEP / 1000  # one batched decode
            est = {"static": 0.2 * step * n_prompts + 3, "batch8": 2 * step + 2, "sdpa8": step + 2,
                   "self": 0.3 * step + 1}
            part(s, name, est[name], fns[name])
    save()
    from mosaic_amk.parity import format_table

    print(format_table([record(s) for s in ARGS.shapes]), flush=True)
    for msg in REPORT["skipped"]:
        print(f"skipped: {msg}")
    print(f"wrote {json_path(ARGS)} ({REPORT['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
