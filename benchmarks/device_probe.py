"""Probe the GPU machine once: versions, the device (cudaGetDeviceProperties), the CUPTI activity record's fields,
and whether each capture path (CUTLASS headers, CuTe DSL, Pallas MOSAIC_GPU_DUMP_TO) works there.

Run on the device after staging (see ../shared/device/stage-gpu-wheels.sh):
    python3 benchmarks/device_probe.py [--json PATH]   # prints each check and a table; writes $OUT/device_probe.json
Each check is independent; a failure is recorded with its error, never fatal.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from _device import add_json, json_path, write_json

CHECKS: dict = {}


def check(name):
    def wrap(fn):
        CHECKS[name] = fn
        return fn

    return wrap


def run_checks() -> dict:
    report: dict = {}
    for name, fn in CHECKS.items():
        t0 = time.time()
        try:
            report[name] = {"ok": True, "value": fn()}
        except Exception as exc:  # every probe is independent
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                            "trace": traceback.format_exc()[-1500:]}
        report[name]["seconds"] = round(time.time() - t0, 2)
        print(f"[{name}] {json.dumps(report[name], default=str)[:1500]}", flush=True)
    return report


def sh(cmd: str) -> str:
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120).stdout.strip()


@check("system")
def _():
    return {"python": sys.version, "nvidia_smi": sh("nvidia-smi --query-gpu=name,driver_version,memory.total,"
                                                     "clocks.sm,clocks.max.sm --format=csv,noheader"),
            "nvcc": sh("nvcc --version | tail -2"), "nvdisasm": sh("which nvdisasm cuobjdump"),
            "pythonpath": os.environ.get("PYTHONPATH", "")}


@check("packages")
def _():
    import importlib.metadata as md

    names = ["torch", "jax", "jaxlib", "cupy-cuda13x", "cuda-bindings", "cuda-python", "transformers",
             "nvidia-cutlass-dsl", "cupti-python", "nvidia-cutlass", "triton", "attrs", "click", "pluggy",
             "setuptools", "numpy"]
    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = None
    return out


@check("cuda_properties")
def _():
    from cuda.bindings import runtime as rt

    err, p = rt.cudaGetDeviceProperties(0)
    return {"name": p.name.decode().rstrip("\x00") if isinstance(p.name, bytes) else str(p.name),
            "cc": [p.major, p.minor], "sms": p.multiProcessorCount, "l2": p.l2CacheSize,
            "smem_per_sm": p.sharedMemPerMultiprocessor, "smem_optin": p.sharedMemPerBlockOptin,
            "regs_per_sm": p.regsPerMultiprocessor, "total_mem": p.totalGlobalMem,
            "max_threads_per_sm": p.maxThreadsPerMultiProcessor, "coop": p.cooperativeLaunch}


@check("cupti_activity")
def _():
    import torch
    from cupti import cupti

    records = []

    def buffer_requested():
        return 8 * 1024 * 1024, 0

    def buffer_completed(activities):
        for a in activities:
            if a.kind == cupti.ActivityKind.CONCURRENT_KERNEL:
                records.append({k: str(getattr(a, k)) for k in dir(a) if not k.startswith("_")
                                and not callable(getattr(a, k))})

    cupti.activity_register_callbacks(buffer_requested, buffer_completed)
    cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    cupti.activity_flush_all(1)
    cupti.activity_disable(cupti.ActivityKind.CONCURRENT_KERNEL)
    durs = [int(r["end"]) - int(r["start"]) for r in records if "end" in r]
    return {"n": len(records), "durations_ns": durs, "first": records[0] if records else None}


@check("cutlass_headers")
def _():
    inc = Path("/tmp/site/cutlass_library/source/include")
    return {"exists": inc.is_dir(), "has_collective_builder":
            (inc / "cutlass/gemm/collective/collective_builder.hpp").is_file()}


@check("cute_dsl")
def _():
    import cutlass
    import cutlass.cute as cute

    @cute.kernel
    def k(x: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        x[tidx] = x[tidx] + 1.0

    @cute.jit
    def launch(x: cute.Tensor):
        k(x).launch(grid=(1, 1, 1), block=(32, 1, 1))

    import torch
    from cutlass.cute.runtime import from_dlpack

    t = torch.zeros(32, device="cuda")
    launch(from_dlpack(t))
    torch.cuda.synchronize()
    return {"version": getattr(cutlass, "__version__", "?"), "sum": float(t.sum())}


@check("pallas_dump")
def _():
    d = tempfile.mkdtemp()
    code = ("import jax, jax.numpy as jnp\n"
            "from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm\n"
            "a = jnp.ones((256, 256), jnp.bfloat16)\n"
            "cfg = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)\n"
            "print(float(hm.matmul(a, a, config=cfg).astype(jnp.float32).sum()))\n")
    env = {**os.environ, "MOSAIC_GPU_DUMP_TO": d, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    return {"rc": p.returncode, "stdout": p.stdout[-300:], "stderr": p.stderr[-1500:],
            "dumped": sorted(os.listdir(d))[:20]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json(p, "device_probe")
    a = p.parse_args(argv)
    report = run_checks()
    print(f"\n{'check':18s} {'ok':5s} {'s':>6s}  value / error")
    for name, r in report.items():
        print(f"{name:18s} {str(r['ok']):5s} {r['seconds']:6.2f}  "
              + (json.dumps(r.get("value"), default=str) if r["ok"] else r["error"])[:120])
    print("wrote", write_json(json_path(a), report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
