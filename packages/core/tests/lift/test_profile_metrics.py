"""The machine layer from Nsight Compute metrics stored in a bundle (``capture --profile``): lifting reads
``profile.json`` and not a capture's other metrics-role files; ``capture --profile`` refuses what it cannot do
with one line. The profile of a real H200 capture: test_profile_h200.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _corpus import ARTIFACTS  # noqa: E402
from mosaic.bundle import add_files, load_bundle, save_bundle  # noqa: E402
from mosaic.cli import main  # noqa: E402
from mosaic.lift.resources import stall_top  # noqa: E402
from mosaic.records import KernelSpec  # noqa: E402

SPEC = KernelSpec(family="sum", shape={"n": 4096}, dtype="f32", language="cuda")
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(list(map(str, args)))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _captured(tmp_path, name, metrics=None):
    """A bundle laid out as a capture writes it: lowering.json and oracle.json (role metrics) beside the SASS."""
    files = {"kernel.sass": ("sass", ARTIFACTS / "regs32.sass"), "kernel.cubin": ("cubin", ARTIFACTS / "regs32.cubin"),
             "lowering.json": ("metrics", json.dumps({"kernel_name": "many_acc", "resources": {"registers": 32}})),
             "oracle.json": ("metrics", json.dumps({"passed": True, "max_abs_error": 0.5}))}
    root = save_bundle(tmp_path / f"{name}.bundle", kernel=SPEC, language="cuda", files=files,
                       extra={"capture": {"status": "ok"}}).root
    if metrics is not None:
        add_files(root, {"profile.json": ("profile", json.dumps({"tool": "ncu", "kernel": "many_acc",
                                                                  "metrics": metrics}))})
    return root


def _machine(capsys, bundle) -> dict:
    code, out, err = run(capsys, "lift", "--json", bundle)
    assert code == 0, err
    return {f["key"]: f["value"] for f in json.loads(out)["layers"]["machine"]}


def test_add_files_keeps_every_file_and_manifest_key(tmp_path):
    root = _captured(tmp_path, "a")
    before = load_bundle(root)
    add_files(root, {"profile.json": ("profile", "{}")})
    after = load_bundle(root)
    assert {f.path for f in after.files} == {f.path for f in before.files} | {"profile.json"}
    assert after.manifest["capture"] == {"status": "ok"} and after.kernel == before.kernel


def test_profile_metrics_become_machine_features(tmp_path, capsys):
    metrics = {STALL.format("long_scoreboard"): 7.5, STALL.format("barrier"): 2.0, STALL.format("wait"): 3.0,
               STALL.format("long_scoreboard_not_issued"): 99.0,
               "smsp__pcsamp_warps_issue_stalled_math_pipe_throttle": 1e6,  # another unit: not mixed in
               "dram__throughput.avg.pct_of_peak_sustained_elapsed": 81.25,
               "sm__warps_active.avg.pct_of_peak_sustained_active": 45.0, "lts__t_sector_hit_rate.pct": 63.0}
    m = _machine(capsys, _captured(tmp_path, "p", metrics))
    assert m["stalls.top"] == ["long_scoreboard", "wait", "barrier"]
    assert m["memory_throughput"] == 81.2 and m["occupancy.achieved"] == 45.0 and m["l2.hit_rate"] == 63.0
    assert m["tensor_pipe"] is None  # not in the profile: unknown, not zero


def test_a_captures_lowering_and_oracle_files_are_not_metrics(tmp_path, capsys):
    m = _machine(capsys, _captured(tmp_path, "plain"))
    assert m["stalls.top"] is None and m["memory_throughput"] is None and m["occupancy.achieved"] is None


def test_profiles_that_differ_give_machine_rows(tmp_path, capsys):
    a = _captured(tmp_path, "a", {STALL.format("long_scoreboard"): 9.0, STALL.format("barrier"): 1.0,
                                  "lts__t_sector_hit_rate.pct": 90.0})
    b = _captured(tmp_path, "b", {STALL.format("barrier"): 9.0, STALL.format("long_scoreboard"): 1.0,
                                  "lts__t_sector_hit_rate.pct": 40.0})
    code, out, err = run(capsys, "diff", "--json", a, b)
    assert code == 0, err
    rows = {r["key"]: r for r in json.loads(out)["rows"] if r["layer"] == "machine"}
    assert rows["stalls.top"]["reference"] == "long_scoreboard barrier" and rows["stalls.top"]["candidate"] == "barrier long_scoreboard"
    assert rows["l2.hit_rate"]["reference"] == 90.0 and rows["l2.hit_rate"]["candidate"] == 40.0
    code, out, err = run(capsys, "diff", "--json", a, a)
    assert code == 0 and not json.loads(out)["rows"]


def test_stall_top_uses_one_metric_family():
    assert stall_top({"smsp__pcsamp_warps_issue_stalled_barrier": 10.0,
                      "smsp__pcsamp_warps_issue_stalled_wait": 30.0}) == ["wait", "barrier"]
    assert stall_top({"sm__warps_active.avg.pct_of_peak_sustained_active": 1.0}) is None


@pytest.mark.parametrize("args, needle", [
    (["--lower-only"], "cannot go with --lower-only"),
    ([], "MOSAIC_NCU does not name an executable file"),
])
def test_capture_profile_refusals_are_one_line(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.setenv("MOSAIC_NCU", str(tmp_path / "no-ncu"))
    code, out, err = run(capsys, "capture", "--lang", "cutlass", "--family", "gemm", "--shape", "128x128x64",
                         "--dtype", "bf16", "-o", tmp_path / "x.bundle", "--profile", *args)
    assert code == 2 and needle in err and err.count("\n") == 1 and not (tmp_path / "x.bundle").exists()


# -- real Nsight Compute output: the H200 captures of 2026-12-02 (results/2026-12-02/session9/A/profile) ----------
H200 = Path(__file__).resolve().parents[1] / "data" / "h200"
RESULTS = Path(__file__).resolve().parents[4] / "results" / "2026-12-02" / "session9" / "A" / "profile"


def _csv(name: str) -> str:
    import lzma

    return lzma.decompress((H200 / "profile" / f"{name}-gemm-4096.profile.csv.xz").read_bytes()).decode()


def test_real_ncu_csv_picks_the_lowered_kernel_by_name_beside_the_runtimes_own_launch():
    from mosaic.profile import parse_raw_csv

    lowered = json.loads((RESULTS / "cute-gemm-4096.bundle" / "lowering.json").read_text())["kernel_name"]
    cute = parse_raw_csv(_csv("cute"), lowered)
    assert cute.picked_by == "name" and len(cute.kernels) == 2  # torch's own elementwise launch shared the range
    assert any(k["name"].startswith("_ZN2at6native") for k in cute.kernels)
    pallas = parse_raw_csv(_csv("pallas"), "pallas_gemm_jax-hopper")  # jax names it anonymous_mosaic_gpu_kernel
    assert pallas.picked_by == "duration" and pallas.kernel == "anonymous_mosaic_gpu_kernel"
    for prof in (cute, pallas):
        assert all(v == v and abs(v) != float("inf") for v in prof.metrics.values())  # ncu's nan left out
        assert 150_000 < prof.metrics["gpu__time_duration.sum"] < 300_000  # ns: the 4096^3 GEMM, ~180-211 us
        assert stall_top(prof.metrics)


def test_a_bundle_profiled_on_the_h200_lifts_into_machine_rows_here(capsys):
    m = _machine(capsys, H200 / "pallas-gemm-4096-profiled.bundle")
    assert m["stalls.top"] == ["barrier", "long_scoreboard", "wait"]
    assert m["tensor_pipe"] == 94.3 and m["memory_throughput"] == 23.3
    assert m["occupancy.achieved"] == 18.7 and m["l2.hit_rate"] == 73.5
