import json
import subprocess
import sys

import pytest
from mosaic.catalog import (
    CATALOG_LANGUAGES,
    CONCEPTS,
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
    # every language's entries come from its own plugin
    assert cat.languages == ("pallas", "cute", "cutlass")
    for concept in CONCEPTS:
        for lang in cat.languages:
            assert cat.entry(concept.name, lang).source == lang


def test_missing_entries_are_reported():
    own = Construct("tma-load", "cutlass", "my own tma", "direct")
    cat = build_catalog({own.name: (own, "x")}, languages=("cutlass", "triton"))
    problems = completeness(cat, languages=("cutlass", "triton"))
    # every concept of an uncovered language, and every concept but the one given, is reported
    assert {p.where for p in problems} == ({f"{c.name}@triton" for c in CONCEPTS}
                                           | {f"{c.name}@cutlass" for c in CONCEPTS if c.name != "tma-load"})
    assert all(p.code == "catalog-missing" for p in problems)
    assert cat.entry("tma-load", "cutlass").source == "x"


def test_unknown_concept_is_flagged():
    own = Construct("tma-load", "cutlass", "my own tma", "direct")
    bogus = Construct("teleport", "cutlass", "x")
    cat = build_catalog({own.name: (own, "cutlass")}, languages=("cutlass",))
    assert cat.entry("tma-load", "cutlass").construct.expression == "my own tma"
    assert cat.entry("wgmma", "cutlass").source == "missing"
    codes = {p.code for p in completeness(cat, [own, bogus], languages=("cutlass",))}
    assert codes == {"catalog-unknown-concept", "catalog-missing"}


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
