"""The weight preload (ScheduleConfig.weight_preload -> build define AMK_WEIGHT_PRELOAD; docs/amk-cuda.md "Weight
preload") on the CPU: the config field's values, its build define and cache key, refusal with GEMV body 2, that it
changes no schedule or encoding, that CudaVM builds the preload variant, that every allowed value builds for sm_90a
without spills or stack, with the preload's weight loads placed before the task's signal and wait in the SASS (none
in the default build), the bench's best-measured-preload candidate and benchmarks/amk_speed.py's verdict line. The GPU checks
(bit-identical results, watchdog) are in test_cuda_gemv.py."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import attrs
import numpy as np
import pytest
from mosaic.errors import BadInput
from mosaic.plugins import host
from mosaic.toolchain.tools import find_tool
from mosaic_amk.config import WEIGHT_PRELOADS, WEIGHT_STREAMS, WS_PIECE, ScheduleConfig
from mosaic_amk.cuda import build as B
from mosaic_amk.cuda import encode as E

ROOT = Path(__file__).resolve().parents[3]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.isfile("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc not found (the VM build needs it)")


@pytest.fixture(scope="module")
def cache(private_cache):
    return private_cache


# --------------------------------------------------------------------------------------------- config
def test_config_default_off_and_allowed_values_round_trip():
    assert ScheduleConfig().weight_preload == 0 and WEIGHT_PRELOADS[0] == 0
    for n in WEIGHT_PRELOADS:
        c = ScheduleConfig.from_mapping({"weight_preload": n})
        assert c.weight_preload == n and ScheduleConfig.from_mapping(c.to_json()) == c


@pytest.mark.parametrize("value", [4, 3, 10, 16, -2, True, "8", 8.0])
def test_config_refuses_other_values(value):
    with pytest.raises(BadInput, match="weight_preload") as exc:
        ScheduleConfig.from_mapping({"weight_preload": value})
    assert "0, 2, 6, 8" in str(exc.value) and len(str(exc.value).splitlines()) == 1


# ---------------------------------------------------------------------------------------------- build
def test_build_defines_flags_and_key():
    assert B.preload_defines(0) == () and B.preload_defines(8) == ("AMK_WEIGHT_PRELOAD=8",)
    assert "-DAMK_WEIGHT_PRELOAD=8" in B.flags(512, B.preload_defines(8))
    keys = {B.source_key(512, "release 13.0", B.preload_defines(n)) for n in WEIGHT_PRELOADS}
    assert len(keys) == len(WEIGHT_PRELOADS)  # each value its own cached cubin; 0 is the default build's key
    assert B.source_key(512, "release 13.0", B.preload_defines(0)) == B.source_key(512, "release 13.0")


def test_build_refuses_preload_with_body2_and_malformed_defines():
    with pytest.raises(B.BuildError, match="needs GEMV body 1"):
        B.build(512, defines=("AMK_GEMV_IMPL=2", "AMK_WEIGHT_PRELOAD=8"))
    with pytest.raises(B.BuildError, match="unknown build define"):
        B.build(512, defines=("AMK_WEIGHT_PRELOAD=8 -DX",))


def test_microkernels_refuse_a_preload_outside_the_allowed_range():
    common = (B.SOURCE_DIR / "kernels" / "common.cuh").read_text()
    rows = (B.SOURCE_DIR / "kernels" / "gemv_rows.cuh").read_text()
    assert "#error \"AMK_WEIGHT_PRELOAD must be" in common and "AMK_WEIGHT_PRELOAD needs GEMV body 1" in rows


# ----------------------------------------------------------------------------------- encode / plumbing
def test_preload_changes_no_schedule_or_encoding():
    """A build variant only: the lowered schedule, its structure key and every encoded table are the same."""
    from mosaic_amk.lowering import lower
    from mosaic_amk.tiny_models import tiny_model

    gpu, model = host().get("gpus", "h200"), tiny_model("llama")
    base = ScheduleConfig(gemv_rows_per_task=16, kv_max_tokens=32)
    a = E.encode(lower(model, base, gpu, 0))
    b = E.encode(lower(model, attrs.evolve(base, weight_preload=8), gpu, 0))
    assert a.structure_key == b.structure_key
    for f in ("tasks", "queue", "queue_offsets", "buf_meta", "producers"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


@needs_nvcc
def test_cuda_vm_builds_the_preload_variant(tmp_path, monkeypatch):
    """CudaVM builds the cubin of its config's weight_preload before it needs the device: on a machine without a GPU
    construction stops at the launcher, after the build, and the preload build is in the (fresh) cache."""
    from mosaic_amk.cuda.cuda_vm import CudaVM
    from mosaic_amk.tiny_models import tiny_model

    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(tmp_path))
    version = subprocess.run([B.nvcc_path(), "--version"], capture_output=True, text=True).stdout
    line = next(ln for ln in version.splitlines() if "release" in ln)
    want = B.cache_dir() / B.source_key(512, line, B.preload_defines(8))[:24] / "amk_vm.cubin"
    assert not want.exists()
    try:
        vm = CudaVM(tiny_model("llama"), ScheduleConfig(gemv_rows_per_task=16, weight_preload=8),
                    host().get("gpus", "h200"), max_positions=32)
    except Exception as exc:  # noqa: BLE001 - no device here: DeviceError from the launcher
        if "DeviceError" not in type(exc).__name__:
            raise
    else:  # pragma: no cover - on a machine with a GPU
        assert vm.build_info.cubin == want
    assert want.is_file()


# ------------------------------------------------------------------------------------- ptxas / SASS


def weight_loads_before_first_signal(sass: str) -> int:
    """Weight loads (ld.global.nc.L1::no_allocate.v4: LDG.E.NA.128.CONSTANT) placed before the task loop's first
    release add (REDG.E.ADD, the pending signal at the top of an iteration, which precedes the prefetch, the head
    barrier and the wait); the micro-kernels' own weight loads all come after the wait."""
    n = 0
    for line in sass.splitlines():
        if "REDG.E.ADD" in line:
            return n
        if "LDG.E.NA.128.CONSTANT" in line:
            n += 1
    raise AssertionError("no REDG.E.ADD in the VM's SASS")


@needs_nvcc
@pytest.mark.parametrize("preload", WEIGHT_PRELOADS)
def test_every_allowed_preload_builds_spill_free_with_loads_before_the_wait(preload, cache):
    b = B.build(512, defines=B.preload_defines(preload))
    assert b.spill_stores == 0 and b.spill_loads == 0 and b.stack_bytes == 0, b.ptxas_log
    assert b.registers <= 128
    tool = find_tool("cuobjdump")
    if tool is None:  # pragma: no cover - the venv ships nvidia-cuda-cuobjdump
        pytest.skip("cuobjdump not found")
    sass = subprocess.run([tool, "--dump-sass", str(b.cubin)], capture_output=True, text=True, timeout=120).stdout
    # gemv path: N loads; short-row gemv path: N/2 of each of two rows; gate/up path: N/2 + N/2; default build:
    # none before the wait
    assert weight_loads_before_first_signal(sass) == 3 * preload


# ------------------------------------------------------------------------------------------ weight stream
def test_stream_config_ring_and_defines():
    """weight_stream: its values, exclusive with the preload, its ring on top of smem_bytes (checked against the GPU),
    its build define (own cache key) and the ring a Launcher adds for a build."""
    assert ScheduleConfig().weight_stream == 0 and ScheduleConfig().ring_bytes() == 0
    c = ScheduleConfig(weight_stream=4)
    assert c.ring_bytes() == 16 * 4 * WS_PIECE and B.config_defines(c) == ("AMK_WSTREAM=4",)
    assert B.ring_bytes(512, B.config_defines(c)) == c.ring_bytes() and B.ring_bytes(512, ()) == 0
    assert B.config_defines(ScheduleConfig(weight_preload=8)) == ("AMK_WEIGHT_PRELOAD=8",)
    with pytest.raises(BadInput, match="weight_stream"):
        ScheduleConfig.from_mapping({"weight_stream": 4, "weight_preload": 8})
    with pytest.raises(BadInput, match="0, 2, 4"):
        ScheduleConfig.from_mapping({"weight_stream": 3})
    gpu = host().get("gpus", "h200")
    assert c.check(gpu) == []  # 96 KB + 128 KB fits the H200's 227 KB per block
    assert any("ring" in p for p in ScheduleConfig(weight_stream=4, smem_bytes=128 * 1024).check(gpu))
    keys = {B.source_key(512, "release 13.0", B.config_defines(ScheduleConfig(weight_stream=n))) for n in WEIGHT_STREAMS}
    assert len(keys) == len(WEIGHT_STREAMS)
    with pytest.raises(B.BuildError, match="AMK_WSTREAM"):
        B.build(512, defines=("AMK_WSTREAM=4", "AMK_WEIGHT_PRELOAD=8"))
    with pytest.raises(B.BuildError, match="AMK_WSTREAM"):
        B.build(512, defines=("AMK_WSTREAM=4", "AMK_GEMV_IMPL=2"))


@needs_nvcc
@pytest.mark.parametrize("slots", [n for n in WEIGHT_STREAMS if n])
def test_stream_builds_spill_free_with_bulk_copies_before_the_wait(slots, cache):
    """Each stream build compiles for sm_90a without spills; its SASS has bulk copies (UBLKCP) and mbarrier waits
    (SYNCS.PHASECHK), the first bulk copy before the task loop's first release add (issued before the wait); the
    default build has neither."""
    b = B.build(512, defines=(f"AMK_WSTREAM={slots}",))
    assert b.spill_stores == 0 and b.spill_loads == 0 and b.stack_bytes == 0, b.ptxas_log
    tool = find_tool("cuobjdump")
    if tool is None:  # pragma: no cover - the venv ships nvidia-cuda-cuobjdump
        pytest.skip("cuobjdump not found")

    def sass(cubin):
        return subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True, timeout=120).stdout

    text = sass(b.cubin)
    assert "UBLKCP" in text and "SYNCS.PHASECHK" in text
    assert text.index("UBLKCP") < text.index("REDG.E.ADD")
    default = sass(B.build(512).cubin)
    assert "UBLKCP" not in default and "SYNCS.PHASECHK" not in default


# -------------------------------------------------------------------------------------- bench / script
def test_bench_has_best_measured_preload():
    from mosaic_amk.bench.bench import all_candidates, default_candidates, fused_candidates
    from mosaic_amk.tiny_models import tiny_model

    spec = tiny_model("llama")
    cands = dict(all_candidates(spec))
    assert cands["best-measured-preload"] == attrs.evolve(cands["best-measured"], weight_preload=8)
    assert all(c.weight_preload == (6 if "preload6" in n else 8 if "preload" in n else 0) for n, c in cands.items())
    assert cands["balanced-stream4"] == attrs.evolve(cands["balanced"], weight_stream=4)
    from mosaic_amk.config import CUDA_DEFAULT, VM_FUSIONS

    assert cands["balanced-preload-q1"] == attrs.evolve(
        cands["balanced-preload"], attention_q_heads_per_task=1, gemv_rows_per_task=64)
    assert cands["balanced-preload-q1-stage"] == attrs.evolve(cands["balanced-preload-q1"], attention_stage=True)
    sa = cands["balanced-preload-q1-stage-sa"]
    assert sa == attrs.evolve(cands["balanced-preload-q1-stage"], fusion=(*VM_FUSIONS, "split_argmax"),
                              argmax_rows_per_task=1024)
    assert cands["balanced-preload-q1-stage-sa-apart"] == attrs.evolve(sa, attention_placement="apart")
    assert cands["balanced-preload-q1-stage-sa-auto"] == attrs.evolve(sa, attention_placement="auto")
    assert cands["balanced-preload-q1-stage-sa-auto-blocked"] == CUDA_DEFAULT == attrs.evolve(
        sa, attention_placement="auto", rope_order="blocked")
    assert cands["balanced"] == attrs.evolve(cands["best-measured"], gemv_split="balanced", lm_head_rows_per_task=0)
    assert [n for n, _ in fused_candidates(spec)] == ["fused", "fused-rows16-lm", "fused-rows32-lm"]
    assert [n for n, _ in default_candidates(spec)] == ["default", "rows32-lm", "best-measured", "balanced-preload",
                                                      "balanced-preload-q1", "balanced-preload-q1-stage",
                                                      "balanced-preload-q1-stage-sa-auto",
                                                      "balanced-preload-q1-stage-sa-auto-blocked"]


def _amk_speed():
    spec = importlib.util.spec_from_file_location("amk_speed", ROOT / "benchmarks" / "amk_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_amk_speed_measures_the_preload_twin_and_says_so():
    m = _amk_speed()
    assert {"rows32-lm", "best-measured", "best-measured-preload", "balanced", "balanced-preload"} <= set(m.CANDIDATES)
    res = {"candidates": [{"name": "best-measured"}, {"name": "best-measured-preload"}],
           "contenders": [{"name": "amk[best-measured]", "ms_per_token": 1.30},
                          {"name": "amk[best-measured-preload]", "ms_per_token": 1.04}]}
    line = m.preload_verdict("llama-3.2-1b", res)
    assert "1.300" in line and "1.040" in line and "x0.800" in line
    res["candidates"][1]["gate"] = "tokens differ from HF eager bf16 at generated token 3: not timed"
    res["contenders"] = res["contenders"][:1]
    line = m.preload_verdict("llama-3.2-1b", res)
    assert "no comparison" in line and "tokens differ" in line and "1.300" not in line


def test_gpu_test_schedules_pass_the_gate_and_encode():
    """The schedules test_cuda_gemv's preload tests launch are valid (so a device run fails only on the device)."""
    import sys

    from mosaic_amk.bench.microbench import fused_gemv_case, raise_threshold
    from mosaic_amk.cuda.launcher import gate

    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from test_cuda_gemv import lm_head_chain
    finally:
        sys.path.pop(0)
    s, weights, inputs = lm_head_chain(np.random.default_rng(11))
    assert gate(s).ok
    enc = E.encode(s, runtime_position=False)
    assert {E.OPS[o] for o in enc.tasks[:, E.W_OP]} == {"rmsnorm", "gemv", "argmax"}
    c = fused_gemv_case("rmsnorm_gemv", np.random.default_rng(3), hidden=1024, rows=1000, position=37)
    i = next(i for i, t in enumerate(c["unfused"].tasks) if t.op == "gemv")
    assert c["unfused"].tasks[i].waits and not gate(raise_threshold(c["unfused"], i), unsafe=True).ok
    E.encode(raise_threshold(c["unfused"], i), runtime_position=False)
