"""The lifter on real Hopper GEMMs captured on the H200 (CUTLASS cooperative and pingpong, the project's CuTe
gemm, jax's Pallas hopper matmul): warp roles and pipeline stages against the truth each bundle records
(CUTLASS: the mainloop template's stage count in the mangled kernel name in lowering.json; CuTe and Pallas:
the capture's knobs in manifest.json)."""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import ARTIFACTS  # noqa: E402
from mosaic.bundle import member_path  # noqa: E402
from mosaic.lift.diff import diff_fingerprints  # noqa: E402
from mosaic.lift.inputs import lift_bundle, lift_path  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "h200"
COOP_C1X2 = "coop-128x128x64-c1x2-4096"
COOP_C2X1 = "coop-128x256x64-c2x1-4096"
PINGPONG = "pingpong-64x128x64-c1x1-s4-4096"
CUTE = "cute-128x256-s4-persistent-c2x1-sw8"
PALLAS = "pallas-jax-128x128x64-s4-sass"
SPECIALISED = (COOP_C1X2, COOP_C2X1, PINGPONG, CUTE)


@functools.cache
def lifted(name: str):
    return lift_bundle(DATA / f"{name}.bundle")


def true_stages(name: str) -> int:
    root = DATA / f"{name}.bundle"
    kernel = json.loads((root / "manifest.json").read_text())["kernel"]
    knobs = kernel["knobs"]
    if kernel["language"] == "cutlass":
        mangled = json.loads((root / "lowering.json").read_text())["kernel_name"]
        return int(re.search(r"MainloopSm90TmaGmmaWarpSpecialized\w*?ILi(\d+)E", mangled).group(1))
    return knobs.get("stages") or knobs["max_concurrent_steps"]


def test_the_truth_is_read_from_the_records():
    assert [true_stages(n) for n in (COOP_C1X2, COOP_C2X1, PINGPONG, CUTE, PALLAS)] == [6, 4, 4, 4, 4]


@pytest.mark.parametrize("name", SPECIALISED)
def test_warp_specialised_kernels_have_a_producer_and_a_consumer(name):
    fp = lifted(name)
    roles = {r["name"]: r for r in fp.roles}
    assert set(roles) == {"producer", "consumer"}
    # setmaxnreg: the producer gives registers back (40), the consumers take them (232)
    assert roles["producer"]["setmaxnreg"] == 40 and roles["consumer"]["setmaxnreg"] == 232
    assert fp.main_role == "consumer"
    producer = fp.get("hot_loop.mix", "producer").value
    consumer = fp.get("hot_loop.mix", "consumer").value
    # the producer's hot loop: TMA loads and mbarrier traffic, no MMA; the consumer's: HGMMA and waits, no TMA
    assert producer.get("tma.load", 0) > 0 and producer.get("mbar.wait", 0) > 0 and "mma" not in producer
    assert consumer.get("mma", 0) > 0 and consumer.get("mbar.wait", 0) > 0 and "tma.load" not in consumer
    assert fp.get("roles.registers").value == {"producer": 40, "consumer": 232}


#: jax 0.11.2, jax/experimental/pallas/ops/gpu/hopper_matmul_mgpu.py (the kernel these bundles captured):
#: ``plgpu.kernel(..., grid=(num_sms // cluster_size,), num_threads=3, thread_name="wg")``, its pipeline
#: ``emit_pipeline_warp_specialized(..., memory_registers=40, num_compute_wgs=2, ...)`` inside
#: ``plgpu.nd_loop((m_iters * n_iters,), collective_axes="cluster_grid")`` (the persistent tile loop), and
#: jax/_src/pallas/mosaic_gpu/pipeline.py ``_compute_registers``: min(256, (512 - memory) / compute) // 8 * 8.
JAX_MATMUL = {"warpgroups": 3, "compute_wgs": 2, "memory_registers": 40}


def _jax_compute_registers(memory: int, compute_wgs: int) -> int:
    return int(min(256.0, (512 - memory) / compute_wgs) // 8 * 8)


@pytest.mark.parametrize("bundle", [DATA / f"{PALLAS}.bundle", Path(__file__).resolve().parents[4] / "packages" /
                                    "target-pallas" / "src" / "mosaic_target_pallas" / "references" /
                                    "gemm-4096x4096x4096-bf16-h200.bundle"], ids=["s4-sass", "shipped-reference"])
def test_pallas_matmul_is_warp_specialised_and_persistent(bundle):
    launch = json.loads((bundle / "launch.json").read_text())
    assert launch["block"] == [128 * JAX_MATMUL["warpgroups"], 1, 1]  # the launch agrees with the source
    fp = lift_bundle(bundle)
    roles = {r["name"]: r for r in fp.roles}
    consumer_regs = _jax_compute_registers(JAX_MATMUL["memory_registers"], JAX_MATMUL["compute_wgs"])
    assert consumer_regs == 232
    assert fp.get("roles").value == ["consumer", "producer"]
    assert fp.get("roles.registers").value == {"producer": JAX_MATMUL["memory_registers"], "consumer": consumer_regs}
    assert fp.get("roles.warpgroups").value == {"producer": 1, "consumer": JAX_MATMUL["compute_wgs"]}
    assert roles["producer"]["warpgroups"] == 1 and roles["consumer"]["warpgroups"] == 2
    assert fp.main_role == "consumer"
    # nd_loop over m_iters * n_iters tiles on a grid of one CTA per SM: more tiles than CTAs, so each CTA loops
    lowering = json.loads((DATA / f"{PALLAS}.bundle" / "lowering.json").read_text())
    cta_m, cta_n = map(int, re.search(r"cta_tile=\((\d+), (\d+)\)", " ".join(lowering["notes"])).groups())
    assert (4096 // cta_m) * (4096 // cta_n) > launch["grid"][0] == 132
    assert fp.get("persistent").value is True
    assert "mma" in fp.get("hot_loop.mix", "consumer").value and "mma" not in fp.get("hot_loop.mix", "producer").value
    assert fp.get("hot_loop.mix", "producer").value.get("tma.load", 0) > 0


@pytest.mark.parametrize("name", (*SPECIALISED, PALLAS))
def test_pipeline_stages_match_the_recorded_truth(name):
    fp = lifted(name)
    feats = [f for f in fp.features if f.key == "pipeline.stages"]
    assert feats and all(f.value == true_stages(name) for f in feats), [(f.role, f.value, f.where) for f in feats]
    assert all(re.search(r"\[S[12] ", f.where) for f in feats)  # read from the loop, not guessed from inits


def test_cutlass_cooperative_pair_compares_like_roles():
    rows = diff_fingerprints(lifted(COOP_C1X2), lifted(COOP_C2X1)).rows
    stages = [r for r in rows if r.key == "pipeline.stages"]
    assert {(r.reference, r.candidate) for r in stages} == {(6, 4)}
    assert sorted(r.where.split(",")[0] for r in stages) == ["role consumer", "role producer"]
    # producer rows only ever hold producer work and consumer rows consumer work
    for r in rows:
        if r.key == "hot_loop.mix" and "producer" in r.where:
            assert "mma" not in r.reference and "mma" not in r.candidate
        assert "reference role" not in r.where


def test_pallas_to_cute_compares_like_roles():
    # both are warp-specialised (one producer at 40 registers, two consumers at 232) and persistent: neither
    # the roles nor persistence is a difference any more, and loop rows pair producer with producer
    rows = diff_fingerprints(lifted(PALLAS), lifted(CUTE)).rows
    by_key = {r.key: r for r in rows}
    assert not {"roles", "roles.registers", "roles.warpgroups", "persistent", "pipeline.stages"} & set(by_key)
    loop_rows = [r for r in rows if r.key in ("hot_loop.mix", "loop.unroll", "hot_loop.order", "hot_loop.length")]
    assert loop_rows
    for r in loop_rows:
        assert r.where.startswith(("role consumer", "role producer")) and "no warp roles" not in r.where
        if r.key == "hot_loop.mix" and r.where.startswith("role producer"):
            assert "mma" not in r.reference and "mma" not in r.candidate


def test_single_loop_kernel_compares_with_the_consumer():
    # the project's own Pallas kernel (one warpgroup, no roles) against the CuTe gemm: its one loop nest is
    # compared with the candidate's consumer (MMA) loop
    own = lift_path(DATA / "pallas-own-128x128x64-s4.bundle" / "kernel.ptx")
    assert [r["name"] for r in own.roles] == ["all"]
    rows = diff_fingerprints(own, lifted(CUTE)).rows
    by_key = {r.key: r for r in rows}
    assert by_key["roles"].reference == ["all"] and by_key["roles"].candidate == ["consumer", "producer"]
    loop_rows = [r for r in rows if r.key in ("hot_loop.mix", "loop.unroll", "hot_loop.order")]
    assert loop_rows
    for r in loop_rows:
        assert r.where.startswith("role consumer") and "reference has no warp roles" in r.where
    assert "mma" in by_key["hot_loop.mix"].candidate


def test_setmaxnreg_retry_and_elect_issue_loops_are_not_work_loops():
    # CUTLASS retries USETMAXREG.TRY_ALLOC in a 4-instruction loop; it is a wait, not a loop of work
    fp = lifted(COOP_C1X2)
    assert all(lp["body"] > 8 for lp in fp.loops), fp.loops
    assert [lp["depth"] for lp in fp.loops if lp["role"] == "consumer"] == [1, 2]
    # the corpus TMA kernel: ptxas wraps each UTMALDG in an ELECT ... BRA.U.ANY issue loop; the k-loop is
    # still one loop, unrolled 4 like its cp.async twin
    ref, cand = lift_path(ARTIFACTS / "cpasync.cubin"), lift_path(ARTIFACTS / "tma.cubin")
    assert cand.get("loops.depth").value == 1 == ref.get("loops.depth").value
    assert cand.get("loop.unroll", "all").value == 4 == ref.get("loop.unroll", "all").value
    assert not {r.key for r in diff_fingerprints(ref, cand).rows} & {"loops.depth", "loop.unroll"}


@pytest.mark.parametrize("name,stages", [("pallas-jax-128x128x64-s3", 3), ("pallas-jax-128x128x64-s4", 4)])
def test_pallas_ptx_stages_including_a_modulo_by_three(name, stages):
    # the bundles hold jax's PTX only; s3 computes step % 3 with a magic multiply (mul.hi by 0xAAAAAAAB)
    # (and, with unroll 2, the producer's (step | 1) % 3 in 16 bits: mul.lo by 171, shr 9). The PTX's scoped
    # inline-asm wait labels resolve per scope, so jax's warp roles read from the PTX as from the SASS.
    fp = lift_path(DATA / f"{name}.bundle" / "kernel.ptx")
    assert true_stages(name) == stages
    assert [r["name"] for r in fp.roles] == ["consumer", "producer"]
    feats = [f for f in fp.features if f.key == "pipeline.stages"]
    assert {f.role for f in feats} == {"consumer", "producer"}
    assert all(f.value == stages and "[S1 " in f.where for f in feats), [(f.role, f.value, f.where) for f in feats]


def test_mbarrier_pairs_cross_check_and_refusal():
    from mosaic.lift.inputs import parse_text
    from mosaic.lift.stages import mbarrier_pairs

    def pairs(name, file):
        path = member_path(DATA / f"{name}.bundle" / file)  # stored xz-compressed: read through the bundle
        prog = max(parse_text(path.read_text(), str(path)).values(), key=lambda p: len(p.instructions))
        return mbarrier_pairs(None, prog.instructions)

    assert pairs("pallas-jax-128x128x64-s3", "kernel.ptx") == 3
    assert pairs(CUTE, "kernel.sass") == 4
    # CUTLASS also initialises epilogue and order barriers: 22 inits for 6 stages; the rule declines
    assert pairs(COOP_C1X2, "kernel.sass") is None


def test_ptx_line_info_does_not_swallow_the_next_instruction():
    from mosaic.lift.ptx import parse_ptx

    text = (".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry k()\n{\n.reg .b64 %rd<3>;\n"
            "\tmov.b64 \t%rd1, 0;\n\t.loc\t1 184 10\n\tadd.s64 \t%rd1, %rd1, 1;\n\tret;\n}\n")
    prog = parse_ptx(text)["k"]
    assert [i.opcode for i in prog.instructions] == ["mov", "add", "ret"]


@pytest.mark.parametrize("name", SPECIALISED)
def test_cutlass_and_cute_ptx_has_loops_and_roles(name):
    # their inline-asm mbarrier waits each define LAB_WAIT/DONE inside their own { } scope; resolved per scope,
    # the PTX's loops, roles and pipeline depth read as from the SASS
    fp = lift_path(DATA / f"{name}.bundle" / "kernel.ptx")
    assert fp.get("loops.depth").value == 2
    assert {r["name"] for r in fp.roles} == {"producer", "consumer"}
    assert fp.get("roles.registers").value == {"producer": 40, "consumer": 232}
    feats = [f for f in fp.features if f.key == "pipeline.stages"]
    assert feats and all(f.value == true_stages(name) for f in feats), [(f.role, f.value, f.where) for f in feats]
    assert fp.get("persistent").value is True
    # loop.unroll counts pipeline steps per trip: CUTLASS's mainloops are CUTLASS_PRAGMA_NO_UNROLL
    if not name.startswith("cute"):
        assert fp.get("loop.unroll", "producer").value == 1 == fp.get("loop.unroll", "consumer").value


@pytest.mark.parametrize("name", (COOP_C1X2, COOP_C2X1, PINGPONG))
def test_cutlass_mainloops_are_not_unrolled(name):
    fp = lifted(name)
    assert fp.get("loop.unroll", "producer").value == 1 == fp.get("loop.unroll", "consumer").value
