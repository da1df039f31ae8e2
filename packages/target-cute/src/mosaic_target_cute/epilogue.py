"""A static proof, on the CPU, that the Hopper GEMM's epilogue stores every accumulator where it belongs.

The kernel's epilogue (``kernels/hopper_gemm.py``) moves each consumer thread's fp32 accumulators into
``epi_tile`` sub-tiles of shared memory with a stmatrix tiled copy, reading the accumulators as
``acc_view[e * per_frag + v]`` for sub-tile ``e``, and one warp TMA-stores each sub-tile to its place in C.
:func:`epilogue_map` evaluates those same layouts (the kernel's own ``_mmas`` and ``_r2s``) at trace time
for every consumer thread and checks that:

* the C coordinate an accumulator register holds (the MMA's partition of an identity tensor) is the
  coordinate the copy writes it to (sub-tile origin + the copy's partition of the sub-tile);
* every element of the CTA tile is written exactly once, and no write leaves its sub-tile.

No GPU is needed: ``cute.compile`` traces a host function over fake tensors. A 64-row sub-tile under the
128-row copy of two consumer warpgroups (the bug behind the H200's "illegal memory access") fails the
first two checks for half the threads.
"""

from __future__ import annotations

import attrs

from mosaic_target_cute.knobs import GemmKnobs


@attrs.frozen
class EpilogueMap:
    knobs: GemmKnobs
    threads: int  # consumer threads checked
    values: int  # accumulator values checked (threads x values per thread)
    problems: tuple  # first few mismatches, as text; empty when the map is exact

    @property
    def ok(self) -> bool:
        return not self.problems


def epilogue_map(knobs: GemmKnobs, dtype: str = "bf16", limit: int = 8, groups: int | None = None) -> EpilogueMap:
    """Trace the epilogue's layouts for ``knobs`` and compare them value by value (a few seconds).

    ``groups`` overrides the kernel's epilogue grouping; ``groups=1`` with a 64-row ``epi_tile`` and two
    consumer warpgroups reproduces the kernel before the fix (one group, a copy spanning 128 rows).
    """
    import cutlass.cute as cute
    import cutlass.utils as utils
    from cutlass.cute.runtime import make_fake_stream

    from mosaic_target_cute.kernels.hopper_gemm import WARPGROUP, HopperGemm
    from mosaic_target_cute.lowering import gemm_tensors

    gemm = HopperGemm(knobs, 1)
    if groups is not None:
        gemm.epi_groups = groups
        gemm.epi_group_threads = WARPGROUP * gemm.consumers // groups
        gemm.epi_subtiles_per_group = (gemm.tile_m // gemm.epi_tile[0]) * (gemm.tile_n // gemm.epi_tile[1]) // groups
    tm, tn = gemm.tile_m, gemm.tile_n
    em, en = gemm.epi_tile
    found: dict = {"problems": [], "values": 0, "writes": {}}

    def problem(text: str) -> None:
        if len(found["problems"]) < limit:
            found["problems"].append(text)

    def walk(a, b, c) -> None:  # plain Python, called from the traced function: its loops run at trace time
        gemm.ab_dtype = a.element_type
        gemm.c_dtype = c.element_type
        gemm.c_layout = utils.LayoutEnum.from_tensor(c)
        tiled_mma, epi_mma = gemm._mmas(utils.LayoutEnum.from_tensor(a), utils.LayoutEnum.from_tensor(b))
        r2s = gemm._r2s(epi_mma)
        tile_ids = cute.make_identity_tensor((tm, tn))
        sub_ids = cute.make_identity_tensor((em, en))
        n_sub_n = tn // en
        for ctid in range(WARPGROUP * gemm.consumers):
            group, gtid = ctid // gemm.epi_group_threads, ctid % gemm.epi_group_threads
            held = tiled_mma.get_slice(ctid).partition_C(tile_ids)  # coordinate of each accumulator register
            view = r2s.retile(held)  # the kernel's acc_view, as coordinates
            # the logical sub-tile coordinate of each register the copy takes from this thread (cute.copy
            # moves every logical element to the same coordinate of the destination: stmatrix's lane
            # shuffle is inside the atom)
            src = r2s.get_slice(gtid).partition_S(sub_ids)
            per_frag = cute.size(src)
            if gemm.epi_subtiles_per_group * per_frag != cute.size(held):
                problem(f"thread {ctid}: the epilogue reads {gemm.epi_subtiles_per_group} x {per_frag} values, "
                        f"the thread holds {cute.size(held)}")
                continue
            for e in range(gemm.epi_subtiles_per_group):
                if gemm.epi_groups == 1:
                    om, on = (e // n_sub_n) * em, (e % n_sub_n) * en
                else:
                    om, on = group * em, e * en
                for v in range(per_frag):
                    sm, sn = src[v]
                    want = view[e * per_frag + v]
                    got = (om + sm, on + sn)
                    found["values"] += 1
                    if not (0 <= sm < em and 0 <= sn < en):
                        problem(f"thread {ctid} sub-tile {e} value {v}: writes ({sm}, {sn}) outside the "
                                f"{em}x{en} sub-tile")
                    if tuple(want) != got:
                        problem(f"thread {ctid} sub-tile {e} value {v}: accumulator of C{tuple(want)} "
                                f"stored at C{got}")
                    found["writes"][got] = found["writes"].get(got, 0) + 1

    @cute.jit
    def trace(a, b, c, stream):
        walk(a, b, c)

    a, b, c = gemm_tensors(tm, tn, 64, dtype)
    cute.compile(trace, a, b, c, make_fake_stream(), options="--gpu-arch sm_90a")
    writes = found["writes"]
    missing = tm * tn - sum(1 for m in range(tm) for n in range(tn) if writes.get((m, n)) == 1)
    if missing:
        problem(f"{missing} of {tm * tn} tile elements are not written exactly once")
    return EpilogueMap(knobs, WARPGROUP * gemm.consumers, found["values"], tuple(found["problems"]))
