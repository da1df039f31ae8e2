"""mosaic.budget: one rule per code, all rules run, every exceeded limit a Diagnostic with the figures; checked
against the limits of mosaic-gpu-hopper's H200 record (227 KiB per block, 228 KiB per SM, 64 K registers, 1024
threads, 132 SMs, clusters of 16)."""

from __future__ import annotations

import pytest
from mosaic import budget
from mosaic.errors import CheckFailed, Diagnostic
from mosaic.records import GpuTarget

H200 = GpuTarget(name="h200", display_name="NVIDIA H200 SXM 141GB", arch="sm_90a", compute_capability=(9, 0),
                 sm_count=132, smem_per_sm=233472, smem_per_block=232448, regs_per_sm=65536, l2_bytes=62914560,
                 hbm_bandwidth_gbs=4800.0, memory_bytes=141_000_000_000, peak_bf16_tflops=989.4,
                 peak_fp8_tflops=1978.9, max_cluster_size=16, device_names=("H200",))


def codes(**kw) -> list[str]:
    return [d.code for d in budget.diagnose(budget.Footprint(where="k", **kw), H200)]


def test_a_footprint_that_fits_has_no_diagnostics():
    fits = budget.Footprint(where="gemm", smem_bytes=232448, registers=168, threads=384, cluster_size=16, sms=132)
    assert budget.diagnose(fits, H200) == []
    budget.check(fits, H200)  # no raise
    assert budget.diagnose(budget.Footprint(where="nothing known"), H200) == []  # unknown figures: rules skipped


def test_every_rule_runs_and_reports_its_figures():
    over = budget.Footprint(where="big", smem_bytes=300_000, registers=256, threads=1056, cluster_size=32, sms=133)
    found = budget.diagnose(over, H200)
    assert [d.code for d in found] == list(budget.RULES) == [
        "smem-per-block", "smem-per-sm", "regs-per-thread", "regs-per-block", "threads-per-block", "cluster-size",
        "sm-count"]
    by = {d.code: d for d in found}
    assert by["smem-per-block"] == Diagnostic("smem-per-block", "big", "<= 232448", 300_000,
                                              "300000 B of shared memory exceed h200's 232448 B per block")
    assert (by["smem-per-sm"].expected, by["smem-per-sm"].actual) == ("<= 233472", 301_024)  # + 1 KiB reserved
    assert (by["regs-per-thread"].expected, by["regs-per-thread"].actual) == ("<= 255", 256)
    assert (by["regs-per-block"].expected, by["regs-per-block"].actual) == ("<= 65536", 256 * 32 * 33)
    assert by["regs-per-block"].message == "256 registers x 1056 threads do not fit one SM"
    assert (by["threads-per-block"].actual, by["cluster-size"].actual, by["sm-count"].actual) == (1056, 32, 133)
    assert by["sm-count"].line() == "[sm-count] big: h200 has 132 SMs (expected '<= 132', got 133)"


def test_registers_are_allocated_per_warp_in_units_of_256():
    assert budget.registers_per_block(168, 384, H200) == 168 * 384  # 168 x 32 = 5376, a multiple of 256
    assert budget.registers_per_block(170, 384, H200) == 5632 * 12  # 5440 rounds up to 5632 per warp
    assert budget.registers_per_block(64, 100, H200) == 2048 * 4  # 100 threads take 4 warps
    assert codes(registers=168, threads=384) == []  # 64512 registers fit 65536
    assert codes(registers=170, threads=384) == ["regs-per-block"]  # 67584 do not, although 170 x 384 = 65280
    assert codes(registers=168, threads=512) == ["regs-per-block"]


def test_limits_are_inclusive():
    assert codes(smem_bytes=232448) == [] and codes(smem_bytes=232449) == ["smem-per-block", "smem-per-sm"]
    assert codes(registers=255, threads=32) == [] and codes(threads=1024) == [] and codes(threads=1025) == [
        "threads-per-block"]
    assert codes(cluster_size=16) == [] and codes(cluster_size=17) == ["cluster-size"]
    assert codes(sms=132) == [] and codes(sms=133) == ["sm-count"]


def test_a_caller_picks_its_rules_and_check_raises_with_all_of_them():
    over = budget.Footprint(where="cfg", smem_bytes=240_000, threads=2048)
    assert [d.code for d in budget.diagnose(over, H200, ("smem-per-block",))] == ["smem-per-block"]
    with pytest.raises(ValueError, match="unknown budget rule"):
        budget.diagnose(over, H200, ("tmem-columns",))
    with pytest.raises(CheckFailed) as err:
        budget.check(over, H200)
    assert [d.code for d in err.value.diagnostics] == ["smem-per-block", "smem-per-sm", "threads-per-block"]
    assert err.value.exit_code == 1 and str(err.value).startswith("cfg does not fit h200: 3 problem(s); first: ")


def test_footprint_figures_are_validated():
    with pytest.raises(ValueError, match="Footprint.threads=-1"):
        budget.Footprint(where="k", threads=-1)
    with pytest.raises(ValueError, match="Footprint.registers=True"):
        budget.Footprint(where="k", registers=True)


def test_the_record_here_is_the_hopper_plugins():
    pytest.importorskip("mosaic_gpu_hopper")
    from mosaic.plugins import PluginHost

    assert PluginHost(allow="hopper").load().get("gpus", "h200") == H200
