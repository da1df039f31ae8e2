"""The importer: every supported family imports with its distinguishing features; everything unsupported
is rejected with the list of reasons; broken checkpoints give one error line (exit 2); pickle is never
loaded; and the Qwen2 q/k/v bias, the Mistral window and the llama3 rope scaling are honoured (dropping
any of them would disagree with HF eager, which these tests show)."""

from __future__ import annotations

import json
import pickle
import shutil

import attrs
import numpy as np
import pytest
from mosaic.cli import main
from mosaic.errors import BadInput
from mosaic_amk.importer import (
    UnsupportedModel,
    import_checkpoint,
    reference_inv_freq,
    unsupported_reasons,
)
from mosaic_amk.model import INV_FREQ
from mosaic_amk.parity import hf_greedy
from mosaic_amk.reference_vm import ReferenceVM
from mosaic_amk.tiny_models import TINY_FAMILIES
from safetensors.torch import load_file, save_file


def test_each_family_imports_with_its_features(tiny_checkpoint):
    specs = {f: import_checkpoint(tiny_checkpoint(f)) for f in TINY_FAMILIES}
    for f, s in specs.items():
        assert not s.check_weights(), f
        assert all(w.dtype == np.float32 for w in s.weights.values())
    assert specs["llama"].head_dim == 24 and specs["llama"].q_dim == 96 != specs["llama"].hidden_size  # override
    assert not specs["llama"].tie_word_embeddings and "lm_head.weight" in specs["llama"].weights
    assert specs["llama3"].tie_word_embeddings and "lm_head.weight" not in specs["llama3"].weights
    assert specs["llama3"].rope_type == "llama3"
    assert (specs["smollm2"].num_heads, specs["smollm2"].num_kv_heads) == (6, 2)
    assert specs["tinyllama"].num_kv_heads == 1
    assert specs["mistral"].family == "mistral" and specs["mistral"].layer_windows == (5, 5)
    q = specs["qwen2"]
    assert q.family == "qwen2" and q.qkv_bias and not q.o_bias and not q.mlp_bias
    assert float(np.abs(q.weights["model.layers.0.self_attn.k_proj.bias"]).max()) > 0.1
    assert not any(s.qkv_bias for f, s in specs.items() if f != "qwen2")


def test_llama3_rope_scaling_is_computed_independently():
    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64)
    scaled = reference_inv_freq(16, rope)
    plain = reference_inv_freq(16, dict(rope_type="default", rope_theta=500000.0))
    assert scaled[0] == plain[0]  # high frequencies untouched
    assert np.isclose(scaled[-1], plain[-1] / 8.0)  # low frequencies divided by factor
    assert np.any((scaled > plain / 8.0) & (scaled < plain))  # and a smoothed band between


def _worse_than_eager(spec, path, prompt, n):
    """Max logit error of the ReferenceVM (running ``spec``) against HF eager on ``path``."""
    tokens, logits = ReferenceVM(spec).generate(prompt, n)
    hf_tokens, hf_logits = hf_greedy(path, prompt, n)
    return max(float(np.abs(a - b).max()) for a, b in zip(logits, hf_logits, strict=True)), tokens == hf_tokens


def test_qwen2_bias_is_honoured_and_dropping_it_disagrees(tiny_checkpoint):
    path = tiny_checkpoint("qwen2")
    spec = import_checkpoint(path)
    err, same = _worse_than_eager(spec, path, [1, 2, 3], 4)
    assert same and err < 1e-4
    # what the paper's importer did: accept the config, drop the bias
    dropped = attrs.evolve(spec, qkv_bias=False,
                           weights={k: v for k, v in spec.weights.items() if not k.endswith("_proj.bias")})
    assert not dropped.check_weights()
    err_dropped, _ = _worse_than_eager(dropped, path, [1, 2, 3], 4)
    assert err_dropped > 100 * max(err, 1e-6), (err, err_dropped)


def test_mistral_window_is_honoured_and_ignoring_it_disagrees(tiny_checkpoint):
    path = tiny_checkpoint("mistral")
    spec = import_checkpoint(path)
    prompt = [4, 8, 15, 16, 23, 42, 7, 9]  # longer than the window of 5
    err, same = _worse_than_eager(spec, path, prompt, 4)
    assert same and err < 1e-4
    err_full, _ = _worse_than_eager(attrs.evolve(spec, layer_windows=(0, 0)), path, prompt, 4)
    assert err_full > 100 * max(err, 1e-6), (err, err_full)


def test_llama3_rope_scaling_matters(tiny_checkpoint):
    path = tiny_checkpoint("llama3")
    spec = import_checkpoint(path)
    plain = reference_inv_freq(spec.head_dim, dict(rope_type="default", rope_theta=500000.0))
    assert not np.allclose(plain, spec.weights[INV_FREQ])
    err, same = _worse_than_eager(spec, path, [1, 2, 3, 4, 5, 6], 3)
    err_plain, _ = _worse_than_eager(attrs.evolve(spec, weights={**spec.weights, INV_FREQ: plain}), path,
                                     [1, 2, 3, 4, 5, 6], 3)
    assert same and err < 1e-4 and err_plain > 100 * max(err, 1e-6)


# ------------------------------------------------------------------------------------------- rejections

def _with_config(tmp_path, src, **changes):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_unsupported_features_are_all_listed(tiny_checkpoint, tmp_path):
    path = _with_config(tmp_path, tiny_checkpoint("llama"), model_type="gemma", hidden_act="gelu_pytorch_tanh",
                        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0},
                        quantization_config={"quant_method": "gptq"})
    with pytest.raises(UnsupportedModel) as exc:
        import_checkpoint(path)
    reasons = exc.value.reasons
    assert len(reasons) == 4
    for word in ("model_type 'gemma'", "hidden_act 'gelu_pytorch_tanh'", "rope_type 'yarn'", "'gptq'"):
        assert any(word in r for r in reasons), (word, reasons)


@pytest.mark.parametrize("changes, word", [
    ({"model_type": "qwen3"}, "model_type 'qwen3'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "rope_type 'dynamic'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"layer_types": ["chunked_attention", "full_attention"]}, "layer_types"),
    ({"pretraining_tp": 2}, "pretraining_tp"),
])
def test_each_unsupported_feature_has_a_reason(changes, word):
    base = {"model_type": "llama", "hidden_act": "silu", "num_attention_heads": 4, "num_key_value_heads": 2}
    assert unsupported_reasons(base) == []
    reasons = unsupported_reasons({**base, **changes})
    assert len(reasons) == 1 and word in reasons[0]


def _rewrite_weights(path, edit):
    f = path / "model.safetensors"
    tensors = edit(load_file(f))
    save_file(tensors, f, metadata={"format": "pt"})


def test_bad_checkpoints_are_one_line_errors(tiny_checkpoint, tmp_path, capsys):
    src = tiny_checkpoint("llama")
    cases = {}
    d = tmp_path / "no_config"
    shutil.copytree(src, d)
    (d / "config.json").unlink()
    cases[d] = "no config.json"
    d = tmp_path / "bad_json"
    shutil.copytree(src, d)
    (d / "config.json").write_text("{not json")
    cases[d] = "not valid JSON"
    d = tmp_path / "truncated"
    shutil.copytree(src, d)
    blob = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    cases[d] = "could not load"
    d = tmp_path / "missing_tensor"
    shutil.copytree(src, d)
    _rewrite_weights(d, lambda t: {k: v for k, v in t.items() if "layers.1.mlp.up_proj" not in k})
    cases[d] = "lacks 1 tensor"
    d = tmp_path / "extra_tensor"
    shutil.copytree(src, d)
    _rewrite_weights(d, lambda t: {**t, "model.layers.0.self_attn.q_norm.weight": t["model.norm.weight"].clone()})
    cases[d] = "does not use"
    d = tmp_path / "wrong_shape"
    shutil.copytree(src, d)
    _rewrite_weights(d, lambda t: {**t, "model.norm.weight": t["model.norm.weight"][:-1].clone()})
    cases[d] = "model.norm.weight"
    cases[tmp_path / "nowhere"] = "not a checkpoint directory"
    for path, word in cases.items():
        with pytest.raises(BadInput) as exc:
            import_checkpoint(path)
        assert word in exc.value.line(), (path.name, exc.value.line())
        with pytest.raises(SystemExit) as code:
            main(["amk", "generate", "--model", str(path), "--prompt-ids", "1"])
        err = capsys.readouterr().err
        assert code.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err


class _Boom:
    def __reduce__(self):  # unpickling this would create the marker file
        import pathlib
        return (pathlib.Path.touch, (pathlib.Path(_Boom.marker),))


def test_pickle_checkpoints_are_never_loaded(tiny_checkpoint, tmp_path):
    d = tmp_path / "pickled"
    shutil.copytree(tiny_checkpoint("llama"), d)
    (d / "model.safetensors").unlink()
    _Boom.marker = str(tmp_path / "executed")
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(BadInput) as exc:
        import_checkpoint(d)
    assert "no *.safetensors" in exc.value.what and "pytorch_model.bin" in exc.value.what
    assert not (tmp_path / "executed").exists()
