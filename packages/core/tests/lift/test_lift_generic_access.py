"""Plain loads and stores through generic addresses (PTX ``ld`` / ``st`` with no state space, SASS ``LD.E`` /
``ST.E``) are a way tiles arrive and a way results leave: ``transfer.form`` ``ld.generic``,
``transfer.store_form`` ``st.generic``, with their widths in ``access.generic.*``. Mosaic GPU stores a register
result to a global ref that way (the Pallas row-wise ``copy='tma_in'`` kernel: 32 ``ST.E.64`` on the H200); before,
the committed quack rmsnorm -> Pallas campaign's report read that kernel's store form and store widths as empty
(``reference ["st.global"], candidate []``), as if it stored nothing."""

from __future__ import annotations

from pathlib import Path

from mosaic.lift.inputs import lift_bundle, lift_path
from mosaic.lift.opclass import ptx_class, sass_class

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "h200-quack-rmsnorm-to-pallas-16384" / "bundles"
INCUMBENT = EXAMPLE / "cand-4680c97e0d162f9f.bundle"  # copy='tma_in', block_rows=2, vector=4: the converged kernel


def _rows(fp):
    return {(f.layer, f.key): f.value for f in fp.features}


def test_a_state_space_less_access_is_generic():
    assert ptx_class("st", ("v2", "b32")) == "st.generic"
    assert ptx_class("ld", ("v4", "b32")) == "ld.generic"
    assert ptx_class("st", ("global", "v4", "b32")) == "st.global"
    assert sass_class("ST", ("E", "64")) == "st.generic"
    assert sass_class("LD", ("E", "128")) == "ld.generic"
    assert sass_class("STG", ("E", "128")) == "st.global"


def test_the_h200_pallas_tma_in_kernel_stores_through_generic_addresses():
    for fp in (lift_path(INCUMBENT / "kernel.sass"), lift_path(INCUMBENT / "kernel.ptx")):
        rows = _rows(fp)
        assert rows[("instruction", "transfer.store_form")] == ["st.generic"]
        assert rows[("instruction", "access.generic.store_width")] == [64]
        assert rows[("instruction", "access.global.store_width")] == []
        assert rows[("instruction", "transfer.form")] == ["tma"]  # the stages still arrive by TMA


def test_quack_stores_through_global_addresses_and_the_diff_says_the_forms_differ():
    from mosaic.lift.diff import diff_fingerprints

    ref, cand = lift_bundle(EXAMPLE / "reference.bundle"), lift_bundle(INCUMBENT)
    assert _rows(ref)[("instruction", "transfer.store_form")] == ["st.global"]
    assert _rows(ref)[("instruction", "access.generic.store_width")] == []
    rows = {r.key: r for r in diff_fingerprints(ref, cand).rows}
    assert rows["transfer.store_form"].reference == ["st.global"]
    assert rows["transfer.store_form"].candidate == ["st.generic"]
    assert rows["access.generic.store_width"].candidate == [64]


PLAIN_COPY = """
.version 8.0
.target sm_90a
.address_size 64
.visible .entry copy_rows(.param .u64 x, .param .u64 y, .param .u32 n)
{
  .reg .b32 %r<12>;
  .reg .b64 %rd<8>;
  .reg .pred %p<2>;
  ld.param.u64 %rd1, [x];
  ld.param.u64 %rd2, [y];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %tid.x;
  mov.u32 %r3, 0;
$L_loop:
  add.s32 %r4, %r3, %r2;
  mul.wide.u32 %rd3, %r4, 16;
  add.s64 %rd4, %rd1, %rd3;
  add.s64 %rd5, %rd2, %rd3;
  ld.v4.b32 {%r5, %r6, %r7, %r8}, [%rd4];
  st.v4.b32 [%rd5], {%r5, %r6, %r7, %r8};
  add.s32 %r3, %r3, 128;
  setp.lt.u32 %p1, %r3, %r1;
  @%p1 bra $L_loop;
  ret;
}
"""


def test_plain_generic_loads_in_the_loop_are_the_tiles_way_in(tmp_path):
    """copy='direct' on the H200 loads with LD.E.128 and stores with ST.E.128: the same shape, written by hand."""
    p = tmp_path / "copy.ptx"
    p.write_text(PLAIN_COPY)
    rows = _rows(lift_path(p))
    assert rows[("instruction", "transfer.form")] == ["ld.generic"]
    assert rows[("instruction", "transfer.store_form")] == ["st.generic"]
    assert rows[("instruction", "access.generic.load_width")] == [128]
    assert rows[("instruction", "access.generic.store_width")] == [128]
    assert rows[("instruction", "access.global.load_width")] == []


def test_quacks_async_store_to_a_cluster_peer_is_the_same_class_in_both_dialects():
    """quack's sm_90 GEMM stores to a cluster peer's shared memory with st.async (SASS ``STAS.128``), which the SASS
    table did not know (class None, counted as ``other``); the PTX dialect reads it by its state space."""
    ptx = ptx_class("st", ("async", "shared::cluster", "mbarrier::complete_tx::bytes", "v4", "s32"))
    assert ptx == "st.shared"
    assert sass_class("STAS", ("128",)) == ptx
