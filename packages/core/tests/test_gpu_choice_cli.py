"""`--gpu` of `mosaic run` and `mosaic capture` through the CLI, with the device probe faked
(mosaic.gpus.probe_devices): the detected device's record by default, said in the first progress line; a named record
that contradicts the device, or a device no record describes, is one error line before anything is written."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402
from test_hostile_campaigns import main, one_error  # noqa: E402

H100 = ("NVIDIA H100 80GB HBM3", (9, 0), 132)
LIVE = ["run", "--source", "pallas", "--target", "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype", "bf16"]


@pytest.fixture(autouse=True)
def hopper_records():
    from mosaic.plugins import host

    if not {"h100-sxm", "h200"} <= set(host().items("gpus")):
        pytest.skip("needs mosaic-gpu-hopper's records")


def fake_device(monkeypatch, *devices, reason=""):
    import mosaic.gpus

    monkeypatch.setattr(mosaic.gpus, "probe_devices", lambda: (list(devices), reason))


def test_run_first_progress_line_names_the_detected_record(tmp_path, monkeypatch, capsys):
    import importlib

    from mosaic.errors import BadInput

    run_cmd = importlib.import_module("mosaic.commands.run")  # the module (the package's `run` is the command)

    fake_device(monkeypatch, H100)
    seen = {}

    def bench(campaign, out, *args, **kwargs):  # stands in for the live workbench: no kernel runs here
        seen["gpu"] = campaign.gpu
        raise BadInput("stopped by the test", "bench")

    monkeypatch.setattr(run_cmd, "_live_bench", bench)
    rc, out, err = main(*LIVE, "--executor", "local", "--out", str(tmp_path / "o"))
    lines = err.strip().splitlines()
    assert rc == 2 and lines[-1] == "error: stopped by the test (bench)", err
    assert seen["gpu"] == "h100-sxm"
    assert lines[0].endswith("campaign pallas -> cute, gemm 64x64x64 bf16; gpu: h100-sxm (detected: NVIDIA H100 "
                             "80GB HBM3)"), lines[0]


def test_run_refuses_a_gpu_flag_that_contradicts_the_device(tmp_path, monkeypatch):
    fake_device(monkeypatch, H100)
    one_error(*main(*LIVE, "--gpu", "h200", "--out", str(tmp_path / "o")),
              "GPU record 'h200' is not the detected device 0 (NVIDIA H100 80GB HBM3", "record 'h100-sxm'", "(--gpu)")
    assert not (tmp_path / "o").exists()


def test_run_refuses_a_campaign_files_gpu_that_contradicts_the_device(tmp_path, monkeypatch):
    fake_device(monkeypatch, H100)
    f = tmp_path / "c.toml"
    f.write_text(rf.CAMPAIGN_TOML)  # gpu = "h200"
    one_error(*main("run", str(f), "--out", str(tmp_path / "o")), "GPU record 'h200' is not the detected device 0",
              f"gpu in {f}")
    assert not (tmp_path / "o").exists()


def test_run_on_a_device_without_a_record_names_mosaic_gpus(tmp_path, monkeypatch):
    fake_device(monkeypatch, ("NVIDIA H200", (9, 0), 60))  # a MIG slice
    one_error(*main(*LIVE, "--out", str(tmp_path / "o")), "matches no registered GPU record", "mosaic gpus")
    assert not (tmp_path / "o").exists()


def test_capture_refuses_a_contradicting_gpu_but_lowers_for_any_record(tmp_path, monkeypatch):
    fake_device(monkeypatch, H100)
    one_error(*main("capture", "--lang", "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype", "bf16",
                    "--gpu", "h200", "-o", str(tmp_path / "x.bundle")), "is not the detected device 0")
    assert not (tmp_path / "x.bundle").exists()
    # --lower-only runs nothing on the device: the named record passes, and the next check (the knob) speaks
    one_error(*main("capture", "--lang", "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype", "bf16",
                    "--gpu", "h200", "--lower-only", "--knob", "warp_drive=9", "-o", str(tmp_path / "x.bundle")),
              "unknown knob(s) warp_drive")
