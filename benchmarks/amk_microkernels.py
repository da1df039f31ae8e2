"""Issue 8 on the H200, in ONE run (<= 9 minutes): the AMK CUDA VM's micro-kernels against ops.py and
their bandwidth floors, the counter hand-off microbenchmark, the planted deadlock and the watchdog,
token-exact greedy parity against transformers' eager bf16 generation for four model shapes, and the
bench (AMK vs HF eager vs HF static cache + CUDA graph vs the weight-bandwidth floor).

Run on the device (repo root), after installing the project:
    pip install --no-deps --no-build-isolation -e packages/core -e packages/gpu-hopper -e packages/amk
    python3 scripts/device/issue8.py            # writes $OUT/issue8.json and prints a summary
    python3 scripts/device/issue8.py --dry-run  # CPU only: build, lower/validate/encode every shape, plan
    python3 scripts/device/issue8.py --quick    # <= 4 min: build, the changed micro-kernels, the fused GEMV
                                                # micro-kernels (fused vs ops.py, torch bf16 and the unfused
                                                # chain), watchdog, bench of Llama-3.2-1B and SmolLM2-135M (3
                                                # rounds, unfused configs, probes), SmolLM2 parity 2 x 32, then the
                                                # fused configs (config.VM_FUSIONS) benched with probes, then
                                                # the synchronisation variants (below)
    python3 scripts/device/issue8.py --quick --sync  # <= 2.5 min: build + the synchronisation variants only
                                                # (bench.SYNC_VARIANTS: hand-off chains, watchdog, skeleton and
                                                # full ms/token of both bench shapes per variant, gated on HF)
Every stage runs in try/except (a failure is recorded with its traceback and the run goes on); a global
time guard skips the stages that would start after --budget seconds (default 540). The fused stages run in
child processes (``--child fused-micro`` / ``--child fused-bench``, with a timeout): a fused micro-kernel
that faults or hangs loses its own stage, never the CUDA context of the unfused stages.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

T0 = time.time()
REPORT: dict = {"stages": {}, "skipped": [], "args": None}
SHAPE_ORDER = ("smollm2-135m", "llama-3.2-1b", "smollm2-360m", "tinyllama-1.1b")
BENCH_SHAPES = ("llama-3.2-1b", "smollm2-135m")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="Folder for issue8.json (default $OUT).")
    p.add_argument("--budget", type=float, default=540.0, help="Seconds after which no new stage starts.")
    p.add_argument("--tokens", type=int, default=128, help="Generated tokens per prompt (parity).")
    p.add_argument("--prompts", type=int, default=8, help="Prompts per shape (parity).")
    p.add_argument("--prompt-len", type=int, default=16, help="Tokens per prompt.")
    p.add_argument("--shapes", default=",".join(SHAPE_ORDER), help="Comma-separated shapes for parity.")
    p.add_argument("--bench-shapes", default=",".join(BENCH_SHAPES), help="Shapes to bench ('' for none).")
    p.add_argument("--rounds", type=int, default=5, help="Interleaved bench rounds.")
    p.add_argument("--steps", type=int, default=64, help="Decode steps per bench sample.")
    p.add_argument("--dry-run", action="store_true", help="CPU parts only (no GPU): build, lower, validate, encode.")
    p.add_argument("--quick", action="store_true",
                   help="<= 4 minutes: build, micro-kernels of the changed ops and the fused GEMVs, watchdog, bench "
                        "(3 rounds) of llama-3.2-1b and smollm2-135m unfused and fused, smollm2-135m parity (2 "
                        "prompts x 32 tokens).")
    p.add_argument("--sync", action="store_true",
                   help="Only the synchronisation variants (vm.cu sync_flags): per variant the hand-off chains and "
                        "the watchdog, and skeleton + full ms/token of the bench shapes (in a child process).")
    p.add_argument("--child", choices=("fused-micro", "fused-bench", "sync"), default=None,
                   help=argparse.SUPPRESS)  # a fused stage in its own process (the parent runs it)
    args = p.parse_args(argv)
    if args.quick:
        args.budget = min(args.budget, 200.0)
        args.tokens, args.prompts, args.rounds = min(args.tokens, 32), min(args.prompts, 2), min(args.rounds, 3)
        args.shapes = "smollm2-135m"
        args.bench_shapes = "llama-3.2-1b,smollm2-135m"
    for name in ("tokens", "prompts", "prompt_len", "rounds", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    from mosaic_amk.cuda.hf_gpu import SHAPES

    for key in ("shapes", "bench_shapes"):
        names = [s for s in getattr(args, key).split(",") if s]
        bad = [s for s in names if s not in SHAPES]
        if bad:
            p.error(f"unknown shape(s) {bad}; known: {', '.join(SHAPES)}")
        setattr(args, key, names)
    return args


def left() -> float:
    return ARGS.budget - (time.time() - T0)


def stage(name: str, need: float = 0.0):
    """Run fn as a stage: timed, exceptions recorded, skipped when the budget is (nearly) spent."""
    def wrap(fn):
        def run(*a, **k):
            if left() < need:
                REPORT["skipped"].append({"stage": name, "reason": f"{left():.0f} s left < {need:.0f} s needed"})
                print(f"[{name}] SKIPPED: time guard ({left():.0f} s left)", flush=True)
                return None
            t = time.time()
            entry = REPORT["stages"].setdefault(name, {})
            try:
                entry["result"] = fn(*a, **k)
                entry["ok"] = True
            except Exception as exc:  # noqa: BLE001 - one failure must not lose the rest
                entry["ok"] = False
                entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                entry["trace"] = traceback.format_exc()[-3000:]
            entry["seconds"] = round(time.time() - t, 2)
            line = json.dumps(entry, default=str)
            print(f"[{name}] {'ok' if entry['ok'] else 'FAILED'} {entry['seconds']} s: {line[:1500]}", flush=True)
            save()
            return entry.get("result")
        return run
    return wrap


def save() -> None:
    out = Path(ARGS.out)
    out.mkdir(parents=True, exist_ok=True)
    REPORT["elapsed_s"] = round(time.time() - T0, 1)
    (out / "issue8.json").write_text(json.dumps(REPORT, indent=1, default=str) + "\n")


# ---------------------------------------------------------------------------------------- helpers

def gpu_record():
    from mosaic.plugins import host

    return host().get("gpus", "h200")


def fake_spec(shape: str):
    """A ModelSpec of ``shape`` whose weights are zero-stride views (no memory): for lowering on the CPU."""
    from mosaic_amk.cuda.hf_gpu import SHAPES
    from mosaic_amk.importer import _rope_params, reference_inv_freq
    from mosaic_amk.model import INV_FREQ, ModelSpec

    _, c = SHAPES[shape]
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kw = dict(family="llama", vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
              intermediate_size=c["intermediate_size"], num_layers=c["num_hidden_layers"],
              num_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"], head_dim=hd,
              rms_norm_eps=c["rms_norm_eps"], max_position_embeddings=c["max_position_embeddings"],
              tie_word_embeddings=c["tie_word_embeddings"], rope_type=c["rope_parameters"]["rope_type"])
    shapes = ModelSpec(**kw).expected_shapes()
    w = {n: np.broadcast_to(np.zeros((), np.float32), s) for n, s in shapes.items()}
    w[INV_FREQ] = reference_inv_freq(hd, _rope_params(c))
    return ModelSpec(**kw, weights=w)


def bf16r(a):
    from mosaic_amk.cuda.launcher import bf16_round

    return bf16_round(np.asarray(a, np.float32))


def ulps_bf16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in bf16 ulps between two arrays of bf16-representable float32 values."""
    def key(x):
        u = (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.int64)
        return np.where(u & 0x8000, 0x8000 - u, u)  # monotone integer order
    return np.abs(key(a) - key(b))


# ----------------------------------------------------------------------------------------- stages

@stage("environment")
def st_environment():
    import subprocess

    out = {"python": sys.version.split()[0], "argv": sys.argv[1:]}
    try:
        out["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm",
                                            "--format=csv,noheader"], capture_output=True, text=True,
                                           timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        out["nvidia_smi"] = str(exc)
    for mod in ("torch", "transformers", "cupy", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001
            out[mod] = f"missing: {exc}"
    if not ARGS.dry_run:
        import cupy as cp

        d = cp.cuda.Device()
        out["device"] = {k: d.attributes[k] for k in ("MultiProcessorCount", "MaxSharedMemoryPerMultiprocessor",
                                                      "MaxSharedMemoryPerBlockOptin", "L2CacheSize",
                                                      "CooperativeLaunch")}
    return out


@stage("build")
def st_build():
    from mosaic_amk.cuda.build import build

    t = time.time()
    b = build(512)
    return {**b.to_json(), "seconds": round(time.time() - t, 1)}


@stage("lower_validate_encode")
def st_lower():
    """Every shape's schedule at positions 0 and the last parity position: validated, same structure, encoded."""
    import attrs
    from mosaic_amk.config import VM_FUSIONS, ScheduleConfig
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.bench import floor_bytes
    from mosaic_amk.cuda.cuda_vm import cuda_config
    from mosaic_amk.lowering import layer_stages, lower
    from mosaic_amk.validate import validate

    gpu = gpu_record()
    out = {}
    last = ARGS.prompt_len + ARGS.tokens - 2
    for shape in SHAPE_ORDER:
        spec = fake_spec(shape)
        cfg = cuda_config(ScheduleConfig(), ARGS.prompt_len + ARGS.tokens)
        s0, s1 = lower(spec, cfg, gpu, 0), lower(spec, cfg, gpu, last)
        v0, v1 = validate(s0), validate(s1)
        enc = E.encode(s0)
        fb = floor_bytes(enc)
        out[shape] = {"tasks": len(s0.tasks), "counters": s0.num_counters, "valid": [v0.ok, v1.ok],
                      "same_structure": E.structure_key(s0) == E.structure_key(s1),
                      "floor_bytes": fb, "floor_ms_h200": fb / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3,
                      "kv_capacity": enc.max_attention_tokens}
        # the fused configuration (config.VM_FUSIONS): lowered, validated and encoded at the real sizes
        fcfg = attrs.evolve(cfg, fusion=VM_FUSIONS)
        f0, f1 = lower(spec, fcfg, gpu, 0), lower(spec, fcfg, gpu, last)
        E.encode(f0)
        out[shape]["fused"] = {"tasks": len(f0.tasks), "valid": [validate(f0).ok, validate(f1).ok],
                               "same_structure": E.structure_key(f0) == E.structure_key(f1),
                               "stages_per_layer": [layer_stages(s0)["per_layer"], layer_stages(f0)["per_layer"]]}
    return out


def _run_case(lz, weights, inputs, kv, out_name):
    """Bind, fill the KV cache, one launch (watchdog checked): the output as float32 on the host."""
    import cupy as cp

    lz.bind(weights, inputs)
    for k, v in (kv or {}).items():
        lz.dev[k][...] = cp.asarray(v)
    lz.launch()
    lz.check()
    return cp.asnumpy(lz.dev[out_name]).astype(np.float32)


def _launcher(schedule, mode="f32", unsafe=False, timeout_s=1.0, prefetch=1):
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.launcher import Launcher, gate

    gate(schedule, unsafe)
    # the position stays baked in (runtime_position=False): a multi-step timing launch repeats the same step
    return Launcher(E.encode(schedule, runtime_position=False), str(build(512).cubin), threads=512, mode=mode,
                    timeout_s=timeout_s, prefetch_depth=prefetch)


def _time_launch(lz, n=10, steps=1, **kw) -> float:
    """us per step: n launches of ``steps`` steps each (steps > 1: the launch overhead is paid once per launch,
    a grid sync separates the steps)."""
    import cupy as cp

    lz.launch(n_steps=steps, **kw)
    lz.check()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    for _ in range(n):
        lz.launch(n_steps=steps, **kw)
    e.record()
    e.synchronize()
    lz.check()
    return cp.cuda.get_elapsed_time(s, e) / (n * steps) * 1e3  # us


# GEMV bodies timed against each other (microkernels.cuh AMK_GEMV_IMPL / AMK_GEMV_DEPTH, build(defines=)): the
# default build is body 1; body 2 streams each warp's rows through a cp.async ring. Each variant: bits equal to the
# default build's hf-bf16 output, us per step (20-step launches) with the L2 prefetch on (the launcher's 1) and off.
GEMV_AB_NAMES = ("gemv_16384x8192", "gemv_silu_mul_8192x2048", "lm_head_gemv_argmax_128256x2048")
GEMV_AB_VARIANTS = {"body1": (), "body2": ("AMK_GEMV_IMPL=2",), "body2-depth12": ("AMK_GEMV_IMPL=2", "AMK_GEMV_DEPTH=12")}


def _gemv_ab(sched, inputs, weights, kv, out_name, ref_bits, floor_bytes) -> dict:
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.launcher import Launcher

    gpu = gpu_record()
    out = {}
    for tag, defines in GEMV_AB_VARIANTS.items():
        try:
            b = build(512, defines=defines)
            lz = Launcher(E.encode(sched, runtime_position=False), str(b.cubin), threads=512, mode="hf-bf16",
                          timeout_s=1.0, prefetch_depth=1)
            got = _run_case(lz, weights, inputs, kv, out_name)
            t_pf = _time_launch(lz, n=3, steps=20)
            t_nopf = _time_launch(lz, n=3, steps=20, prefetch_depth=0)
            out[tag] = {"registers": b.registers, "spill_stores": b.spill_stores,
                        "bits_equal_default": bool(np.array_equal(got.view(np.uint32), ref_bits.view(np.uint32))),
                        "us": round(t_pf, 2), "us_no_prefetch": round(t_nopf, 2),
                        "gbs": round(floor_bytes / (t_pf * 1e-6) / 1e9, 1),
                        "gbs_no_prefetch": round(floor_bytes / (t_nopf * 1e-6) / 1e9, 1),
                        "floor_us": round(floor_bytes / (gpu.hbm_bandwidth_gbs * 1e9) * 1e6, 2)}
        except Exception as exc:  # noqa: BLE001 - one variant must not lose the others
            out[tag] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    return out


@stage("microkernels", need=30)
def st_micro():
    """Each micro-kernel on random data: f32 mode vs ops.py (float32 on the same bf16 weights), HF-bf16
    mode vs torch bf16 (the HF eager formulation), and the big splittable ones timed vs their floor."""
    import cupy as cp
    import torch
    import torch.nn.functional as F
    from mosaic_amk import ops
    from mosaic_amk.cuda.launcher import SKIPPABLE
    from mosaic_amk.cuda.microbench import op_schedule, split_rows
    from mosaic_amk.schedule import Buffer

    gpu = gpu_record()
    sms = 132
    rng = np.random.default_rng(0)
    bw = gpu.hbm_bandwidth_gbs * 1e9
    results = {}

    def tb(a):  # bf16 torch tensor on the GPU from float32 numpy
        return torch.from_numpy(np.asarray(a, np.float32)).cuda().bfloat16()

    quick_set = ("gemv_16384x8192", "gemv_silu_mul_8192x2048", "lm_head_gemv_argmax_128256x2048",
                 "attention_gqa_32q8kv_pos300", "attention_gqa_window64_pos300", "attention_gqa_pos4095")

    def run(name, sched, inputs, weights, out_name, ref32, ref_hf=None, kv=None, floor_bytes=0, argmax=False):
        if ARGS.quick and name not in quick_set:
            return
        res = {}
        for mode in ("f32", "hf-bf16"):
            lz = _launcher(sched, mode=mode)
            got = _run_case(lz, weights, inputs, kv, out_name)
            ref = ref32 if mode == "f32" else ref_hf
            if ref is None:
                continue
            if mode == "f32":
                err = np.abs(got - ref)
                res["f32_max_abs_err"] = float(err.max())
                # normwise: float32 summation order is the only allowed difference from ops.py
                res["f32_max_rel_err"] = float(err.max() / max(float(np.abs(ref).max()), 1e-30))
                res["f32_ok"] = bool(res["f32_max_rel_err"] < 1e-4)
            else:
                u = ulps_bf16(got, ref)
                res["hf_exact_fraction"] = float((u == 0).mean())
                res["hf_max_ulps"] = int(u.max())
                res["hf_ok"] = bool(u.max() <= 2)
            if argmax:
                tok = int(cp.asnumpy(lz.dev["next_token"])[0])
                res[f"{mode}_argmax"] = tok
                res[f"{mode}_argmax_ok"] = tok == int(np.argmax(got))
            if floor_bytes and mode == "hf-bf16":
                # us per step in launches of 20 steps (launch overhead amortised; a grid sync per step, and
                # the no-op skeleton of the same launch, prefetch off, says what that sync costs)
                t_launch = _time_launch(lz)
                t_full = _time_launch(lz, n=3, steps=20)
                t_skel = _time_launch(lz, n=3, steps=20, skip_ops=sum(SKIPPABLE.values()), prefetch_depth=0)
                res.update(us=round(t_full, 2), us_one_launch=round(t_launch, 2), skeleton_us=round(t_skel, 2),
                           bytes=floor_bytes, floor_us=round(floor_bytes / bw * 1e6, 2),
                           gbs=round(floor_bytes / (t_full * 1e-6) / 1e9, 1),
                           gbs_net_of_skeleton=round(floor_bytes / (max(t_full - t_skel, 1e-3) * 1e-6) / 1e9, 1))
                if name in GEMV_AB_NAMES:
                    res["gemv_ab"] = _gemv_ab(sched, inputs, weights, kv, out_name, got, floor_bytes)
        results[name] = res
        print(f"  micro {name}: {res}", flush=True)

    # -- gemv (with bias + residual), split over the SMs; a big one for the floor -------------------------
    for tag, (N, K, bias, resid) in {"gemv_4096x2048_bias_res": (4096, 2048, True, True),
                                     "gemv_16384x8192": (16384, 8192, False, False)}.items():
        if ARGS.quick and tag not in quick_set:
            continue
        x, W = bf16r(rng.standard_normal(K, dtype=np.float32)), bf16r(rng.standard_normal((N, K), dtype=np.float32) * 0.02)
        b, r = bf16r(rng.standard_normal(N, dtype=np.float32)), bf16r(rng.standard_normal(N, dtype=np.float32))
        bufs = [Buffer("x", "f32", (K,), "input"), Buffer("w", "f32", (N, K), "weight"),
                Buffer("y", "f32", (N,), "output")]
        inputs, row_bufs = ["x", "w"], ["w", "y"]
        if bias:
            bufs.append(Buffer("b", "f32", (N,), "weight"))
            inputs.append("b")
            row_bufs.append("b")
        if resid:
            bufs.append(Buffer("res", "f32", (N,), "input"))
            inputs.append("res")
            row_bufs.append("res")
        s = op_schedule("gemv", bufs, inputs, ["y"], {"bias": bias, "residual": resid}, sms, split_rows(N, sms),
                        row_bufs)
        ref = np.empty(N, np.float32)
        ops.op_gemv([x, W, *( [b] if bias else []), *([r] if resid else [])], [ref],
                    {"row_start": 0, "row_end": N, "bias": bias, "residual": resid})
        lin = F.linear(tb(x)[None], tb(W), tb(b) if bias else None)[0]
        hf = (tb(r) + lin) if resid else lin
        run(tag, s, {"x": x, "res": r}, {"w": W, "b": b}, "y", ref, hf.float().cpu().numpy(),
            floor_bytes=N * K * 2 if not bias else 0)

    # -- gemv_silu_mul (Llama-1B MLP) ----------------------------------------------------------------------
    N, K = 8192, 2048
    x, Wg, Wu = bf16r(rng.standard_normal(K, dtype=np.float32)), bf16r(rng.standard_normal((N, K), dtype=np.float32) * 0.02), bf16r(
        rng.standard_normal((N, K), dtype=np.float32) * 0.02)
    bufs = [Buffer("x", "f32", (K,), "input"), Buffer("wg", "f32", (N, K), "weight"),
            Buffer("wu", "f32", (N, K), "weight"), Buffer("y", "f32", (N,), "output")]
    s = op_schedule("gemv_silu_mul", bufs, ["x", "wg", "wu"], ["y"], {"bias": False}, sms, split_rows(N, sms),
                    ["wg", "wu", "y"])
    ref = np.empty(N, np.float32)
    ops.op_gemv_silu_mul([x, Wg, Wu], [ref], {"row_start": 0, "row_end": N, "bias": False})
    hf = F.silu(F.linear(tb(x)[None], tb(Wg))) * F.linear(tb(x)[None], tb(Wu))
    run("gemv_silu_mul_8192x2048", s, {"x": x}, {"wg": Wg, "wu": Wu}, "y", ref, hf[0].float().cpu().numpy(),
        floor_bytes=2 * N * K * 2)

    # -- LM head GEMV + argmax (Llama-3.2-1B vocabulary) ----------------------------------------------------
    N, K = 128256, 2048
    x, W = bf16r(rng.standard_normal(K, dtype=np.float32)), bf16r(rng.standard_normal((N, K), dtype=np.float32) * 0.02)
    bufs = [Buffer("x", "f32", (K,), "input"), Buffer("w", "f32", (N, K), "weight"),
            Buffer("logits", "f32", (N,), "output"), Buffer("next_token", "i32", (1,), "output")]
    s = op_schedule("gemv", bufs, ["x", "w"], ["logits"], {"bias": False, "residual": False}, sms,
                    split_rows(N, sms), ["w", "logits"], argmax_of="logits")
    ref = W @ x
    hf = F.linear(tb(x)[None], tb(W))[0].float().cpu().numpy()
    run("lm_head_gemv_argmax_128256x2048", s, {"x": x}, {"w": W}, "logits", ref, hf, floor_bytes=N * K * 2,
        argmax=True)

    # -- rmsnorm --------------------------------------------------------------------------------------------
    n = 2048
    x, w = bf16r(rng.standard_normal(n, dtype=np.float32) * 3), bf16r(1 + 0.2 * rng.standard_normal(n, dtype=np.float32))
    bufs = [Buffer("x", "f32", (n,), "input"), Buffer("w", "f32", (n,), "weight"), Buffer("y", "f32", (n,), "output")]
    s = op_schedule("rmsnorm", bufs, ["x", "w"], ["y"], {"eps": 1e-5}, sms)
    ref = np.empty(n, np.float32)
    ops.op_rmsnorm([x, w], [ref], {"eps": 1e-5})
    xt = tb(x).float()
    hf = tb(w) * (xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    run("rmsnorm_2048", s, {"x": x}, {"w": w}, "y", ref, hf.float().cpu().numpy())

    # -- rope, rope_append, kv_append --------------------------------------------------------------------------
    from mosaic_amk.importer import reference_inv_freq

    nh, hd, pos = 32, 64, 37
    inv = reference_inv_freq(hd, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192})
    x = bf16r(rng.standard_normal(nh * hd, dtype=np.float32))
    rp = {"position": pos, "num_heads": nh, "head_dim": hd, "attention_scaling": 1.0}
    bufs = [Buffer("x", "f32", (nh * hd,), "input"), Buffer("rope.inv_freq", "f32", (hd // 2,), "weight"),
            Buffer("y", "f32", (nh * hd,), "output")]
    s = op_schedule("rope", bufs, ["x", "rope.inv_freq"], ["y"], rp, sms, position=pos)
    ref = np.empty(nh * hd, np.float32)
    ops.op_rope([x, inv], [ref], rp)
    cos, sin = ops.rope_tables(inv, pos, 1.0)
    q = tb(x).view(nh, hd)
    rot = torch.cat((-q[:, hd // 2:], q[:, :hd // 2]), dim=-1)
    hf = q * tb(cos) + rot * tb(sin)
    run("rope_32x64", s, {"x": x}, {"rope.inv_freq": inv}, "y", ref, hf.reshape(-1).float().cpu().numpy())

    pages, page, nkv = 8, 16, 8
    kvd = nkv * hd
    xk = bf16r(rng.standard_normal(kvd, dtype=np.float32))
    for op in ("rope_append", "kv_append"):
        bufs = [Buffer("x", "f32", (kvd,), "input"), Buffer("cache", "f32", (pages, page, kvd), "kv_cache")]
        inputs = ["x"]
        params = {"position": pos, "page_tokens": page}
        if op == "rope_append":
            bufs.insert(1, Buffer("rope.inv_freq", "f32", (hd // 2,), "weight"))
            inputs.append("rope.inv_freq")
            params.update(num_heads=nkv, head_dim=hd, attention_scaling=1.0)
        bufs.append(Buffer("dummy_out", "f32", (1,), "output"))
        s = op_schedule(op, bufs, inputs, ["cache"], params, sms,
                        extra_ranges={"cache": (pos // page, pos // page + 1)}, position=pos)
        s = _drop_outputs(s)
        ref = np.zeros((pages, page, kvd), np.float32)
        ops.KERNELS[op]([xk, inv] if op == "rope_append" else [xk], [ref], params)
        run(f"{op}_{kvd}", s, {"x": xk}, {"rope.inv_freq": inv}, "cache", ref, bf16r(ref) if op == "kv_append" else None)

    # -- attention (GQA), full and windowed; a long context timed -----------------------------------------------
    for tag, (pos, window, pages) in {"attention_gqa_32q8kv_pos300": (300, 0, 32),
                                      "attention_gqa_window64_pos300": (300, 64, 32),
                                      "attention_gqa_pos4095": (4095, 0, 256)}.items():
        cap = pages * page
        kc = bf16r(rng.standard_normal((pages, page, kvd), dtype=np.float32))
        vc = bf16r(rng.standard_normal((pages, page, kvd), dtype=np.float32))
        qv = bf16r(rng.standard_normal(nh * hd, dtype=np.float32))
        rep = nh // nkv
        first = max(0, pos - window + 1) if window else 0
        bufs = [Buffer("q", "f32", (nh * hd,), "input"), Buffer("k", "f32", (pages, page, kvd), "kv_cache"),
                Buffer("v", "f32", (pages, page, kvd), "kv_cache"), Buffer("y", "f32", (nh * hd,), "output")]
        tasks_rows = [(g * rep * hd, (g + 1) * rep * hd) for g in range(nkv)]
        params = {"position": pos, "num_heads": nh, "num_kv_heads": nkv, "head_dim": hd, "window": window,
                  "scale": hd ** -0.5, "page_tokens": page}
        s = op_schedule("attention", bufs, ["q", "k", "v"], ["y"], params, sms, tasks_rows, ["q", "y"],
                        extra_ranges={"k": (first // page, pos // page + 1), "v": (first // page, pos // page + 1)},
                        position=pos)
        ref = np.empty(nh * hd, np.float32)
        ops.op_attention([qv, kc, vc], [ref], {**params, "row_start": 0, "row_end": nh * hd})
        K_ = tb(kc.reshape(cap, nkv, hd)[first:pos + 1]).permute(1, 0, 2).repeat_interleave(rep, 0)
        V_ = tb(vc.reshape(cap, nkv, hd)[first:pos + 1]).permute(1, 0, 2).repeat_interleave(rep, 0)
        Q_ = tb(qv).view(nh, 1, hd)
        w_ = torch.matmul(Q_, K_.transpose(1, 2)) * (hd ** -0.5)
        p_ = torch.softmax(w_, dim=-1, dtype=torch.float32).bfloat16()
        hf = torch.matmul(p_, V_).reshape(-1).float().cpu().numpy()
        nbytes = 2 * (pos + 1 - first) * kvd * 4 if pos > 1000 else 0
        run(tag, s, {"q": qv}, {}, "y", ref, hf, kv={"k": kc, "v": vc}, floor_bytes=nbytes)

    # -- silu_mul, add, embed, argmax alone ---------------------------------------------------------------------
    n = 8192
    g, u = bf16r(rng.standard_normal(n, dtype=np.float32) * 3), bf16r(rng.standard_normal(n, dtype=np.float32))
    for op, a, b_ in (("silu_mul", g, u), ("add", g, u)):
        bufs = [Buffer("a", "f32", (n,), "input"), Buffer("b", "f32", (n,), "input"), Buffer("y", "f32", (n,), "output")]
        s = op_schedule(op, bufs, ["a", "b"], ["y"], {}, sms)
        ref = np.empty(n, np.float32)
        ops.KERNELS[op]([a, b_], [ref], {})
        hf = (F.silu(tb(a)) * tb(b_)) if op == "silu_mul" else (tb(a) + tb(b_))
        run(f"{op}_{n}", s, {"a": a, "b": b_}, {}, "y", ref, hf.float().cpu().numpy())
    V, H = 1000, 576
    table = bf16r(rng.standard_normal((V, H), dtype=np.float32))
    bufs = [Buffer("table", "f32", (V, H), "weight"), Buffer("token", "i32", (1,), "input"),
            Buffer("x", "f32", (H,), "output")]
    s = op_schedule("embed", bufs, ["table", "token"], ["x"], {}, sms)
    run("embed_1000x576", s, {"token": np.array([777], np.int32)}, {"table": table}, "x", table[777], table[777])
    n = 128256
    lg = bf16r(rng.standard_normal(n, dtype=np.float32))
    lg[[5000, 90000]] = 9.0  # a tie: the first index wins
    bufs = [Buffer("logits", "f32", (n,), "input"), Buffer("next_token", "i32", (1,), "output")]
    s = op_schedule("argmax", bufs, ["logits"], ["next_token"], {}, sms)
    lz = _launcher(s)
    lz.bind({}, {"logits": lg})
    lz.launch()
    lz.check()
    results["argmax_128256_tie"] = {"got": int(cp.asnumpy(lz.dev["next_token"])[0]), "want": 5000}
    results["argmax_128256_tie"]["ok"] = results["argmax_128256_tie"]["got"] == 5000
    results["all_ok"] = all(v.get(k, True) for v in results.values() if isinstance(v, dict)
                            for k in ("f32_ok", "hf_ok", "ok", "f32_argmax_ok", "hf-bf16_argmax_ok"))
    return results


def _drop_outputs(s):
    """The kv_append/rope_append micro schedules write the cache (kind kv_cache): no output buffer is
    produced, so drop the placeholder output (the validator checks that every listed output is written)."""
    import attrs

    return attrs.evolve(s, buffers=tuple(b for b in s.buffers if b.name != "dummy_out"), outputs=())


@stage("handoff", need=20)
def st_handoff():
    """One counter hand-off between SMs: a chain of n no-op tasks (ops skipped: only wait + signal),
    all on SM 0 vs alternating SM 0 / SM 1 vs SM 0 / SM 131; per-hand-off cost = time / n."""
    from mosaic_amk.cuda.launcher import SKIPPABLE
    from mosaic_amk.cuda.microbench import handoff_chain

    n = 2000
    out = {"n": n}
    for tag, sms in (("same_sm", [0]), ("sm0_sm1", [0, 1]), ("sm0_sm131", [0, 131]), ("sm0_sm66", [0, 66])):
        lz = _launcher(handoff_chain(n, sms, 132))
        lz.bind({}, {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)})
        t_skip = _time_launch(lz, n=5, skip_ops=sum(SKIPPABLE.values()))
        t_ops = _time_launch(lz, n=5)
        y = float(lz.dev[f"y{n - 1}"].get()[0])
        out[tag] = {"us_per_task_sync_only": round(t_skip / n, 4), "us_per_task_with_add": round(t_ops / n, 4),
                    "launch_us": round(t_skip, 1), "chain_result": y, "chain_ok": y == n + 1}
    # an empty launch: the same VM with one no-op task (launch + two grid syncs)
    lz = _launcher(handoff_chain(1, [0], 132))
    lz.bind({}, {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)})
    out["one_task_launch_us"] = round(_time_launch(lz, n=20), 2)
    # every task of the alternating chains waits for the other SM: its time per task is one hand-off
    out["cross_sm_handoff_us"] = out["sm0_sm1"]["us_per_task_sync_only"]
    out["cross_sm_extra_over_same_sm_us"] = round(out["sm0_sm1"]["us_per_task_sync_only"]
                                                  - out["same_sm"]["us_per_task_sync_only"], 4)
    return out


@stage("watchdog", need=15)
def st_watchdog():
    """The planted deadlock: the validator rejects it; the launcher refuses it without unsafe; forced,
    the watchdog aborts with the dump; the GPU runs the next (valid) launch correctly."""
    import cupy as cp
    import torch
    from mosaic.errors import CheckFailed
    from mosaic_amk.cuda.launcher import WatchdogAbort
    from mosaic_amk.cuda.microbench import deadlock, handoff_chain
    from mosaic_amk.validate import validate

    s = deadlock(132)
    out = {"validator": [d.code for d in validate(s).diagnostics]}
    try:
        _launcher(s)
        out["refused_without_unsafe"] = False
    except CheckFailed as exc:
        out["refused_without_unsafe"] = True
        out["refusal"] = str(exc)[:300]
    lz = _launcher(s, unsafe=True, timeout_s=0.25)
    lz.bind({}, {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    t = time.time()
    lz.launch()
    try:
        lz.check()
        out["tripped"] = False
    except WatchdogAbort as exc:
        out["tripped"] = True
        out["message"] = str(exc)
        out["dump_blocks_0_1"] = exc.dump[:2]
        out["dump_states"] = {st: sum(d["state"] == st for d in exc.dump) for st in {d["state"] for d in exc.dump}}
    out["abort_wall_s"] = round(time.time() - t, 3)
    # a launch on the aborted launcher does nothing until re-armed (sticky flag)
    lz.launch()
    try:
        lz.check()
        out["sticky"] = False
    except WatchdogAbort:
        out["sticky"] = True
    # the GPU stays usable: a valid VM launch and a torch matmul right after
    ok = _launcher(handoff_chain(64, [0, 1], 132))
    ok.bind({}, {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)})
    ok.launch()
    ok.check()
    out["next_launch_result"] = float(cp.asnumpy(ok.dev["y63"])[0])
    out["next_launch_ok"] = out["next_launch_result"] == 65.0
    a = torch.randn(256, 256, device="cuda")
    out["torch_after_ok"] = bool(torch.allclose(a @ torch.eye(256, device="cuda"), a))
    return out


def _prompts(vocab: int, n: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(v) for v in rng.integers(0, vocab, length)] for _ in range(n)]


def model_stage(shape: str, do_bench: bool, do_parity: bool = True, planted: bool = False):
    @stage(f"model:{shape}", need=25)
    def run():
        import torch
        from mosaic_amk.config import ScheduleConfig
        from mosaic_amk.cuda import hf_gpu
        from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch
        from mosaic_amk.parity import compare

        gpu = gpu_record()
        t = time.time()
        model = hf_gpu.random_model(shape, seed=0)
        spec = hf_gpu.spec_of(model)
        weights = weights_from_torch(model, spec)
        out = {"params": spec.num_params(), "build_s": round(time.time() - t, 1)}
        n_prompts, n_tokens = ARGS.prompts, ARGS.tokens
        if left() < 90 and n_tokens > 32:  # scale down when time is short, and say so
            n_prompts, n_tokens = min(n_prompts, 4), 32
            out["scaled_down"] = f"{n_prompts} prompts x {n_tokens} tokens (time guard)"
        vm = CudaVM(spec, ScheduleConfig(), gpu, weights=weights, max_positions=ARGS.prompt_len + n_tokens)
        out["vm"] = {**vm.enc.summary(), "build": vm.build_info.to_json(), "smem_bytes": vm.launcher.smem_bytes}
        if do_parity:
            prompts = _prompts(spec.vocab_size, n_prompts, ARGS.prompt_len, seed=1)
            t = time.time()
            hf_tokens, hf_logits = hf_gpu.greedy(model, prompts, n_tokens)
            out["hf_generate_s"] = round(time.time() - t, 1)
            per, t = [], time.time()
            for i, p in enumerate(prompts):
                toks, logits = vm.generate(p, n_tokens)
                r = compare(toks, logits, hf_tokens[i], list(hf_logits[i]))
                row = {"prompt": i, "ok": r.ok, "first_mismatch": r.first_mismatch,
                       "max_logit_error": r.max_logit_error}
                if not r.ok:
                    k = r.first_mismatch
                    top = np.sort(hf_logits[i][k])[-2:]
                    row.update(hf_margin=float(top[1] - top[0]), hf_token=hf_tokens[i][k], vm_token=toks[k],
                               logit_gap_vm_choice=float(hf_logits[i][k][hf_tokens[i][k]] - hf_logits[i][k][toks[k]]))
                per.append(row)
            out["amk_generate_s"] = round(time.time() - t, 1)
            out["parity"] = {"prompts": n_prompts, "tokens": n_tokens, "prompt_len": ARGS.prompt_len,
                             "exact": sum(r["ok"] for r in per), "max_logit_error": max(r["max_logit_error"] for r in per),
                             "per_prompt": per}
        if planted:
            out["planted_deadlock_in_model"] = _planted(spec, weights, vm)
        if do_bench:
            from mosaic_amk.cuda.bench import format_table, run_bench

            budget = max(30.0, min(150.0, left() - (110 if ARGS.quick else 60)))
            res = run_bench(model, spec, gpu, rounds=ARGS.rounds, steps=ARGS.steps, log=print,
                            deadline=time.time() + budget, probe=["default", "rows32-lm"])
            out["bench"] = res
            print(format_table(res), flush=True)
        del vm, model, weights
        torch.cuda.empty_cache()
        return out
    return run


def _planted(spec, weights, vm):
    """A real schedule with one attention wait made unsatisfiable: rejected, forced, watchdog, recovery."""
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.launcher import Launcher, WatchdogAbort
    from mosaic_amk.cuda.microbench import raise_threshold
    from mosaic_amk.lowering import lower
    from mosaic_amk.validate import validate

    s0 = lower(spec, vm.config, vm.gpu, 0)
    idx = next(i for i, t in enumerate(s0.tasks) if t.op == "attention" and t.params.get("row_start") == 0
               and "l10." in t.outputs[0])
    bad = raise_threshold(s0, idx)
    out = {"task": s0.tasks[idx].id, "validator": sorted({d.code for d in validate(bad).diagnostics})}
    lz = Launcher(E.encode(bad), str(vm.build_info.cubin), threads=512, smem_bytes=vm.config.smem_bytes,
                  timeout_s=0.25)
    lz.bind(weights)
    lz.launch(position=0)
    try:
        lz.check()
        out["tripped"] = False
    except WatchdogAbort as exc:
        out["tripped"] = True
        out["message"] = str(exc)
        origin = [d for d in exc.dump if d["state"] == "timeout"]
        out["origin"] = origin[:2]
        out["states"] = {st: sum(d["state"] == st for d in exc.dump) for st in {d["state"] for d in exc.dump}}
    del lz
    toks, _ = vm.generate([1, 2, 3, 4], 8, logits=False)
    toks2, _ = vm.generate([1, 2, 3, 4], 8, logits=False)
    out["valid_vm_after"] = {"tokens": toks, "repeatable": toks == toks2}
    return out


@stage("cli_generate_check_hf", need=20)
def st_cli():
    """`mosaic amk generate --vm cuda --check-hf` end to end on a saved tiny checkpoint."""
    import subprocess
    import tempfile

    from mosaic_amk.tiny_models import make_checkpoint

    out = {}
    with tempfile.TemporaryDirectory() as d:
        for fam in ("llama", "smollm2"):
            ck = make_checkpoint(Path(d) / fam, fam)
            cmd = [sys.executable, "-c", "import sys; from mosaic.cli import main; sys.exit(main())", "amk", "generate", "--model", str(ck), "--prompt",
                   "1,2,3,4,5", "--tokens", "24", "--vm", "cuda", "--check-hf", "--json"]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            out[fam] = {"rc": p.returncode, "stdout": p.stdout[-1500:], "stderr": p.stderr[-1500:]}
    return out


# ------------------------------------------------------------------------------ fused GEMVs (child processes)

def _run_child(kind: str, timeout: float) -> dict:
    """Run ``--child kind`` in a fresh process (its own CUDA context) and return what it saved; a child that
    crashes, faults the GPU or times out fails this stage only (what it saved before is kept)."""
    import subprocess

    out_dir = Path(ARGS.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"issue8_{kind}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--out", str(out_dir), "--rounds",
           str(ARGS.rounds), "--steps", str(ARGS.steps), "--bench-shapes", ",".join(ARGS.bench_shapes),
           "--budget", str(max(10.0, timeout - 5))]
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, tail = p.returncode, (p.stdout[-6000:], p.stderr[-3000:])
    except subprocess.TimeoutExpired as exc:
        rc, tail = "timeout", ((exc.stdout or b"")[-6000:], (exc.stderr or b"")[-3000:])
        tail = tuple(x.decode(errors="replace") if isinstance(x, bytes) else x for x in tail)
    print(tail[0], flush=True)
    res = json.loads(path.read_text()) if path.exists() else {}
    res["child"] = {"rc": rc, "seconds": round(time.time() - t, 1)}
    if rc != 0:
        res["child"]["stderr_tail"] = tail[1]
        REPORT["stages"].setdefault(kind.replace("-", "_"), {})["partial"] = res
        raise RuntimeError(f"child {kind} ended with {rc}: {tail[1][-400:]}")
    return res


@stage("fused_micro", need=30)
def st_fused_micro():
    return _run_child("fused-micro", timeout=max(20.0, min(75.0, left() - 50)))


@stage("fused_bench", need=45)
def st_fused_bench():
    return _run_child("fused-bench", timeout=max(30.0, left() + 20))


def record_failure(out: dict, exc: BaseException) -> None:
    """A stage part that raised: its error line and the end of its traceback, kept in its JSON (never lost)."""
    out["error"] = f"{type(exc).__name__}: {exc}"[:1500]
    out["trace"] = traceback.format_exc()[-2000:]


def _child_save(kind: str, res: dict) -> None:
    out = Path(ARGS.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"issue8_{kind}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")


def _torch_fused_ref(c: dict):
    """transformers' bf16 eager formulation of a fused GEMV case (rmsnorm, linear, RoPE as HF computes them)."""
    import torch
    import torch.nn.functional as F
    from mosaic_amk import ops

    P = c["parts"]

    def tb(a):
        return torch.from_numpy(np.asarray(a, np.float32)).cuda().bfloat16()

    xt = tb(P["x"]).float()
    xn = (tb(P["nw"]) * (xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + P["eps"])).bfloat16())[None]
    opt = lambda k: tb(P[k]) if P.get(k) is not None else None  # noqa: E731
    if c["case"] == "rmsnorm_gemv":
        return (tb(P["res"]) + F.linear(xn, tb(P["w"]), opt("b"))[0]).float().cpu().numpy()
    if c["case"] == "rmsnorm_gemv_silu_mul":
        y = F.silu(F.linear(xn, tb(P["wg"]), opt("bg"))) * F.linear(xn, tb(P["wu"]), opt("bu"))
        return y[0].float().cpu().numpy()
    hd, nh = P["head_dim"], P["heads"]
    y = F.linear(xn, tb(P["w"]), opt("b"))[0]
    if P["rope"]:
        cos, sin = ops.rope_tables(P["inv_freq"], P["position"], 1.0)
        q = y.view(nh, hd)
        rot = torch.cat((-q[:, hd // 2:], q[:, :hd // 2]), dim=-1)
        y = (q * tb(cos) + rot * tb(sin)).reshape(-1)
    return y.float().cpu().numpy()


def child_fused_micro() -> dict:
    """Each fused GEMV micro-kernel at Llama-3.2-1B sizes, split over the 132 SMs: f32 mode vs ops.KERNELS of the
    fused op, hf-bf16 mode vs torch bf16 (HF's formulation) and vs the VM's own unfused chain (rmsnorm, gemv /
    gemv_silu_mul, rope / rope_append / kv_append: expected bit-identical), and us per step fused vs unfused."""
    import cupy as cp
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.microbench import FUSED_GEMV_CASES, fused_gemv_case
    from mosaic_amk.importer import reference_inv_freq

    res: dict = {"build": build(512).to_json(), "cases": {}}
    inv = reference_inv_freq(64, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192})
    sizes = {"rmsnorm_gemv": dict(rows=4096), "rmsnorm_gemv_silu_mul": dict(rows=8192), "gemv_rope": dict(heads=32),
             "gemv_rope_append_k": dict(heads=8), "gemv_rope_append_v": dict(heads=8)}
    for case in FUSED_GEMV_CASES:
        out: dict = {}
        res["cases"][case] = out
        try:
            c = fused_gemv_case(case, np.random.default_rng(7), hidden=2048, head_dim=64, position=37,
                                inv_freq=inv, **sizes[case])
            pos = c["parts"]["position"]

            def run(kind, mode, c=c, pos=pos):
                lz = _launcher(c[kind], mode=mode)
                lz.bind(c["weights"], c["inputs"])
                lz.launch()
                lz.check()
                got = cp.asnumpy(lz.dev[c["out"]]).astype(np.float32)
                return lz, (got.reshape(-1, got.shape[-1])[pos] if c["out"] == "cache" else got)

            ref = c["ref"].reshape(-1, c["ref"].shape[-1])[pos] if c["out"] == "cache" else c["ref"]
            _, got = run("fused", "f32")
            err = np.abs(got - ref)
            out["f32_max_rel_err"] = float(err.max() / max(float(np.abs(ref).max()), 1e-30))
            out["f32_ok"] = bool(out["f32_max_rel_err"] < 1e-4)
            lz_f, fused = run("fused", "hf-bf16")
            lz_u, unfused = run("unfused", "hf-bf16")
            hf = _torch_fused_ref(c)
            u = ulps_bf16(fused, hf)
            out.update(hf_exact_fraction=float((u == 0).mean()), hf_max_ulps=int(u.max()), hf_ok=bool(u.max() <= 2),
                       vs_unfused_exact_fraction=float((fused.view(np.uint32) == unfused.view(np.uint32)).mean()),
                       unfused_hf_exact_fraction=float((ulps_bf16(unfused, hf) == 0).mean()))
            out["vs_unfused_ok"] = out["vs_unfused_exact_fraction"] == 1.0
            out["us_fused"] = round(_time_launch(lz_f, n=3, steps=20), 2)
            out["us_unfused"] = round(_time_launch(lz_u, n=3, steps=20), 2)
            out["tasks_fused"], out["tasks_unfused"] = len(c["fused"].tasks), len(c["unfused"].tasks)
        except Exception as exc:  # noqa: BLE001 - one case must not lose the others
            record_failure(out, exc)
        print(f"  fused micro {case}: {out}", flush=True)
        _child_save("fused-micro", res)
    # the fused ops' own criterion: ops.py in f32, the unfused chain's bits in hf-bf16 (hf_ok, <= 2 ulps from torch,
    # is reported as for the other micro-kernels: the plain gemv misses it by summation order alone)
    res["all_ok"] = all(v.get("f32_ok") and v.get("vs_unfused_ok") for v in res["cases"].values())
    _child_save("fused-micro", res)
    return res


def child_fused_bench() -> dict:
    """The bench shapes with the fusions the VM runs (config.VM_FUSIONS) against the best unfused configs of this
    morning (rows32-lm, rows16-lm), interleaved in this process, each gated on greedy-token equality with HF eager
    bf16; the probes on fused-rows32-lm and fused-rows16-lm. HF eager / graph are timed in the parent's bench."""
    import torch
    from mosaic_amk.cuda import hf_gpu
    from mosaic_amk.cuda.bench import all_candidates, format_table, fused_candidates, run_bench
    from mosaic_amk.lowering import layer_stages, lower

    gpu = gpu_record()
    res: dict = {"shapes": {}}
    for shape in ARGS.bench_shapes:
        out: dict = {}
        res["shapes"][shape] = out
        try:
            t = time.time()
            model = hf_gpu.random_model(shape, seed=0)
            spec = hf_gpu.spec_of(model)
            out["build_s"] = round(time.time() - t, 1)
            ref = [c for c in all_candidates(spec) if c[0] in ("rows32-lm", "rows16-lm")]
            fused = fused_candidates(spec)
            out["stages_per_layer"] = {n: layer_stages(lower(fake_spec(shape), cfg, gpu, 0))["per_layer"]
                                       for n, cfg in (ref[0], fused[0])}
            budget = max(20.0, min(90.0, left() / max(1, len(ARGS.bench_shapes) - list(ARGS.bench_shapes).index(shape))
                                   - 20))
            b = run_bench(model, spec, gpu, [*ref, *fused], rounds=ARGS.rounds, steps=ARGS.steps, eager=False,
                          graph=False, probe=["fused-rows32-lm", "fused-rows16-lm"], log=print,
                          deadline=time.time() + budget)
            out["bench"] = b
            print(format_table(b), flush=True)
            del model
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001
            record_failure(out, exc)
        _child_save("fused-bench", res)
    return res


# ------------------------------------------------------------ synchronisation variants (child process)

@stage("sync", need=40)
def st_sync():
    return _run_child("sync", timeout=max(40.0, left() + 20))


def _sync_launcher(schedule, variant: str, **kw):
    """A launcher of ``schedule`` (gated, or an already encoded schedule) under one synchronisation variant."""
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.bench import SYNC_VARIANTS
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.launcher import Launcher, gate

    wait, signal, prefetch = SYNC_VARIANTS[variant]
    unsafe = kw.pop("unsafe", False)
    if not isinstance(schedule, E.Encoded):
        gate(schedule, unsafe)
        schedule = E.encode(schedule, runtime_position=False)
    return Launcher(schedule, str(build(512).cubin), threads=512, mode="f32", wait_mode=wait, signal_mode=signal,
                    prefetch_mode=prefetch, **kw)


def child_sync() -> dict:
    """The VM's synchronisation variants (bench.SYNC_VARIANTS; vm.cu sync_flags), each against v0 in this one
    process: (1) the hand-off chain (2000 no-op tasks, each waiting for the previous one's counter; same SM, SM 0
    <-> SM 1, SM 0 <-> SM 66), us per hand-off with the ops skipped and with the add; (2) the planted deadlock
    trips the watchdog and a valid chain runs right after; (3) per bench shape, the best unfused config of the
    last run (Llama-3.2-1B rows32-lm, SmolLM2-135M rows16-lm) and its fused twin under every variant, each gated
    on greedy-token equality with HF eager bf16 (a broken variant reports no time), interleaved rounds: full,
    "skip all ops (sync skeleton)" and "no prefetch" ms/token."""
    import cupy as cp
    import torch
    from mosaic_amk.cuda import bench as B
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda import hf_gpu
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.launcher import SKIPPABLE, WatchdogAbort, gate
    from mosaic_amk.cuda.microbench import deadlock, handoff_chain

    SYNC_VARIANTS = B.SYNC_VARIANTS

    res: dict = {"build": build(512).to_json(), "variants": {k: list(v) for k, v in SYNC_VARIANTS.items()},
                 "handoff": {}, "watchdog": {}, "bench": {}}
    n = 2000
    ones = {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)}
    for tag, sms in (("same_sm", [0]), ("sm0_sm1", [0, 1]), ("sm0_sm66", [0, 66])):
        chain = handoff_chain(n, sms, 132)
        gate(chain)
        chain = E.encode(chain, runtime_position=False)
        for v in SYNC_VARIANTS:
            row: dict = {}
            try:
                lz = _sync_launcher(chain, v)
                lz.bind({}, ones)
                t_skip = _time_launch(lz, n=5, skip_ops=sum(SKIPPABLE.values()))
                t_ops = _time_launch(lz, n=5)
                y = float(lz.dev[f"y{n - 1}"].get()[0])
                row = {"us_per_task_sync_only": round(t_skip / n, 4), "us_per_task_with_add": round(t_ops / n, 4),
                       "chain_ok": y == n + 1}
            except Exception as exc:  # noqa: BLE001
                row = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            res["handoff"].setdefault(tag, {})[v] = row
        print(f"  sync hand-off {tag}: {res['handoff'][tag]}", flush=True)
    _child_save("sync", res)
    for v in SYNC_VARIANTS:
        w: dict = {}
        try:
            lz = _sync_launcher(deadlock(132), v, unsafe=True, timeout_s=0.1)
            lz.bind({}, {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
            lz.launch()
            try:
                lz.check()
                w["tripped"] = False
            except WatchdogAbort as exc:
                w["tripped"] = True
                w["states"] = sorted({d["state"] for d in exc.dump})
                w["origin"] = [d for d in exc.dump if d["state"] == "timeout"][:1]
            ok = _sync_launcher(handoff_chain(64, [0, 1], 132), v)
            ok.bind({}, ones)
            ok.launch(n_steps=3)
            ok.check()
            w["next_launch_ok"] = float(cp.asnumpy(ok.dev["y63"])[0]) == 65.0
        except Exception as exc:  # noqa: BLE001
            w["error"] = f"{type(exc).__name__}: {exc}"[:500]
        res["watchdog"][v] = w
    print(f"  sync watchdog: {res['watchdog']}", flush=True)
    _child_save("sync", res)
    gpu = gpu_record()
    base_name = {"llama-3.2-1b": "rows32-lm", "smollm2-135m": "rows16-lm"}
    probes = ["skip all ops (sync skeleton)", "no prefetch"]
    for i, shape in enumerate(ARGS.bench_shapes):
        out: dict = {}
        res["bench"][shape] = out
        try:
            model = hf_gpu.random_model(shape, seed=0)
            spec = hf_gpu.spec_of(model)
            name = base_name.get(shape, "rows32-lm")
            base = [c for c in B.all_candidates(spec) if c[0] == name]
            fused = [c for c in B.fused_candidates(spec) if c[0] == f"fused-{name}"]
            cands = B.sync_candidates(base) + B.sync_candidates(fused)
            budget = max(20.0, left() / max(1, len(ARGS.bench_shapes) - i) - 10)
            b = B.run_bench(model, spec, gpu, cands, rounds=ARGS.rounds, steps=ARGS.steps, eager=False, graph=False,
                          probe=[c[0] for c in cands], probe_only=probes, log=print, deadline=time.time() + budget)
            out["bench"] = b
            print(B.format_table(b), flush=True)
            del model
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001
            record_failure(out, exc)
        _child_save("sync", res)
    return res


def sync_summary(r: dict) -> list[str]:
    """The variant table: hand-off us, watchdog, and per shape / config: full, skeleton, no-prefetch ms/token."""
    lines = []
    hs = r.get("handoff") or {}
    if hs:
        lines.append("  sync hand-off us/task (sync only | with add):  " + "  ".join(hs))
        for v in r.get("variants", {}):
            cells = [f"{(hs[t].get(v) or {}).get('us_per_task_sync_only', '-')!s:>7} | "
                     f"{(hs[t].get(v) or {}).get('us_per_task_with_add', '-')!s:<7}" for t in hs]
            lines.append(f"    {v:10s} " + "   ".join(cells))
    for v, w in (r.get("watchdog") or {}).items():
        if not (w.get("tripped") and w.get("next_launch_ok")):
            lines.append(f"  sync watchdog {v}: {w}"[:200])
    for shape, o in (r.get("bench") or {}).items():
        if "error" in o:
            lines.append(f"  sync bench {shape}: ERROR {o['error'][:150]}")
            continue
        ms = {c["name"]: c.get("ms_per_token") for c in o["bench"].get("contenders", [])}
        lines.append(f"  sync bench {shape} ms/token: {'config/variant':28s} {'full':>7s} {'skeleton':>9s} {'no-pf':>7s}")
        for cand in o["bench"].get("candidates", []):
            nm = cand["name"]
            f = lambda k: f"{k:7.3f}" if isinstance(k, float) else f"{'-':>7s}"  # noqa: E731
            lines.append(f"    {'':24s} {nm:28s} {f(ms.get(f'amk[{nm}]'))} "
                         f"{f(ms.get(f'amk probe[{nm}]: skip all ops (sync skeleton)')):>9s} "
                         f"{f(ms.get(f'amk probe[{nm}]: no prefetch'))}"
                         + (f"  {cand.get('gate') or cand.get('error')}"[:120] if cand.get("gate") or cand.get("error") else ""))
    return lines


def summary() -> str:
    st = REPORT["stages"]
    lines = ["", "=" * 100, "issue 8 summary"]
    for name, e in st.items():
        lines.append(f"  {name:32s} {'ok' if e.get('ok') else 'FAILED: ' + e.get('error', '')[:120]:s} ({e.get('seconds')} s)")
    mic = (st.get("microkernels") or {}).get("result") or {}
    if mic:
        lines.append("  micro-kernel                         f32 rel err  hf exact  hf max ulps      us   floor us    GB/s")
        for k, v in mic.items():
            if isinstance(v, dict) and "f32_max_rel_err" in v:
                lines.append(f"    {k:34s} {v.get('f32_max_rel_err', float('nan')):10.2e} {v.get('hf_exact_fraction', float('nan')):9.4f}"
                             f" {v.get('hf_max_ulps', -1):10d} {v.get('us', float('nan')):8} {v.get('floor_us', float('nan')):9} "
                             f"{v.get('gbs', float('nan')):8}")
    ab = [(k, v["gemv_ab"]) for k, v in mic.items() if isinstance(v, dict) and v.get("gemv_ab")]
    if ab:
        lines.append("  GEMV body A/B (us/step, 20-step launches; GB/s of the weight bytes; =bits vs the default build)")
        for k, var in ab:
            for tag, r in var.items():
                lines.append(f"    {k:34s} {tag:14s} " + (f"ERROR {r['error'][:80]}" if "error" in r else
                             f"{r['us']:8} us {r['gbs']:7} GB/s | no prefetch {r['us_no_prefetch']:8} us "
                             f"{r['gbs_no_prefetch']:7} GB/s | floor {r['floor_us']} us | =bits {r['bits_equal_default']}"
                             f" | regs {r['registers']} spill {r['spill_stores']}"))
    for name, e in st.items():
        if not name.startswith("model:") or not e.get("ok"):
            continue
        r = e["result"]
        if "parity" in r:
            p = r["parity"]
            lines.append(f"  parity {name[6:]:16s} exact {p['exact']}/{p['prompts']} prompts x {p['tokens']} tokens, "
                         f"max logit error {p['max_logit_error']:.3g}"
                         + (f"  [{r['scaled_down']}]" if r.get("scaled_down") else ""))
        if "bench" in r:
            b = r["bench"]
            fd = b.get("floor_ms_datasheet")
            for c in b.get("contenders", []):
                ms = c.get("ms_per_token")
                lines.append(f"    bench {name[6:]:14s} {c['name']:42s} "
                             + (f"{ms:8.3f} ms/token" if ms else f"error {c.get('error', '')[:60]}")
                             + (f"  ({fd / ms * 100:5.1f}% of floor {fd:.3f})" if ms and fd else ""))
    fm = (st.get("fused_micro") or {}).get("result") or (st.get("fused_micro") or {}).get("partial") or {}
    if fm.get("cases"):
        lines.append("  fused micro-kernel       f32 rel err  hf exact  hf max ulps  =unfused (bits)  us fused  us unfused")
        for k, v in fm["cases"].items():
            if "error" in v:
                lines.append(f"    {k:22s} ERROR {v['error'][:110]}")
                continue
            lines.append(f"    {k:22s} {v.get('f32_max_rel_err', float('nan')):10.2e} {v.get('hf_exact_fraction', float('nan')):9.4f}"
                         f" {v.get('hf_max_ulps', -1):11d} {v.get('vs_unfused_exact_fraction', float('nan')):15.4f}"
                         f" {v.get('us_fused', float('nan')):9} {v.get('us_unfused', float('nan')):11}")
    fb = (st.get("fused_bench") or {}).get("result") or (st.get("fused_bench") or {}).get("partial") or {}
    for shape, r in (fb.get("shapes") or {}).items():
        if "error" in r:
            lines.append(f"  fused bench {shape}: ERROR {r['error'][:150]}")
        lines.append(f"  fused bench {shape}: stages per layer {r.get('stages_per_layer')}")
        b = r.get("bench") or {}
        fd = b.get("floor_ms_datasheet")
        for c in b.get("contenders", []):
            ms = c.get("ms_per_token")
            lines.append(f"    fused-bench {shape:14s} {c['name']:50s} "
                         + (f"{ms:8.3f} ms/token" if ms else f"error {str(c.get('error', ''))[:60]}")
                         + (f"  ({fd / ms * 100:5.1f}% of floor {fd:.3f})" if ms and fd else ""))
        for cand in b.get("candidates", []):
            if cand.get("gate") or cand.get("error"):
                lines.append(f"    fused-bench {shape} candidate {cand['name']}: {cand.get('gate') or cand.get('error')}"[:220])
    h = (st.get("handoff") or {}).get("result")
    if h:
        lines.append(f"  hand-off: same SM {h['same_sm']['us_per_task_sync_only']} us/task, SM0<->SM1 "
                     f"{h['sm0_sm1']['us_per_task_sync_only']} us, SM0<->SM131 {h['sm0_sm131']['us_per_task_sync_only']} us")
    w = (st.get("watchdog") or {}).get("result")
    if w:
        lines.append(f"  watchdog: refused={w.get('refused_without_unsafe')} tripped={w.get('tripped')} "
                     f"next launch ok={w.get('next_launch_ok')} torch ok={w.get('torch_after_ok')}")
    sy = (st.get("sync") or {}).get("result") or (st.get("sync") or {}).get("partial") or {}
    if sy:
        lines += sync_summary(sy)
    if REPORT["skipped"]:
        lines.append(f"  skipped by the time guard: {[s['stage'] for s in REPORT['skipped']]}")
    lines.append(f"  elapsed {time.time() - T0:.0f} s; JSON: {Path(ARGS.out) / 'issue8.json'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    global ARGS
    ARGS = parse_args(argv)
    if ARGS.child:  # a fused stage in its own process: save its JSON, exit
        {"fused-micro": child_fused_micro, "fused-bench": child_fused_bench, "sync": child_sync}[ARGS.child]()
        return 0
    REPORT["args"] = vars(ARGS)
    st_environment()
    st_build()
    if not ARGS.quick or ARGS.dry_run:
        st_lower()
    if ARGS.dry_run:
        save()
        print(summary())
        return 0 if all(e.get("ok") for e in REPORT["stages"].values()) else 1
    if ARGS.sync:  # the synchronisation variants only (one child process)
        st_sync()
        save()
        print(summary(), flush=True)
        return 0
    st_micro()
    st_watchdog()
    if ARGS.quick:  # the bench shapes (Llama first: the goal that matters most), parity on SmolLM2-135M; the
        # fused stages last and in child processes (a fused op that faults cannot lose the unfused results)
        model_stage("llama-3.2-1b", do_bench=True, do_parity=False)()
        model_stage("smollm2-135m", do_bench=True)()
        st_fused_micro()
        st_fused_bench()
        st_sync()
        save()
        print(summary(), flush=True)
        return 0
    st_handoff()
    for shape in ARGS.shapes:
        model_stage(shape, do_bench=shape in ARGS.bench_shapes, planted=shape == "smollm2-135m")()
    for shape in ARGS.bench_shapes:
        if shape not in ARGS.shapes:
            model_stage(shape, do_bench=True, do_parity=False)()
    st_fused_micro()
    st_fused_bench()
    st_sync()
    st_cli()
    save()
    print(summary(), flush=True)
    return 0


ARGS = None  # set in main()

if __name__ == "__main__":
    sys.exit(main())
