"""The CPU-checkable parts of the AMK device benchmarks: benchmarks/amk_sync_variants.py (its plan and its variant
table, one row per config/variant with full, skeleton and no-prefetch ms/token, a gate failure instead of a time),
benchmarks/amk_lowering.py (arguments; every shape lowered, validated at two positions, same structure, encoded, with
its weight-bandwidth floor; needs nvcc), benchmarks/amk_microkernels.py (its quick and A/B sets name real cases) and
the quick parity plan of benchmarks/amk_parity.py."""

from __future__ import annotations

import importlib
import json
import shutil

import pytest

# benchmarks/ is on pytest's pythonpath
SYNC = importlib.import_module("amk_sync_variants")
LOWERING = importlib.import_module("amk_lowering")


def test_sync_variants_plan_and_summary():
    """The variant run's plan (both bench shapes, 3 rounds, the 200 s guard); its summary prints one row per
    config/variant with full, skeleton and no-prefetch ms/token, and a gate failure instead of a time."""
    from mosaic_amk.bench.bench import SYNC_VARIANTS

    m = SYNC
    a = m.parse_args([])
    assert a.rounds == 3 and a.budget <= 200
    assert a.bench_shapes == ["llama-3.2-1b", "smollm2-135m"]
    assert m.parse_args(["--bench-shapes", ""]).bench_shapes == []
    for bad in (["--bench-shapes", "gpt2"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            m.parse_args(bad)
    res = {"variants": SYNC_VARIANTS,
           "handoff": {"sm0_sm1": {"v0": {"us_per_task_sync_only": 0.74, "us_per_task_with_add": 1.45}}},
           "watchdog": {"v0": {"tripped": True, "next_launch_ok": True}, "side": {"tripped": False}},
           "bench": {"llama-3.2-1b": {"bench": {
               "candidates": [{"name": "rows32-lm/v0"}, {"name": "rows32-lm/side", "gate": "tokens differ"}],
               "contenders": [{"name": "amk[rows32-lm/v0]", "ms_per_token": 1.505},
                              {"name": "amk probe[rows32-lm/v0]: skip all ops (sync skeleton)", "ms_per_token": 0.348},
                              {"name": "amk probe[rows32-lm/v0]: no prefetch", "ms_per_token": 1.263}]}}}}
    text = "\n".join(m.sync_summary(res))
    row = next(ln for ln in text.splitlines() if "rows32-lm/v0" in ln)
    assert "1.505" in row and "0.348" in row and "1.263" in row
    bad = next(ln for ln in text.splitlines() if "rows32-lm/side" in ln)
    assert "tokens differ" in bad and "1.505" not in bad
    assert "0.74" in text and "sync watchdog side" in text and "sync watchdog v0" not in text


def test_lowering_arguments():
    a = LOWERING.parse_args(["--tokens", "64", "--shapes", "smollm2-135m,llama-3.2-1b"])
    assert a.tokens == 64 and a.shapes == ["smollm2-135m", "llama-3.2-1b"]
    for bad in (["--shapes", "gpt2"], ["--tokens", "0"]):
        with pytest.raises(SystemExit):
            LOWERING.parse_args(bad)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the lowering benchmark builds the VM with nvcc")
def test_lowering_every_shape(tmp_path):
    """Build, and every shape lowered, validated at two positions, same structure, encoded, with its
    weight-bandwidth floor."""
    assert LOWERING.main(["--json", str(tmp_path / "lowering.json"), "--tokens", "8", "--prompt-len", "4"]) == 0
    rep = json.loads((tmp_path / "lowering.json").read_text())
    low = rep["shapes"]
    assert set(low) == {"smollm2-135m", "llama-3.2-1b", "smollm2-360m", "tinyllama-1.1b"}
    for shape, r in low.items():
        assert r["valid"] == [True, True] and r["same_structure"], shape
    # Llama-3.2-1B: 1.236e9 bf16 parameters (tied embedding read once by the LM head) + one embedding row
    assert abs(low["llama-3.2-1b"]["floor_bytes"] - 2 * 1_235_814_400 - 2 * 2048) <= 2 * 2048
    assert rep["build"]["spill_stores"] == 0


def test_quick_plans():
    """The <= 4-minute checks: SmolLM2-135M parity 2 x 32 (amk_parity), the micro-kernels' quick and GEMV A/B sets
    (each a real case, the A/B ones timed against their floor), the sync variants on both bench shapes (above)."""
    mk = importlib.import_module("amk_microkernels")
    parity = importlib.import_module("amk_parity")
    a = parity.parse_args(["--shapes", "smollm2-135m", "--prompts", "2", "--tokens", "32"])
    assert (a.shapes, a.prompts, a.tokens) == (["smollm2-135m"], 2, 32)
    assert set(mk.QUICK) <= set(mk.CASES) and set(mk.GEMV_AB_NAMES) <= set(mk.QUICK)
    assert set(mk.FUSED_SIZES) == set(importlib.import_module("mosaic_amk.bench.microbench").FUSED_GEMV_CASES)
