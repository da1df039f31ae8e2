"""CUTLASS Blackwell GEMM (issue 37): the Sm100 collective-builder template (tcgen05.mma into TMEM, 1SM and 2SM
schedules) built by nvcc for sm_100a on the CPU. Each configuration's cubin is sm_100a, its SASS holds the
tcgen05-era opcodes (UTC*: read with cuobjdump -sass), and its ptxas resources are printed (pytest -s);
configurations the rules refuse are recorded with their rule code, not dropped. Builds are cached by source hash
(the first run compiles each, about a minute apiece on 2 cores)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from mosaic.backend import Unbuildable
from mosaic.records import KernelSpec

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (the CUTLASS build needs it)")

BUILDABLE = (
    {"kernel_schedule": "sm100-1sm", "tile_m": 128, "tile_n": 128, "tile_k": 64},
    {"kernel_schedule": "sm100-2sm", "tile_m": 256, "tile_n": 128, "tile_k": 64, "cluster_m": 2},
    {"kernel_schedule": "sm100-1sm", "tile_m": 128, "tile_n": 256, "tile_k": 64, "cluster_m": 2, "stages": 4},
    {"kernel_schedule": "sm100-2sm", "tile_m": 256, "tile_n": 256, "tile_k": 64, "cluster_m": 2, "cluster_n": 2},
    {"kernel_schedule": "sm100-1sm", "tile_m": 64, "tile_n": 128, "tile_k": 128, "cluster_n": 2},
)
REFUSED = (  # (knobs, the rule that refuses them)
    ({"kernel_schedule": "sm100-2sm", "tile_m": 256, "tile_n": 128}, "CUTLASS-SM100-2SM-CLUSTER"),
    ({"kernel_schedule": "sm100-1sm", "tile_m": 256, "tile_n": 128}, "CUTLASS-SM100-MMA-M"),
    ({"kernel_schedule": "sm100-2sm", "tile_m": 128, "tile_n": 48, "cluster_m": 2}, "CUTLASS-SM100-MMA-N"),
    ({"kernel_schedule": "sm100-1sm", "tile_m": 128, "tile_n": 256, "tile_k": 128, "stages": 6}, "CUTLASS-SMEM"),
    ({"kernel_schedule": "sm100-2sm", "tile_m": 256, "cluster_m": 2, "cluster_n": 2, "tile_scheduler": "stream-k"},
     "CUTLASS-SM100-STREAMK"),
)


def _have_headers() -> bool:
    try:
        from mosaic_target_cutlass.build import cutlass_include

        inc, _ = cutlass_include()
    except Exception:  # noqa: BLE001 -- ToolMissing or an import error: skip
        return False
    return (inc / "cutlass" / "gemm" / "collective" / "builders" / "sm100_umma_builder.inl").is_file()


needs_headers = pytest.mark.skipif(not _have_headers(), reason="CUTLASS headers with the sm100 builders not found")


@pytest.fixture(scope="module")
def b200():
    from mosaic.plugins import PluginHost

    return PluginHost(allow="blackwell,hopper").load().get("gpus", "b200")


def _spec(knobs):
    return KernelSpec(family="gemm", shape={"m": 4096, "n": 4096, "k": 4096}, dtype="bf16", language="cutlass",
                      knobs=knobs, name="g")


@needs_headers
@pytest.mark.parametrize("knobs", BUILDABLE, ids=lambda k: "-".join(str(v) for v in k.values()))
def test_builds_for_sm100a(knobs, b200, tmp_path):
    from mosaic.toolchain.tools import find_tool
    from mosaic_target_cutlass.backend import CutlassBackend

    low = CutlassBackend().lower(_spec(knobs), b200, tmp_path)
    r = low.resources
    print(f"\nCUTLASS sm100 {knobs}: {r.registers} registers, spills {r.spill_stores}/{r.spill_loads} B, stack "
          f"{r.stack_frame} B; {[n for n in low.notes if 'smem' in n or 'stages' in n]}")
    log = low.ptxas_log.read_text()
    assert "Compiling entry function" in log and "'sm_100a'" in log
    assert r.registers and r.registers <= 255 and not r.spill_stores
    tool = find_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not found")
    sass = subprocess.run([tool, "--dump-sass", str(low.cubin)], capture_output=True, text=True, timeout=300).stdout
    assert re.search(r"\.target\s+sm_100a\b", sass) and "EF_CUDA_SM100" in sass
    ops = set(re.findall(r"\b(UTC[A-Z0-9]*)", sass))
    assert any("MMA" in o for o in ops), ops  # tcgen05.mma
    assert len(ops) >= 2, ops  # with the TMEM/commit family
    print(f"  tcgen05-era SASS opcodes: {sorted(ops)}")
    if knobs["kernel_schedule"] == "sm100-2sm":
        assert re.search(r"UTC\w*MMA\S*2CTA", sass), "a 2SM schedule issues 2-CTA MMAs"


@pytest.mark.parametrize("knobs,rule", REFUSED, ids=[r for _, r in REFUSED])
def test_unbuildable_recorded_by_rule(knobs, rule, b200):
    from mosaic_target_cutlass import blackwell
    from mosaic_target_cutlass.backend import CutlassBackend

    found = blackwell.problems(blackwell.BlackwellGemmKnobs(**knobs), _spec(knobs), b200)
    assert rule in {d.code for d in found}, found
    with pytest.raises(Unbuildable, match=rule):
        CutlassBackend().source(_spec(knobs), b200)
    print(f"\nrefused {knobs}: {'; '.join(d.line() for d in found)}")


def test_rules_are_data():
    from mosaic_target_cutlass import blackwell

    codes = [r.code for r in blackwell.RULES]
    assert len(codes) == len(set(codes)) and all(r.reason and r.fields for r in blackwell.RULES)


def test_hopper_record_refuses_sm100_schedule():
    from mosaic.plugins import PluginHost
    from mosaic_target_cutlass.backend import CutlassBackend

    h200 = PluginHost(allow="hopper").load().get("gpus", "h200")
    with pytest.raises(Unbuildable, match="CUTLASS-SM100-SCHEDULE"):
        CutlassBackend().source(_spec({"kernel_schedule": "sm100-1sm", "epilogue_schedule": "auto"}), h200)


@needs_headers
@pytest.mark.parametrize("knobs", BUILDABLE[:2], ids=["1sm", "2sm"])
def test_lift_gives_tcgen05_rows(knobs, b200, tmp_path):
    """`mosaic lift` of the sm_100a cubin: the tcgen05-era rows (the MMA from TMEM, its CTA group, the TMEM
    protocol, commits to mbarriers), and no opcode left unknown (the tile scheduler's UGETNEXTWORKID included)."""
    from mosaic.lift.inputs import lift_path
    from mosaic_target_cutlass.backend import CutlassBackend

    low = CutlassBackend().lower(_spec(knobs), b200, tmp_path)
    fp = lift_path(low.cubin, gpu=b200)
    value = {f.key: f.value for f in fp.layer("instruction") if not f.where.startswith("role")}
    assert value["mma.form"] == ["tcgen05"] and value["mma.accumulator"] == ["tmem"]
    assert value["mma.types"] == ["kind::f16"]
    assert value["mma.cta_group"] == ([2] if knobs["kernel_schedule"] == "sm100-2sm" else [1])
    assert value["tmem.ops"] == ["alloc", "commit", "dealloc", "ld"]
    assert "tcgen05.commit" in value["barrier.ops"] and "wgmma.sync" not in value["barrier.ops"]
    assert value["transfer.form"] == ["tma"] and value["transfer.store_form"] == ["tma"]
    assert not any("unknown opcode" in w for w in fp.warnings), fp.warnings
