"""The CUDA launcher's CPU-side parts: the validator gate (no launch of a rejected schedule without
unsafe), the RoPE table and bf16 conversion the device reads, and the CLI's one-line errors on a machine without
a GPU (the AMK device benchmarks' arguments and CPU lowering run are in test_amk_device_benchmarks.py)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from mosaic.cli import main
from mosaic.errors import CheckFailed
from mosaic.plugins import host
from mosaic_amk import ops
from mosaic_amk.bench.microbench import deadlock, raise_threshold
from mosaic_amk.config import ScheduleConfig
from mosaic_amk.cuda.launcher import bf16_bits, bf16_round, gate, rope_table
from mosaic_amk.lowering import lower
from mosaic_amk.tiny_models import tiny_model

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
    for args in (["amk", "generate", "--model", str(tiny_checkpoint("llama")), "--prompt-ids", "1,2", "--vm", "cuda"],
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


def test_attention_shared_memory_need():
    """The launcher's score-buffer check follows the micro-kernel's layout (q of 8 heads, per-warp slots,
    the p @ v partials, one float per cached token) for the largest head_dim the encoder admits."""
    from mosaic_amk.cuda.launcher import attention_smem_floats

    assert attention_smem_floats(4096, 512) == 8 * 512 + 16 * 8 + 4 * 512 + 4096
    assert attention_smem_floats(4097, 512) - attention_smem_floats(4096, 512) == 1
