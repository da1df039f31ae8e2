"""A non-tensor bulk copy is read by its direction: ``cp.async.bulk.global.shared::cta`` (SASS ``UBLKCP.G.S``) stores
shared -> global, and the lift counts it as the kernel's result store (``transfer.store_form`` ``bulk``), not as a way
tiles arrive. The Pallas row-wise kernels store every block that way; before, the H200 campaign's report read their
store form as empty (``reference ["st.global"], candidate []``) and their transfer form as ``["bulk", "tma"]``."""

from __future__ import annotations

import tarfile
from pathlib import Path

from mosaic.lift.inputs import lift_path
from mosaic.lift.opclass import ptx_class, sass_class

CAMPAIGN = (Path(__file__).resolve().parents[4] / "results" / "2026-12-02" / "session12" / "rmsnorm-campaign" /
            "campaign.tar.xz")
INCUMBENT = "h200-quack-rmsnorm-to-pallas/bundles/cand-5f9c7d8af6782f15.bundle"  # its last incumbent (139.04 us)


def test_the_direction_of_a_bulk_copy_is_its_destination():
    assert sass_class("UBLKCP", ("G", "S")) == "bulk.store"
    assert sass_class("UBLKCP", ("S", "G")) == "bulk.copy"
    assert sass_class("UBLKRED", ("G", "S", "ADD")) == "bulk.store"
    assert ptx_class("cp", ("async", "bulk", "global", "shared::cta", "bulk_group")) == "bulk.store"
    assert ptx_class("cp", ("async", "bulk", "shared::cluster", "global", "mbarrier::complete_tx::bytes")) == "bulk.copy"
    assert ptx_class("cp", ("reduce", "async", "bulk", "global", "shared::cta", "bulk_group", "add", "f32")) == \
        "bulk.store"
    # the tensor forms keep their names
    assert ptx_class("cp", ("async", "bulk", "tensor", "3d", "shared::cluster", "global", "tile")) == "tma.load"
    assert sass_class("UTMASTG", ("3D",)) == "tma.store"


def test_the_h200_pallas_rmsnorm_stores_by_bulk_copy(tmp_path):
    with tarfile.open(CAMPAIGN) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(INCUMBENT + "/") and m.isfile()]
        tar.extractall(tmp_path, members=members, filter="data")
    # the SASS the H200 compiled (the archive leaves out the oracle files, so the listing, not the bundle, is lifted)
    fp = lift_path(tmp_path / INCUMBENT / "kernel.sass")
    rows = {(f.layer, f.key): f.value for f in fp.features}
    assert rows[("instruction", "transfer.store_form")] == ["bulk"]
    assert rows[("instruction", "transfer.form")] == ["tma"]  # the TMA loads alone: the tiles' way in
