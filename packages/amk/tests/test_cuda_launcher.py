"""The CUDA launcher's CPU-side parts: the validator gate (no launch of a rejected schedule without
unsafe), the RoPE table and bf16 conversion the device reads, the device script's argument parsing and
its CPU dry run, and the CLI's one-line errors on a machine without a GPU."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from mosaic.cli import main
from mosaic.errors import CheckFailed
from mosaic.plugins import host
from mosaic_amk import ops
from mosaic_amk.config import ScheduleConfig
from mosaic_amk.cuda.launcher import bf16_bits, bf16_round, gate, rope_table
from mosaic_amk.cuda.microbench import deadlock, raise_threshold
from mosaic_amk.lowering import lower
from mosaic_amk.tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[3]
HAS_CUPY = importlib.util.find_spec("cupy") is not None


def test_gate_refuses_rejected_schedules_unless_unsafe():
    with pytest.raises(CheckFailed) as exc:
        gate(deadlock(132))
    assert "does not launch" in str(exc.value) and "cycle" in str(exc.value)
    assert exc.value.exit_code == 1
    assert not gate(deadlock(132), unsafe=True).ok  # forced: the caller gets the verdict anyway
    s = lower(tiny_model("llama"), ScheduleConfig(kv_max_tokens=32), host().get("gpus", "h200"), 0)
    assert gate(s).ok
    i = next(i for i, t in enumerate(s.tasks) if t.op == "attention")
    with pytest.raises(CheckFailed) as exc:
        gate(raise_threshold(s, i))
    assert "unsatisfiable-wait" in str(exc.value)


def test_rope_table_is_ops_rope_tables():
    inv = np.array([1.0, 0.1, 0.01, 1e-4], np.float32)
    tab = rope_table(inv, 8, 0.75, 40)
    for p in (0, 1, 39):
        cos, sin = ops.rope_tables(inv, p, 0.75)
        assert np.array_equal(tab[p, :8], cos) and np.array_equal(tab[p, 8:], sin)


def test_bf16_rounding():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, np.inf, np.nan, 3.3e38], np.float32)
    bits = bf16_bits(x)
    assert bits[:5].tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80]  # ties to even
    assert bits[5] == 0x7FC0 and bits[6] == 0x7F78
    import torch  # the device stores what torch's bf16 conversion gives, bit for bit

    r = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 1000
    assert np.array_equal(bf16_bits(r), torch.from_numpy(r).bfloat16().view(torch.int16).numpy().view(np.uint16))
    r = bf16_round(x)
    assert r[1] == 1.0 and r[2] == np.float32(1 + 2 ** -6) and np.isnan(r[5])


@pytest.mark.skipif(HAS_CUPY, reason="checks the no-GPU error path; cupy is installed here")
def test_cli_without_gpu_is_one_line(tiny_checkpoint, capsys):
    for args in (["amk", "generate", "--model", str(tiny_checkpoint("llama")), "--prompt", "1,2", "--vm", "cuda"],
                 ["amk", "bench", "--shape", "smollm2-135m"]):
        with pytest.raises(SystemExit) as exc:
            main(args)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "needs cupy" in err and len(err.strip().splitlines()) == 1


def test_bench_cli_bad_input(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["amk", "bench"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "exactly one of --model" in err and len(err.strip().splitlines()) == 1


def _script():
    spec = importlib.util.spec_from_file_location("issue8_script", ROOT / "scripts" / "device" / "issue8.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_device_script_arguments():
    mod = _script()
    a = mod.parse_args(["--tokens", "64", "--shapes", "smollm2-135m,llama-3.2-1b", "--bench-shapes", ""])
    assert a.tokens == 64 and a.shapes == ["smollm2-135m", "llama-3.2-1b"] and a.bench_shapes == []
    for bad in (["--shapes", "gpt2"], ["--tokens", "0"]):
        with pytest.raises(SystemExit):
            mod.parse_args(bad)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the dry run builds the VM with nvcc")
def test_device_script_dry_run(tmp_path):
    """The script's CPU parts: build, and every shape lowered, validated at two positions, same
    structure, encoded, with its weight-bandwidth floor."""
    import json

    mod = _script()
    assert mod.main(["--dry-run", "--out", str(tmp_path), "--tokens", "8", "--prompt-len", "4"]) == 0
    rep = json.loads((tmp_path / "issue8.json").read_text())
    low = rep["stages"]["lower_validate_encode"]["result"]
    assert set(low) == {"smollm2-135m", "llama-3.2-1b", "smollm2-360m", "tinyllama-1.1b"}
    for shape, r in low.items():
        assert r["valid"] == [True, True] and r["same_structure"], shape
    # Llama-3.2-1B: 1.236e9 bf16 parameters (tied embedding read once by the LM head) + one embedding row
    assert abs(low["llama-3.2-1b"]["floor_bytes"] - 2 * 1_235_814_400 - 2 * 2048) <= 2 * 2048
    assert rep["stages"]["build"]["result"]["spill_stores"] == 0


def test_device_script_quick_arguments():
    """--quick: the <= 4-minute plan (SmolLM2-135M parity 2 x 32, both bench shapes, 3 rounds, a 200 s guard
    for starting stages; the last, the fused bench child, is killed at the guard + 20 s); the fused stages'
    child processes take the same shapes and rounds."""
    m = _script()
    a = m.parse_args(["--quick"])
    assert (a.quick, a.prompts, a.tokens, a.rounds) == (True, 2, 32, 3)
    assert a.shapes == ["smollm2-135m"] and a.bench_shapes == ["llama-3.2-1b", "smollm2-135m"]
    assert a.budget <= 200 and a.child is None
    c = m.parse_args(["--child", "fused-bench", "--rounds", "3", "--bench-shapes", "llama-3.2-1b,smollm2-135m"])
    assert c.child == "fused-bench" and c.bench_shapes == a.bench_shapes and not c.quick


def test_attention_shared_memory_need():
    """The launcher's score-buffer check follows the micro-kernel's layout (q of 8 heads, per-warp slots,
    the p @ v partials, one float per cached token) for the largest head_dim the encoder admits."""
    from mosaic_amk.cuda.launcher import attention_smem_floats

    assert attention_smem_floats(4096, 512) == 8 * 512 + 16 * 8 + 4 * 512 + 4096
    assert attention_smem_floats(4097, 512) - attention_smem_floats(4096, 512) == 1
