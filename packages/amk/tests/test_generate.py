"""Token-exact parity of the ReferenceVM's greedy decode against transformers' own eager greedy
``generate`` (float32, CPU), for a tiny random-init checkpoint of every supported family, under two
different ScheduleConfigs, and for a SmolLM2-135M-shaped model (real dimensions, random weights)."""

from __future__ import annotations

import json
import time

import pytest
from mosaic.cli import main
from mosaic_amk import ops
from mosaic_amk.config import FUSIONS, ScheduleConfig
from mosaic_amk.importer import import_checkpoint
from mosaic_amk.parity import compare, hf_greedy
from mosaic_amk.reference_vm import ReferenceVM
from mosaic_amk.tiny_models import SMOLLM2_135M, TINY_FAMILIES, make_checkpoint

PROMPT = [3, 17, 42, 5, 11]
N_TOKENS = 8  # with the 5-token prompt, 13 positions: past Mistral's sliding window of 5

CONFIGS = {
    "default": ScheduleConfig(gemv_rows_per_task=16),
    # no fusion, ragged row split, least-loaded placement on 5 SMs: a different DAG, same semantics
    "unfused": ScheduleConfig(gemv_rows_per_task=7, fusion=(), sm_policy="least_loaded", num_sms=5,
                              attention_kv_heads_per_task=2, kv_page_tokens=4),
    # every switch on, the CPU-only fused ops included (rmsnorm_gemv, gemv_rope_append, split-KV attention
    # with 3 chunks: some empty at the first positions, split argmax over 16-logit parts)
    "fused": ScheduleConfig(gemv_rows_per_task=16, fusion=FUSIONS, attention_kv_splits=3, argmax_rows_per_task=16,
                            kv_page_tokens=4, num_sms=6),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_token_exact_parity_with_hf_eager(tiny_checkpoint, family, config):
    path = tiny_checkpoint(family)
    spec = import_checkpoint(path)
    tokens, logits = ReferenceVM(spec, CONFIGS[config]).generate(PROMPT, N_TOKENS)
    result = compare(tokens, logits, *hf_greedy(path, PROMPT, N_TOKENS))
    assert result.ok, result
    assert len(result.vm_tokens) == N_TOKENS
    assert result.max_logit_error < 1e-4, result.max_logit_error
    # the logits are not degenerate: a broken VM could not match them by luck
    assert max(float(abs(step).max()) for step in logits) > 0.5


def test_generate_cli_check_hf(tiny_checkpoint, capsys):
    path = tiny_checkpoint("qwen2")
    with pytest.raises(SystemExit) as exc:
        main(["amk", "generate", "--model", str(path), "--prompt-ids", "1,2,3", "--tokens", "5", "--check-hf",
              "--interleave", "pct", "--seed", "7", "--json"])
    assert exc.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["check_hf"]["ok"] and out["tokens"] == out["check_hf"]["hf_tokens"]
    assert len(out["tokens"]) == 5 and out["check_hf"]["max_logit_error"] < 1e-4


def test_generate_cli_reports_a_mismatch_with_exit_1(tiny_checkpoint, capsys, monkeypatch):
    path = tiny_checkpoint("llama")
    real = ops.KERNELS["rope"]

    def wrong_rope(ins, outs, p):  # the queries rotated one position too far (keys, by rope_append, are right)
        real(ins, outs, {**p, "position": p["position"] + 1})

    monkeypatch.setitem(ops.KERNELS, "rope", wrong_rope)
    with pytest.raises(SystemExit) as exc:
        main(["amk", "generate", "--model", str(path), "--prompt-ids", "1,2,3,4,5,6", "--tokens", "8", "--check-hf"])
    captured = capsys.readouterr()
    assert exc.value.code == 1
    assert "MISMATCH" in captured.out and "max logit error" in captured.out
    assert "disagrees with HF" in captured.err


@pytest.mark.parametrize("argv, message", [
    (["--vm", "cuda"], "the CUDA VM needs cupy"),  # no GPU stack here: one line, exit 2
    (["--prompt-ids", "1,x"], "comma-separated token ids"),
    (["--prompt-ids", "1,100000"], "token ids in 0 .."),
])
def test_generate_cli_bad_input(tiny_checkpoint, capsys, argv, message):
    args = ["amk", "generate", "--model", str(tiny_checkpoint("llama")), "--prompt-ids", "1,2", *argv]
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_smollm2_135m_shaped_parity(tmp_path):
    """Real SmolLM2-135M dimensions (30 layers, 576 hidden, 9/3 heads, 49152 vocab), random weights.
    About 5 s on the 2-core dev machine, so not marked slow."""
    t0 = time.perf_counter()
    path = make_checkpoint(tmp_path / "smollm2-135m", config=SMOLLM2_135M)
    spec = import_checkpoint(path)
    assert spec.num_params() == 134_515_008
    prompt, n = [1, 504, 3000, 17], 4
    tokens, logits = ReferenceVM(spec, ScheduleConfig()).generate(prompt, n)
    result = compare(tokens, logits, *hf_greedy(path, prompt, n))
    print(f"smollm2-135m-shaped: {result.to_json()} in {time.perf_counter() - t0:.1f} s")
    assert result.ok, result
    assert result.max_logit_error < 1e-3


def test_llama_attention_and_mlp_bias_parity(tmp_path):
    """Llama's attention_bias (q/k/v/o) and mlp_bias (gate/up/down), with nonzero biases."""
    path = make_checkpoint(tmp_path / "llama-bias", "llama", attention_bias=True, mlp_bias=True)
    spec = import_checkpoint(path)
    assert spec.qkv_bias and spec.o_bias and spec.mlp_bias
    for cfg in CONFIGS.values():
        tokens, logits = ReferenceVM(spec, cfg).generate(PROMPT, 6)
        result = compare(tokens, logits, *hf_greedy(path, PROMPT, 6))
        assert result.ok and result.max_logit_error < 1e-4, result
