"""The lifter against the labelled corpus of real kernels (corpus/truth/labels.json): every fingerprint key
>= 95% correct and nothing fails to parse (benchmarks/lift_accuracy.py prints the table)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
from mosaic.bundle import member_path

TRUTH = Path(__file__).resolve().parent / "corpus" / "truth"
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))
import lift_accuracy  # noqa: E402


def _make_labels():
    spec = importlib.util.spec_from_file_location("make_labels", TRUTH / "make_labels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_labels_json_is_what_make_labels_writes():
    mod = _make_labels()
    assert (TRUTH / "labels.json").read_text() == mod.render(mod.build_cases())


def test_corpus_covers_every_source():
    sources = {c["source"] for c in lift_accuracy.load_cases()}
    assert sources == {"cuda", "pallas", "cutlass", "cute", "triton", "quack", "flash-attn-4"}
    for case in lift_accuracy.load_cases():
        assert case["labels"] and case["build"]
        if case["source"] != "cuda":
            assert member_path(lift_accuracy.ROOT / case["artifact"]).exists(), case["id"]


def test_label_matching_rules():
    assert lift_accuracy.matches({"min": 1}, 3) and not lift_accuracy.matches({"min": 1}, 0)
    assert not lift_accuracy.matches({"min": 1}, None)
    assert lift_accuracy.matches(["b", "a"], ["a", "b"]) and not lift_accuracy.matches(["a"], ["a", "b"])
    assert lift_accuracy.matches({"local_instructions": {"min": 1}}, {"local_instructions": 4, "x": 0})
    assert lift_accuracy.matches({"producer": 40}, {"producer": 40})
    assert not lift_accuracy.matches({"producer": 40}, {"producer": 40, "consumer": 232})


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the CUDA cases compile here)")
def test_every_key_meets_the_goal_on_the_corpus(tmp_path):
    result = lift_accuracy.evaluate(lift_accuracy.load_cases(), tmp_path, lift_accuracy.load_pairs())
    assert not result["parse_failures"], result["parse_failures"]
    assert len(result["pairs"]) >= 21 and [p for p in result["pairs"] if not p["ok"]] == []
    assert {p["ref"] for p in result["pairs"] if p.get("same")} >= {"divide", "planted-stages2"}
    low = {k: (v["accuracy"], v["misses"]) for k, v in result["keys"].items() if v["accuracy"] < lift_accuracy.GOAL}
    assert not low, low
    assert result["meets_goal"]


def test_compiled_artifacts_are_kept_small_and_each_has_its_build_command():
    """Kernels compiled here (CUTLASS, Triton, quack, flash-attn-4) are stored xz-compressed; each case names
    the command that regenerates it."""
    cases = [c for c in lift_accuracy.load_cases() if c["source"] in ("triton", "quack", "flash-attn-4")
             or c.get("artifact", "").endswith(".xz")]
    assert len(cases) >= 54  # CUTLASS 24, Triton 12, quack 12, flash-attn-4 6
    for case in cases:
        path = lift_accuracy.ROOT / case["artifact"]
        assert path.suffix == ".xz" and path.stat().st_size < 64 * 1024, case["id"]
        assert "build_" in case["build"] and "--only" in case["build"], case["id"]


def test_an_xz_artifact_is_unpacked_once_into_the_cache(tmp_path):
    case = next(c for c in lift_accuracy.load_cases() if c["source"] == "triton")
    first = lift_accuracy.artifact(case, tmp_path)
    packed = lift_accuracy.ROOT / case["artifact"]
    assert first.suffix in (".cubin", ".ptx") and first.stat().st_size > packed.stat().st_size
    stamp = first.stat().st_mtime_ns
    assert lift_accuracy.artifact(case, tmp_path) == first and first.stat().st_mtime_ns == stamp
