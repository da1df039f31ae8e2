"""Lifting sm_100a SASS and PTX (issue 37): the project's CuTe Blackwell GEMM, lowered on the CPU, read into the
same six layers as Hopper's, and a Hopper -> Blackwell diff of the same GEMM naming the generational changes.

Artifacts (packages/core/tests/lift/blackwell/, made by ``mosaic capture --lang cute --family gemm --shape
1024x1024x512 --dtype bf16 --gpu h200|b200 --lower-only`` and, for the CTA pair, ``nvdisasm -c`` of the
cubin of tile 128x128, cta_group=2, cluster 2x1, 4 stages; packages/target-cute/tests/test_blackwell_gemm.py
builds the same configurations):

* ``hopper-128x128-sm90a.bundle`` -- the Hopper GEMM (wgmma, producer + two consumer warpgroups);
* ``blackwell-128x128-sm100a.bundle`` -- the Blackwell GEMM, cta_group 1 (UTCHMMA, LDTM, UTCATOMSWS, UTCBAR);
* ``blackwell-2cta-c2x1.sass`` -- the Blackwell GEMM, cta_group 2 (UTCHMMA.2CTA, UTCBAR.2CTA.MULTICAST).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

ART = Path(__file__).parent / "blackwell"
HOPPER = ART / "hopper-128x128-sm90a.bundle"
BW1 = ART / "blackwell-128x128-sm100a.bundle"
BW2 = ART / "blackwell-2cta-c2x1.sass"


@functools.cache
def _lift(path: Path):
    from mosaic.lift.inputs import lift_path

    return lift_path(path)


def _value(fp, key, role=""):
    f = fp.get(key, role)
    assert f is not None, key
    return f.value


def test_artifacts_are_small():
    total = sum(p.stat().st_size for p in ART.rglob("*") if p.is_file())
    assert total < 300_000


@pytest.mark.parametrize("path", [BW1, BW2, BW1 / "kernel.ptx"], ids=["sass-1cta", "sass-2cta", "ptx-1cta"])
def test_sm100_gemm_lifts_to_tcgen05(path):
    fp = _lift(path)
    assert _value(fp, "mma.form") == ["tcgen05"]
    assert _value(fp, "mma.accumulator") == ["tmem"]
    assert _value(fp, "mma.types") == ["kind::f16"]
    assert _value(fp, "mma.cta_group") == ([2] if path == BW2 else [1])
    assert _value(fp, "tmem.ops") == ["alloc", "commit", "dealloc", "ld"]
    barriers = _value(fp, "barrier.ops")
    assert "tcgen05.commit" in barriers and "mbar.wait" in barriers and "mbar.init" in barriers
    assert _value(fp, "transfer.form") == ["tma"]
    assert _value(fp, "transfer.store_form") == ["st.global"]
    assert "wgmma.sync" not in barriers


@pytest.mark.parametrize("path", [BW1, BW2], ids=["1cta", "2cta"])
def test_sm100_roles_and_hot_loops(path):
    """Three warp roles (TMA producer, MMA issuer, TMEM epilogue), each with its hot loop: the MMA warp's
    loop issues the four k-slices of a 64-deep k-block (UTCHMMA) between an mbarrier wait and a commit."""
    fp = _lift(path)
    assert _value(fp, "roles") == ["consumer", "epilogue", "producer"]
    mixes = {f.where: f.value for f in fp.layer("instruction") if f.key == "hot_loop.mix"}
    consumer = next(v for w, v in mixes.items() if w.startswith("role consumer"))
    assert consumer["mma"] == 4.0 and consumer.get("mbar.wait")
    producer = next(v for w, v in mixes.items() if w.startswith("role producer"))
    assert producer["tma.load"] >= 2.0  # A and B (the 2-CTA build keeps a multicast variant too)
    epilogue = next(v for w, v in mixes.items() if w.startswith("role epilogue"))
    assert epilogue["tmem"] >= 1 and epilogue["st.global"] > 0


def test_sass_opcodes_classified():
    """Every tcgen05-era opcode the lowering emits has a class (none falls to ``other``)."""
    from mosaic.lift.sass import parse_sass

    prog = next(iter(parse_sass(BW2.read_text(), where=str(BW2)).values()))
    by_op = {i.opcode: i.opclass for i in prog.instructions}
    assert by_op["UTCHMMA"] == "mma" and by_op["LDTM"] == "tmem" and by_op["UTCATOMSWS"] == "tmem"
    assert by_op["UTCBAR"] == "mbar.arrive" and by_op["UTMALDG"] == "tma.load"
    assert by_op["UCGABAR_ARV"] == "cluster.bar"
    unknown = sorted({i.full for i in prog.instructions if i.opclass in ("other", None)})
    assert not unknown, unknown


def test_hopper_to_blackwell_diff_names_the_generation():
    from mosaic.lift.diff import diff_fingerprints

    d = diff_fingerprints(_lift(HOPPER), _lift(BW1))
    rows = {r.key: r for r in d.rows}
    assert d.rows[0].key == "mma.form"
    assert (rows["mma.form"].reference, rows["mma.form"].candidate) == (["wgmma"], ["tcgen05"])
    assert (rows["mma.accumulator"].reference, rows["mma.accumulator"].candidate) == (["registers"], ["tmem"])
    assert rows["tmem.ops"].reference == [] and "alloc" in rows["tmem.ops"].candidate
    for key in ("mma.accumulator", "tmem.ops", "mma.types"):
        assert rows[key].cause == "mma.form", key  # consequences of the MMA generation, grouped under it
    assert "roles" in rows and "epilogue" in rows["roles"].candidate
    # one CTA per MMA on both sides: no cta_group row for the 1-CTA Blackwell kernel
    assert "mma.cta_group" not in rows
    d2 = diff_fingerprints(_lift(BW1), _lift(BW2))
    r2 = {r.key: r for r in d2.rows}
    assert (r2["mma.cta_group"].reference, r2["mma.cta_group"].candidate) == ([1], [2])
    assert "mma.form" not in r2


def test_new_keys_have_rules_and_priors():
    from mosaic.lift import causes, rules

    for key in ("mma.accumulator", "mma.cta_group", "tmem.ops"):
        assert key in rules.BY_KEY and key in causes.PRIOR
    assert "mma.cta_group" in causes.STRENGTH


def test_cluster_launch_control_is_a_known_opcode():
    """CUTLASS's Sm100 tile scheduler asks the hardware for the next tile with cluster launch control
    (clusterlaunchcontrol.try_cancel, SASS UGETNEXTWORKID): a known opcode, classed as the PTX side classes it
    (``other``), so lifting a CUTLASS Blackwell GEMM warns about no unknown opcode."""
    from mosaic.lift.opclass import ptx_class, sass_class

    assert sass_class("UGETNEXTWORKID", ()) == "other" == ptx_class("clusterlaunchcontrol", ("try_cancel",))
