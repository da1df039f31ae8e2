"""Every planted pair of the nvcc-built corpus gives its planted row in the top 3 of the right layer."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import ARTIFACTS, CORPUS, SPEC, diff_variants, lifted  # noqa: E402

PAIRS = SPEC["pairs"]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_planted_difference_is_a_top3_row_of_its_layer(name):
    pair = PAIRS[name]
    layer, key = pair["planted"]
    result = diff_variants(pair["ref"], pair["cand"])
    in_layer = [r for r in result.rows if r.layer == layer]
    top3 = [r.key for r in in_layer[:3]]
    assert key in top3, f"{name}: {layer}/{key} not in the top 3 of its layer: {top3}"
    row = next(r for r in in_layer if r.key == key)
    assert row.reference != row.candidate
    # ranks are 1..n; causes by expected cost, highest first, each followed by the rows it explains
    assert [r.rank for r in result.rows] == list(range(1, len(result.rows) + 1))
    heads = [r for r in result.rows if not r.cause]
    assert [h.cost for h in heads] == sorted((h.cost for h in heads), reverse=True)
    current = None
    for r in result.rows:
        current = r.key if not r.cause else current
        assert not r.cause or r.cause == current, f"{name}: {r.key} is grouped under {r.cause}, not {current}"
    assert dict(result.layers)[layer] > 0


EXPECTED_VALUES = {
    "unroll": ("loop.unroll", 1, 4),
    "load_width": ("access.global.load_width", [32], [128]),
    "copy_form": ("transfer.form", ["cp.async"], ["tma"]),
    "mma_form": ("mma.form", ["mma.sync"], ["wgmma"]),
    "exp_form": ("exp.form", ["precise"], ["approx"]),
    "contraction": ("fma.contraction", "fused", "unfused"),
    "stages": ("pipeline.stages", 2, 4),
    "warp_roles": ("roles", ["all"], ["consumer", "producer"]),
    "persistent": ("persistent", False, True),
    "block": ("block.max_threads", [128, 1, 1], [256, 1, 1]),
    "cluster": ("cluster", [1, 1, 1], [2, 1, 1]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_VALUES))
def test_planted_row_values(name):
    key, ref, cand = EXPECTED_VALUES[name]
    pair = PAIRS[name]
    row = next(r for r in diff_variants(pair["ref"], pair["cand"]).rows if r.key == key)
    assert (row.reference, row.candidate) == (ref, cand)


def test_spill_row_counts_local_memory_and_ptxas_bytes_agree():
    row = next(r for r in diff_variants("regs255", "regs32").rows if r.key == "spills")
    assert row.reference == {"local_instructions": 0}
    assert row.candidate["local_instructions"] > 100  # STL/LDL in the SASS of the -maxrregcount=32 build
    assert "740 bytes spill stores" in (ARTIFACTS / "regs32.ptxas.log").read_text()


@pytest.mark.parametrize("name", sorted(SPEC["same"]))
def test_identical_and_renamed_give_no_rows(name):
    pair = SPEC["same"][name]
    result = diff_variants(pair["ref"], pair["cand"])
    assert result.rows == ()
    assert all(d == 0.0 for _, d in result.layers)
    if name == "renamed":
        assert lifted(pair["ref"]).kernel != lifted(pair["cand"]).kernel  # names differ, structure does not


def test_ptx_and_sass_text_lift_the_same_planted_rows():
    rows = diff_variants("stages2", "stages4", "ptx").rows
    assert any(r.key == "pipeline.stages" and (r.reference, r.candidate) == (2, 4) for r in rows)
    rows = diff_variants("mma_sync", "wgmma", "sass").rows
    assert rows[0].key == "mma.form" and rows[0].candidate == ["wgmma"]
    assert diff_variants("stages2", "stages2_renamed", "ptx").rows == ()


def test_warp_roles_found_in_sass_and_ptx():
    for ext in ("cubin", "ptx"):
        fp = lifted("ws_on", ext)
        names = {r["name"]: r for r in fp.roles}
        assert set(names) == {"producer", "consumer"}, ext
        assert names["producer"]["setmaxnreg"] == 40 and names["consumer"]["setmaxnreg"] == 232
    assert [r["name"] for r in lifted("ws_off").roles] == ["all"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH; the committed artifacts are used")
def test_recompiled_pair_gives_the_same_rows(tmp_path):
    spec = importlib.util.spec_from_file_location("corpus_build", CORPUS / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    from mosaic.lift.diff import diff_fingerprints
    from mosaic.lift.inputs import lift_path

    for v in ("stages2", "stages4"):
        build.build_variant(v, SPEC["variants"][v], SPEC["arch"], tmp_path)
    fresh = diff_fingerprints(lift_path(tmp_path / "stages2.cubin"), lift_path(tmp_path / "stages4.cubin"))
    assert fresh.to_json() == diff_variants("stages2", "stages4").to_json()
