"""The named ScheduleConfig candidates as TOML data (mosaic_amk/configs/*.toml): each loads to exactly the config
that the code built before (attrs.evolve chains in config.py and bench/bench.py). The expected values below were
written from the old code's output, field by field: ScheduleConfig()'s every field, then each candidate's fields
that differ from it, for three vocabulary sizes (the LM-head split is resolved per model)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mosaic.errors import BadInput
from mosaic_amk import config as C
from mosaic_amk.bench.bench import all_candidates, default_candidates, fused_candidates
from mosaic_amk.config import CUDA_DEFAULT, ScheduleConfig, load_candidates, load_config, named_config

VMF = ["residual", "gate_up_silu", "rope_append", "rmsnorm_gemv", "gemv_rope_append"]  # config.VM_FUSIONS

DEFAULTS = {"gemv_rows_per_task": 64,
            "lm_head_rows_per_task": 0,
            "gemv_split": "rows",
            "attention_kv_heads_per_task": 1,
            "attention_q_heads_per_task": 0,
            "fusion": ["residual", "gate_up_silu", "rope_append"],
            "attention_kv_splits": 4,
            "argmax_rows_per_task": 4096,
            "sm_policy": "round_robin",
            "attention_placement": "round_robin",
            "num_sms": 0,
            "prefetch_depth": 2,
            "prefetch_tile_bytes": 16384,
            "prefetch_max_bytes": 0,
            "threads_per_block": 512,
            "smem_bytes": 98304,
            "kv_page_tokens": 16,
            "kv_max_tokens": 0,
            "wait_mode": "acquire",
            "signal_mode": "inline",
            "prefetch_mode": "inline",
            "weight_preload": 0,
            "weight_stream": 0,
            "gemv_pingpong": False,
            "attention_stage": False,
            "rope_order": "standard"}
CUDA_DEFAULT_FIELDS = {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF + ["split_argmax"], "argmax_rows_per_task": 1024, "attention_placement": "auto", "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8, "attention_stage": True, "rope_order": "blocked"}

# vocab_size 49152 (SmolLM2); the LM-head rows for 128256 (Llama 3) and 256 (a tiny model) below
CANDIDATES = [
    ("default", {}),
    ("rows16-lm", {"gemv_rows_per_task": 16, "lm_head_rows_per_task": 384}),
    ("rows32-lm", {"gemv_rows_per_task": 32, "lm_head_rows_per_task": 384, "prefetch_depth": 1}),
    ("best-measured", {"gemv_rows_per_task": 32, "lm_head_rows_per_task": 384, "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed"}),
    ("best-measured-preload", {"gemv_rows_per_task": 32, "lm_head_rows_per_task": 384, "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8}),
    ("balanced", {"gemv_rows_per_task": 32, "gemv_split": "balanced", "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed"}),
    ("balanced-preload", {"gemv_rows_per_task": 32, "gemv_split": "balanced", "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8}),
    ("balanced-rope-stage-preload", {"gemv_rows_per_task": 32, "gemv_split": "balanced", "fusion": ["residual", "gate_up_silu", "rope_append", "rmsnorm_gemv"], "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8}),
    ("balanced-66sm-preload", {"gemv_rows_per_task": 32, "gemv_split": "balanced", "fusion": VMF, "num_sms": 66, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8}),
    ("balanced-stream2", {"gemv_rows_per_task": 32, "gemv_split": "balanced", "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_stream": 2}),
    ("balanced-stream4", {"gemv_rows_per_task": 32, "gemv_split": "balanced", "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_stream": 4}),
    ("balanced-preload-pf1-128k", {"gemv_rows_per_task": 32, "gemv_split": "balanced", "fusion": VMF, "prefetch_depth": 1, "prefetch_max_bytes": 131072, "wait_mode": "relaxed", "weight_preload": 8}),
    ("balanced-preload-pf1-256k", {"gemv_rows_per_task": 32, "gemv_split": "balanced", "fusion": VMF, "prefetch_depth": 1, "prefetch_max_bytes": 262144, "wait_mode": "relaxed", "weight_preload": 8}),
    ("balanced-preload-pf2-128k", {"gemv_rows_per_task": 32, "gemv_split": "balanced", "fusion": VMF, "prefetch_max_bytes": 131072, "wait_mode": "relaxed", "weight_preload": 8}),
    ("balanced-preload-q1", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8}),
    ("balanced-preload6-q1", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 6}),
    ("balanced-preload6-q1-pp", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 6, "gemv_pingpong": True}),
    ("balanced-preload-q1-pp", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8, "gemv_pingpong": True}),
    ("balanced-preload-q1-stage", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8, "attention_stage": True}),
    ("balanced-preload6-q1-stage", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 6, "attention_stage": True}),
    ("balanced-q1-stage", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF, "prefetch_depth": 0, "wait_mode": "relaxed", "attention_stage": True}),
    ("balanced-preload-q1-stage-sa", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF + ["split_argmax"], "argmax_rows_per_task": 1024, "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8, "attention_stage": True}),
    ("balanced-preload-q1-stage-apart", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF, "attention_placement": "apart", "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8, "attention_stage": True}),
    ("balanced-preload-q1-stage-sa-apart", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF + ["split_argmax"], "argmax_rows_per_task": 1024, "attention_placement": "apart", "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8, "attention_stage": True}),
    ("balanced-preload-q1-stage-sa-auto", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF + ["split_argmax"], "argmax_rows_per_task": 1024, "attention_placement": "auto", "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8, "attention_stage": True}),
    ("balanced-preload-q1-stage-sa-auto-blocked", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF + ["split_argmax"], "argmax_rows_per_task": 1024, "attention_placement": "auto", "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8, "attention_stage": True, "rope_order": "blocked"}),
    ("balanced-preload-q1-stage-sa-auto-blocked-smem160k", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF + ["split_argmax"], "argmax_rows_per_task": 1024, "attention_placement": "auto", "prefetch_depth": 0, "smem_bytes": 163840, "wait_mode": "relaxed", "weight_preload": 8, "attention_stage": True, "rope_order": "blocked"}),
    ("balanced-preload-q1-stage-sa-apartqkv-blocked", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF + ["split_argmax"], "argmax_rows_per_task": 1024, "attention_placement": "apart_qkv", "prefetch_depth": 0, "wait_mode": "relaxed", "weight_preload": 8, "attention_stage": True, "rope_order": "blocked"}),
    ("balanced-preload-q1-stage-sa-auto-blocked-merged", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF + ["split_argmax"], "argmax_rows_per_task": 1024, "attention_placement": "auto", "prefetch_depth": 0, "wait_mode": "relaxed", "signal_mode": "merged", "weight_preload": 8, "attention_stage": True, "rope_order": "blocked"}),
    ("balanced-preload-q1-stage-sa-auto-blocked-side", {"gemv_split": "balanced", "attention_q_heads_per_task": 1, "fusion": VMF + ["split_argmax"], "argmax_rows_per_task": 1024, "attention_placement": "auto", "prefetch_depth": 0, "wait_mode": "relaxed", "signal_mode": "side", "weight_preload": 8, "attention_stage": True, "rope_order": "blocked"}),
]
FUSED = [
    ("fused", {"fusion": VMF}),
    ("fused-rows16-lm", {"gemv_rows_per_task": 16, "lm_head_rows_per_task": 384, "fusion": VMF}),
    ("fused-rows32-lm", {"gemv_rows_per_task": 32, "lm_head_rows_per_task": 384, "fusion": VMF, "prefetch_depth": 1}),
]
AUDIT = [  # validate/audit.py real_lowerings' configs, from the old ScheduleConfig(...) list
    ("default", {}),
    ("rr4-r8-nofuse", {"gemv_rows_per_task": 8, "fusion": [], "num_sms": 4}),
    ("ll3-r16", {"gemv_rows_per_task": 16, "sm_policy": "least_loaded", "num_sms": 3}),
    ("rr2-r32-residual", {"gemv_rows_per_task": 32, "fusion": ["residual"], "num_sms": 2}),
    ("single", {"gemv_rows_per_task": 16, "sm_policy": "single"}),
    ("rr8-r8-kvh2", {"gemv_rows_per_task": 8, "attention_kv_heads_per_task": 2, "fusion": ["gate_up_silu"], "num_sms": 8}),
    ("fused-all", {"gemv_rows_per_task": 16, "fusion": ["residual", "gate_up_silu", "rope_append", "rmsnorm_gemv", "gemv_rope_append", "split_kv", "split_argmax"], "attention_kv_splits": 3, "argmax_rows_per_task": 16, "num_sms": 6, "kv_page_tokens": 4}),
    ("fused-ll4", {"gemv_rows_per_task": 8, "attention_kv_heads_per_task": 2, "fusion": ["rmsnorm_gemv", "gemv_rope_append", "split_kv", "split_argmax"], "attention_kv_splits": 2, "argmax_rows_per_task": 40, "sm_policy": "least_loaded", "num_sms": 4}),
    # the page protocol (issue #36): to_json carries pages and page_bytes once they differ from the defaults
    ("pages-rr4", {"gemv_rows_per_task": 8, "num_sms": 4, "pages": 2, "page_bytes": 1024}),
    ("pages-fused-ll5", {"gemv_rows_per_task": 16, "fusion": ["residual", "gate_up_silu", "rope_append", "rmsnorm_gemv", "gemv_rope_append", "split_kv", "split_argmax"], "attention_kv_splits": 2, "argmax_rows_per_task": 32, "sm_policy": "least_loaded", "num_sms": 5, "kv_page_tokens": 4, "pages": 3, "page_bytes": 2048}),
]
LM_ROWS = {49152: 384, 128256: 1024, 256: 64}  # lm_head_rows_per_task where a candidate splits it


def _expected(delta: dict, vocab: int) -> dict:
    want = {**DEFAULTS, **delta}
    if "lm_head_rows_per_task" in delta:
        want["lm_head_rows_per_task"] = LM_ROWS[vocab]
    return want


def test_defaults_are_the_old_defaults():
    assert ScheduleConfig().to_json() == DEFAULTS


def test_cuda_default_from_toml_is_the_old_cuda_default():
    assert CUDA_DEFAULT.to_json() == {**DEFAULTS, **CUDA_DEFAULT_FIELDS}
    assert named_config("cuda_default") == CUDA_DEFAULT
    assert load_config(C.CONFIG_DIR / "cuda_default.toml") == CUDA_DEFAULT  # a plain --config file too


@pytest.mark.parametrize("vocab", sorted(LM_ROWS))
def test_bench_candidates_from_toml_are_the_old_ones_field_by_field(vocab):
    spec = SimpleNamespace(vocab_size=vocab)
    got = all_candidates(spec)
    assert [n for n, _ in got] == [n for n, _ in CANDIDATES]
    for (name, cfg), (_, delta) in zip(got, CANDIDATES, strict=True):
        want = _expected(delta, vocab)
        for field, value in want.items():
            assert cfg.to_json()[field] == value, (name, field)
        assert cfg.to_json() == want, name
    fused = fused_candidates(spec)
    assert [n for n, _ in fused] == [n for n, _ in FUSED]
    for (name, cfg), (_, delta) in zip(fused, FUSED, strict=True):
        assert cfg.to_json() == _expected(delta, vocab), name
    assert dict(got)["balanced-preload-q1-stage-sa-auto-blocked"] == CUDA_DEFAULT
    assert [n for n, _ in default_candidates(spec)] == ["default", "rows32-lm", "best-measured", "balanced-preload",
                                                         "balanced-preload-q1", "balanced-preload-q1-stage",
                                                         "balanced-preload-q1-stage-sa-auto",
                                                         "balanced-preload-q1-stage-sa-auto-blocked"]


def test_every_shipped_toml_is_package_data_and_loads():
    names = sorted(p.name for p in C.CONFIG_DIR.glob("*.toml"))
    assert names == ["audit.toml", "bench.toml", "cuda_default.toml"]
    from importlib.resources import files

    assert all(files("mosaic_amk").joinpath("configs", n).is_file() for n in names)


def _write(tmp_path, monkeypatch, text: str) -> None:
    monkeypatch.setattr(C, "CONFIG_DIR", tmp_path)
    (tmp_path / "cuda_default.toml").write_text((C.Path(C.__file__).parent / "configs" / "cuda_default.toml").read_text())
    (tmp_path / "bench.toml").write_text(text)


@pytest.mark.parametrize("text, needle", [
    ('[[candidate]]\nname = "x"\ngemv_rows_per_task = 0\n', "gemv_rows_per_task"),  # ScheduleConfig's validation
    ('[[candidate]]\nname = "x"\nno_such_field = 1\n', "unknown schedule config key"),
    ('[[candidate]]\ngemv_rows_per_task = 8\n', "needs a name"),
    ('[[candidate]]\nname = "x"\n[[candidate]]\nname = "x"\n', "repeat"),
    ('[[candidate]]\nname = "x"\nbase = "nope"\n', "no shipped schedule config 'nope'"),
    ('[[candidate]]\nname = "x"\nlm_head_rows_per_task = { vocab_per_sms = 0, multiple_of = 64, at_least = 64 }\n',
     "positive integers"),
    ('[[other]]\nname = "x"\n', "no \\[\\[candidate\\]\\] candidates"),
])
def test_bad_candidates_are_refused_with_the_config_validation(tmp_path, monkeypatch, text, needle):
    _write(tmp_path, monkeypatch, text)
    with pytest.raises(BadInput, match=needle):
        load_candidates("candidate", 49152)


def test_audit_configs_from_toml_are_the_old_ones_field_by_field():
    got = load_candidates("audit", file="audit")
    assert [n for n, _ in got] == [n for n, _ in AUDIT]
    for (name, cfg), (_, delta) in zip(got, AUDIT, strict=True):
        assert cfg.to_json() == {**DEFAULTS, **delta}, name
    from mosaic_amk.validate.audit import real_lowerings

    quick = real_lowerings(families=("llama",), quick=True)  # the quick set: the first three, fused-all, pages-rr4
    assert [k for k, _ in quick] == [f"llama/{n}/pos{p}" for n in ("default", "rr4-r8-nofuse", "ll3-r16", "fused-all",
                                                                   "pages-rr4") for p in (0, 7)]


def test_a_per_model_lm_head_split_needs_the_vocab_size():
    with pytest.raises(BadInput, match="needs the model's vocab_size"):
        load_candidates("candidate")
