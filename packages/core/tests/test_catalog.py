import json
import subprocess
import sys

import pytest
from mosaic.catalog import (
    CATALOG_LANGUAGES,
    CONCEPTS,
    CORE_CONSTRUCTS,
    build_catalog,
    catalog_from_host,
    completeness,
    concepts_for_feature,
)
from mosaic.errors import RecordError
from mosaic.plugins import host
from mosaic.records import Construct


def test_at_least_25_concepts_with_fingerprints():
    assert len(CONCEPTS) >= 25
    assert len({c.name for c in CONCEPTS}) == len(CONCEPTS)
    for c in CONCEPTS:
        assert c.fingerprint, c.name
    names = {c.name for c in CONCEPTS}
    for required in ("tma-load", "cp-async", "mbarrier-arrive", "mbarrier-wait", "wgmma", "warpgroup",
                     "tma-multicast", "pipeline-stage", "persistent-tile-loop", "epilogue-tma-store",
                     "smem-swizzle", "setmaxnreg", "approximate-exp", "fma-contraction"):
        assert required in names


def test_installed_catalog_is_complete_for_every_language():
    h = host()
    registered = [reg.item for reg in h.registries["constructs"].values()]
    cat = catalog_from_host(h)
    problems = completeness(cat, registered)
    assert problems == [], [p.line() for p in problems]
    # the three languages' entries come from where they should: plugins for pallas/cute, core data for cutlass
    for concept in CONCEPTS:
        assert cat.entry(concept.name, "pallas").source == "pallas"
        assert cat.entry(concept.name, "cute").source == "cute"
        assert cat.entry(concept.name, "cutlass").source in ("core-data", "cutlass")


def test_missing_entries_are_reported():
    partial = build_catalog({c.name: (c, "x") for c in CORE_CONSTRUCTS[:3]}, languages=("cutlass",))
    # core data fills cutlass; an uncovered language is reported concept by concept
    cat = build_catalog({}, languages=("cutlass", "triton"))
    problems = completeness(cat, languages=("cutlass", "triton"))
    assert {p.where for p in problems} == {f"{c.name}@triton" for c in CONCEPTS}
    assert all(p.code == "catalog-missing" for p in problems)
    assert partial.entry("tma-load", "cutlass").source == "x"


def test_plugin_entry_overrides_core_and_unknown_concept_is_flagged():
    own = Construct("tma-load", "cutlass", "my own tma", "direct")
    bogus = Construct("teleport", "cutlass", "x")
    cat = build_catalog({own.name: (own, "cutlass")})
    assert cat.entry("tma-load", "cutlass").construct.expression == "my own tma"
    assert cat.entry("wgmma", "cutlass").source == "core-data"
    codes = [p.code for p in completeness(cat, [own, bogus], languages=("cutlass",))]
    assert codes == ["catalog-unknown-concept"]


def test_no_analogue_flag_counts_as_covered_but_empty_expression_does_not():
    none = Construct("cp-async", "pallas", "", "none", "TMA only")
    empty = Construct("wgmma", "pallas", "  ", "direct")
    cat = build_catalog({none.name: (none, "p"), empty.name: (empty, "p")}, languages=("pallas",))
    wheres = {p.where: p.code for p in completeness(cat, languages=("pallas",))}
    assert "cp-async@pallas" not in wheres
    assert wheres["wgmma@pallas"] == "catalog-empty"


def test_features_map_to_concepts():
    assert {c.name for c in concepts_for_feature("sass:UTMALDG.2D.MULTICAST")} >= {"tma-load", "tma-multicast"}
    assert [c.name for c in concepts_for_feature("sass:MUFU.EX2")] == ["approximate-exp"]
    assert concepts_for_feature("sass:NOPE") == []


def test_bad_fingerprint_feature_is_rejected():
    from mosaic.catalog import Concept

    with pytest.raises(RecordError, match="fingerprint feature"):
        Concept("x", "y", "launch", ("UTMALDG",))


def _mosaic(*args):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_catalog_json_and_text():
    out = _mosaic("catalog", "--lang", "pallas", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["languages"] == ["pallas"]
    by_name = {c["name"]: c for c in data["concepts"]}
    assert by_name["cp-async"]["languages"]["pallas"]["analogue"] == "none"
    assert "plgpu.wgmma" in by_name["wgmma"]["languages"]["pallas"]["expression"]
    text = _mosaic("catalog")
    assert text.returncode == 0
    for lang in CATALOG_LANGUAGES:
        assert f"    {lang}" in text.stdout
    assert "MISSING" not in text.stdout


def test_cli_catalog_unknown_language_is_one_line_exit_2():
    out = _mosaic("catalog", "--lang", "fortran")
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: unknown language 'fortran'")
    assert len(out.stderr.strip().splitlines()) == 1


def test_real_sass_and_ptx_spellings_match():
    # spellings as nvdisasm / the DSL print them for this project's CuTe Hopper gemm
    assert {c.name for c in concepts_for_feature("sass:SYNCS.PHASECHK.TRANS64.TRYWAIT")} == {"mbarrier-wait"}
    assert {c.name for c in concepts_for_feature("sass:USETMAXREG.TRY_ALLOC.CTAPOOL")} == {
        "setmaxnreg", "warp-specialization"}
    ptx = "ptx:cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
    assert {"tma-multicast"} <= {c.name for c in concepts_for_feature(ptx)}
