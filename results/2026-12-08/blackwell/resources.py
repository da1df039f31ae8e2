"""ptxas resources of every Blackwell (sm_100a) configuration issue 37 lowers on the CPU, and the refused ones
with their rules. The configurations are the tests' own lists (imported from the test files, not copied).

    .venv312/bin/python results/2026-12-08/blackwell/resources.py cute      # CuTe DSL tcgen05 GEMM
    .venv/bin/python    results/2026-12-08/blackwell/resources.py cutlass   # CUTLASS Sm100 CollectiveBuilder GEMM
    .venv/bin/python    results/2026-12-08/blackwell/resources.py amk       # the AMK VM per arch
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _tests(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ptxas(log: str) -> str:
    regs = re.search(r"Used (\d+) registers", log)
    bars = re.search(r"used (\d+) barriers", log)
    sp = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (f"{regs.group(1) if regs else '?'} | {bars.group(1) if bars else 0} | "
            f"{'/'.join(sp.groups()) if sp else '?'}")


def cute() -> None:
    from mosaic_gpu_blackwell.targets import B200
    from mosaic_target_cute import blackwell_budget
    from mosaic_target_cute.lowering import compile_gemm, ptxas_log

    t = _tests("packages/target-cute/tests/test_blackwell_gemm.py")
    m, n, k = t.MNK
    print(f"CuTe DSL Blackwell GEMM, bf16 {m}x{n}x{k}, sm_100a (B200 record)\n")
    print("| configuration | ptxas registers | barriers | stack/spill st/spill ld B | cubin registers | smem static + dynamic B |")
    print("|---|---|---|---|---|---|")
    root = Path(tempfile.mkdtemp(prefix="bw-cute-"))
    for name, knobs in t.CONFIGS.items():
        _, b = compile_gemm(knobs, m, n, k, "bf16", B200.arch, B200.sm_count, root / name)
        log = ptxas_log(b.ptx, B200.arch, root / f"{name}.log").read_text()
        print(f"| {name} | {_ptxas(log)} | {b.registers} | {b.static_smem} + {b.dynamic_smem} |")
    print("\nrefused before compiling (blackwell_budget.RULES on the B200 record):\n")
    for name, (knobs, _) in t.REFUSED.items():
        print(f"- {name}: " + "; ".join(d.line() for d in blackwell_budget.refusals(knobs, B200)))


def cutlass() -> None:
    from mosaic.plugins import PluginHost
    from mosaic_target_cutlass import blackwell
    from mosaic_target_cutlass.backend import CutlassBackend

    t = _tests("packages/target-cutlass/tests/test_blackwell_gemm.py")
    b200 = PluginHost(allow="blackwell,hopper").load().get("gpus", "b200")
    print("CUTLASS 4.2 Sm100 CollectiveBuilder GEMM, bf16 4096x4096x4096, nvcc 13.0 for sm_100a\n")
    print("| knobs | ptxas registers | barriers | stack/spill st/spill ld B | smem (the build's) |")
    print("|---|---|---|---|---|")
    root = Path(tempfile.mkdtemp(prefix="bw-cutlass-"))
    for i, knobs in enumerate(t.BUILDABLE):
        low = CutlassBackend().lower(t._spec(knobs), b200, root / str(i))
        notes = ", ".join(x for x in low.notes if x.startswith(("smem_bytes", "stages")))
        print(f"| {knobs} | {_ptxas(low.ptxas_log.read_text())} | {notes} |")
    print("\nrefused by rule (blackwell.RULES):\n")
    for knobs, _ in t.REFUSED:
        found = blackwell.problems(blackwell.BlackwellGemmKnobs(**knobs), t._spec(knobs), b200)
        print(f"- {knobs}: " + "; ".join(d.line() for d in found))


def amk() -> None:
    from mosaic_amk.cuda import build as B
    from mosaic_gpu_blackwell.targets import B200

    print("AMK VM (vm.cu, 512 threads), nvcc 13.0\n")
    print("| arch | registers | static smem B | spill stores / loads B | stack B |")
    print("|---|---|---|---|---|")
    for b in (B.build(512, arch="sm_80"), B.build(512), B.build(512, gpu=B200)):
        print(f"| {b.arch} | {b.registers} | {b.smem_bytes} | {b.spill_stores} / {b.spill_loads} | {b.stack_bytes} |")
    try:
        B.build(512, arch="sm_80", defines=("AMK_WSTREAM=2",))
    except B.BuildError as exc:
        print(f"\nrefused: {exc}")


if __name__ == "__main__":
    {"cute": cute, "cutlass": cutlass, "amk": amk}[sys.argv[1]]()
