"""The watchdog and the launch gate at full scale on the GPU (marked ``gpu``; skipped without cupy and a CUDA device),
the checks the first AMK device runs made (results/2026-11-30/amk-device-run.json.xz, stages ``watchdog``,
``model:smollm2-135m`` ``planted_deadlock_in_model`` and ``cli_generate_check_hf``): the planted two-task deadlock on
all 132 SMs is rejected by the validator, refused by the launcher without ``unsafe``, forced it trips the watchdog
with its dump, the abort is sticky, and a valid launch and a torch matmul run right after; one attention wait of a
real SmolLM2-135M-shaped schedule made unsatisfiable is rejected and trips the watchdog at its origin task, and the
valid VM generates repeatable tokens after it; `mosaic amk generate --vm cuda --check-hf` matches HF end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _launcher(schedule, unsafe=False, timeout_s=1.0):
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.launcher import Launcher, gate

    gate(schedule, unsafe)
    return Launcher(E.encode(schedule, runtime_position=False), str(build(512).cubin), threads=512, mode="f32",
                    timeout_s=timeout_s, prefetch_depth=1)


def test_planted_deadlock_refused_tripped_sticky_and_recovered(cuda_device):
    import cupy as cp
    import torch
    from mosaic.errors import CheckFailed
    from mosaic_amk.bench.microbench import deadlock, handoff_chain
    from mosaic_amk.cuda.launcher import WatchdogAbort
    from mosaic_amk.validate import validate

    s = deadlock(132)
    assert [d.code for d in validate(s).diagnostics] == ["cycle"]
    with pytest.raises(CheckFailed, match="the validator rejects this schedule"):
        _launcher(s)
    lz = _launcher(s, unsafe=True, timeout_s=0.25)
    lz.bind({}, {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    t = time.time()
    lz.launch()
    with pytest.raises(WatchdogAbort) as exc:
        lz.check()
    assert time.time() - t < 5.0
    states = {d["state"] for d in exc.value.dump}
    assert "timeout" in states and states <= {"timeout", "peer-abort", "done"}
    lz.launch()  # a launch on the aborted launcher does nothing until re-armed (sticky flag)
    with pytest.raises(WatchdogAbort):
        lz.check()
    ok = _launcher(handoff_chain(64, [0, 1], 132))
    ok.bind({}, {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)})
    ok.launch()
    ok.check()
    assert float(cp.asnumpy(ok.dev["y63"])[0]) == 65.0
    a = torch.randn(256, 256, device="cuda")
    assert torch.allclose(a @ torch.eye(256, device="cuda"), a)


def test_planted_deadlock_in_a_model_schedule(cuda_device):
    from mosaic.plugins import host
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.bench.microbench import raise_threshold
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch
    from mosaic_amk.cuda.launcher import Launcher, WatchdogAbort
    from mosaic_amk.lowering import lower
    from mosaic_amk.validate import validate

    model = hf_gpu.random_model("smollm2-135m", seed=0)
    spec = hf_gpu.spec_of(model)
    weights = weights_from_torch(model, spec)
    vm = CudaVM(spec, ScheduleConfig(), host().get("gpus", "h200"), weights=weights, max_positions=64)
    s0 = lower(spec, vm.config, vm.gpu, 0)
    idx = next(i for i, t in enumerate(s0.tasks) if t.op == "attention" and t.params.get("row_start") == 0
               and "l10." in t.outputs[0])
    bad = raise_threshold(s0, idx)
    assert "unsatisfiable-wait" in {d.code for d in validate(bad).diagnostics}
    lz = Launcher(E.encode(bad), str(vm.build_info.cubin), threads=512, smem_bytes=vm.config.smem_bytes,
                  timeout_s=0.25)
    lz.bind(weights)
    lz.launch(position=0)
    with pytest.raises(WatchdogAbort) as exc:
        lz.check()
    origin = [d for d in exc.value.dump if d["state"] == "timeout"]
    assert origin and origin[0]["task"] == s0.tasks[idx].id
    del lz
    toks, _ = vm.generate([1, 2, 3, 4], 8, logits=False)
    again, _ = vm.generate([1, 2, 3, 4], 8, logits=False)
    assert len(toks) == 8 and toks == again


@pytest.mark.parametrize("family", ["llama", "smollm2"])
def test_cli_generate_check_hf_matches(family, tiny_checkpoint, cuda_device):
    cmd = [sys.executable, "-c", "import sys; from mosaic.cli import main; sys.exit(main())", "amk", "generate",
           "--model", str(tiny_checkpoint(family)), "--prompt-ids", "1,2,3,4,5", "--tokens", "24", "--vm", "cuda",
           "--check-hf", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["vm"] == "cuda" and out["check_hf"]["ok"] and len(out["tokens"]) == 24
