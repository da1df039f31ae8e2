"""Per-round clock/power/throttle samples: nvidia-smi's CSV rows parsed (fixtures written from its documented
format), the absent-tool path (CI has no nvidia-smi), old records readable, the per-verdict summary."""

import shutil
from pathlib import Path

import pytest
from mosaic.timing.throttle import (
    NAMED_REASONS,
    PREFIXES,
    PowerSample,
    capped_rounds,
    capped_text,
    parse_row,
    query_fields,
    sample_power,
    unknown_field_error,
    visible_device,
)
from mosaic.timing.timer import TimedRuns

DATA = Path(__file__).parent / "data" / "nvidia_smi"


def rows(name: str) -> list[str]:
    return [ln for ln in (DATA / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_query_asks_the_clock_power_limit_and_every_named_reason():
    f = query_fields("clocks_event_reasons")
    assert f[:7] == ["clocks.sm", "clocks.max.sm", "clocks.mem", "temperature.gpu", "power.draw", "power.limit",
                     "enforced.power.limit"]
    assert f[7] == "clocks_event_reasons.active"
    assert {"clocks_event_reasons.sw_power_cap", "clocks_event_reasons.hw_slowdown",
            "clocks_event_reasons.sw_thermal_slowdown"} <= set(f)
    assert len(f) == 8 + len(NAMED_REASONS)
    assert query_fields("clocks_throttle_reasons")[7] == "clocks_throttle_reasons.active"
    assert PREFIXES[0] == "clocks_event_reasons"  # the new names first, the old ones as the fallback


def test_power_capped_row_under_load():
    capped, idle, both = (parse_row(r, "clocks_event_reasons", "0") for r in rows("event_reasons.csv"))
    assert capped.state == "known" and capped.reasons == ("sw_power_cap",)
    assert (capped.sm_mhz, capped.max_sm_mhz, capped.power_w, capped.enforced_power_limit_w) == (1410, 1980, 698.42, 700)
    assert capped.reasons_mask == "0x0000000000000004" and capped.power_capped and capped.slowed
    assert idle.reasons == ("gpu_idle",) and idle.power_capped is False and idle.slowed is False
    assert set(both.reasons) == {"sw_power_cap", "sw_thermal_slowdown"}
    assert (both.power_limit_w, both.enforced_power_limit_w) == (700, 650)
    j = capped.to_json()
    assert j["reasons"] == ["sw_power_cap"] and j["power_capped"] is True and j["source"].endswith("event_reasons")
    assert PowerSample.from_json(j) == capped  # a record round-trips


def test_old_driver_row_takes_the_reasons_from_the_bitmask():
    (s,) = (parse_row(r, "clocks_throttle_reasons") for r in rows("throttle_reasons.csv"))
    assert s.state == "known" and s.reasons == ("hw_power_brake_slowdown",) and s.power_capped
    assert s.power_w is None and s.sm_mhz == 1755  # [N/A] is no number, never a zero


def test_malformed_row_is_unknown_with_the_reason():
    s = parse_row("1410, 1980", "clocks_event_reasons")
    assert s.state == "unknown" and "2 value(s) for 16 field(s)" in s.reason and s.power_capped is None
    assert unknown_field_error((DATA / "errors.txt").read_text())
    assert not unknown_field_error("Unable to determine the device handle for GPU 0000:04:00.0: Unknown Error")


def test_without_nvidia_smi_the_sample_is_unknown_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no nvidia-smi (CI has none at all)
    assert shutil.which("nvidia-smi") is None
    s = sample_power()
    assert s.state == "unknown" and s.reason == "nvidia-smi not found on PATH" and s.reasons == ()
    assert capped_text([s.to_json()] * 3) == "power state unknown in 3 round(s): nvidia-smi not found on PATH"


def test_visible_device_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert visible_device() == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_device() == "0"


def test_rounds_summary_counts_capped_rounds():
    capped, idle, both = (parse_row(r, "clocks_event_reasons").to_json() for r in rows("event_reasons.csv"))
    unknown = PowerSample("unknown", "nvidia-smi: timed out").to_json()
    c = capped_rounds([capped, idle, both, unknown])
    assert (c["rounds"], c["known"], c["power_capped"], c["slowed"]) == (4, 3, 2, 2)
    assert (c["min_sm_mhz"], c["max_sm_mhz"]) == (1395, 1980)
    assert capped_text([capped, idle, both, unknown]) == "power-capped in 2 of 3 rounds (1 unknown), SM 1395-1980 MHz"
    assert capped_text([]) == "" and capped_text(None) == ""


def test_old_records_stay_readable():
    old = TimedRuns("cupti", (1, 2, 3))  # a record from before per-round samples: no "power" key
    assert "power" not in old.to_json()
    assert PowerSample.from_json(None).state == "unknown" and PowerSample.from_json({}).state == "unknown"
    new = TimedRuns("cupti", (1, 2, 3), power=parse_row(rows("event_reasons.csv")[0], "clocks_event_reasons"))
    assert new.to_json()["power"]["reasons"] == ["sw_power_cap"]
    extra = {**new.to_json()["power"], "a_field_of_a_later_version": 1}
    assert PowerSample.from_json(extra).reasons == ("sw_power_cap",)


@pytest.mark.gpu
def test_sample_on_the_device():
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi")
    s = sample_power(round_end=0.0)
    assert s.state == "known", s.reason
    assert s.sm_mhz and s.sm_mhz > 0 and s.enforced_power_limit_w and s.enforced_power_limit_w > 0
    assert s.source.startswith("nvidia-smi clocks_") and s.reasons_mask is not None
    print(s.to_json())


def test_report_names_power_capped_rounds_per_verdict():
    """The recorded CUTLASS 8192^3 journal (from before per-round samples) reads as it did; with samples in a
    timed event's gpu map its verdict row says in how many rounds the GPU was power-capped."""
    import json

    from mosaic.run.journal import read_campaign_journal
    from mosaic.run.report import build_report, to_markdown

    path = Path(__file__).parents[3] / "examples" / "h200-pallas-to-cutlass-gemm-8192" / "journal.jsonl"
    events, _ = read_campaign_journal(path)
    plain = build_report(events)
    assert not any("power" in e for e in plain["edits"]) and "power-capped" not in to_markdown(plain)
    capped, idle, _both = (parse_row(r, "clocks_event_reasons").to_json() for r in rows("event_reasons.csv"))
    timed = next(e for e in events if e["event"] == "timed")
    samples = [capped, idle, capped, capped, idle]
    events = [({**e, "gpu": {**(e.get("gpu") or {}), "power_rounds": samples}} if e is timed else e) for e in events]
    json.dumps(events)  # still a journal's JSON
    rep = build_report(events)
    row = next(e for e in rep["edits"] if e["key"] == timed["key"])
    assert row["power"] == "power-capped in 3 of 5 rounds, SM 1410-1980 MHz"
    assert "[power-capped in 3 of 5 rounds, SM 1410-1980 MHz]" in to_markdown(rep)
    assert sum("power" in e for e in rep["edits"]) == 1


def test_bundle_clocks_come_from_the_same_query_on_the_visible_device(tmp_path, monkeypatch):
    import sys

    from mosaic.timing import throttle
    from mosaic.timing.device import gpu_clocks

    row = rows("event_reasons.csv")[0]  # the power-capped row: 1410 of 1980 MHz at 698.42 W
    fake = tmp_path / "nvidia-smi"  # a stand-in for the driver's tool that answers the fixture row, logging argv
    fake.write_text(f"#!{sys.executable}\nimport sys\nopen({str(tmp_path / 'argv')!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                    f"print({row!r})\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    monkeypatch.setitem(throttle._PREFIX, "chosen", "clocks_event_reasons")
    got = gpu_clocks()
    assert got == {"sm_mhz": "1410", "mem_mhz": got["mem_mhz"], "max_sm_mhz": "1980",
                   "temperature_c": got["temperature_c"], "power_w": "698.42"} and len(got) == 5
    assert "-i 3" in (tmp_path / "argv").read_text()  # the first visible GPU, not always GPU 0
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpu_clocks() == {"error": "nvidia-smi not found on PATH"}
