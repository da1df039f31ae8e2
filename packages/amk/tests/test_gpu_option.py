"""`--gpu` of the `mosaic amk` commands (mosaic_amk.gpu_option over core's mosaic.gpus.resolve_gpu), with the device
probe faked: the detected device's record by default, said as the first output line; the CUDA VM's commands refuse a
named record that is not the device's, the CPU-only ones lower for it; the bench's floor names its record."""

import json

import pytest
from mosaic.cli import main

H100 = ("NVIDIA H100 80GB HBM3", (9, 0), 132)
H100_PCIE = ("NVIDIA H100 PCIe", (9, 0), 114)


@pytest.fixture(autouse=True)
def hopper_records():
    from mosaic.plugins import host

    if not {"h100-sxm", "h100-pcie", "h200"} <= set(host().items("gpus")):
        pytest.skip("needs mosaic-gpu-hopper's records")


def fake_device(monkeypatch, *devices, reason=""):
    import mosaic.gpus

    monkeypatch.setattr(mosaic.gpus, "probe_devices", lambda: (list(devices), reason))


def cli(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(["amk", *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def one_error(code, out, err, *needles):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, out, err)
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_lower_uses_the_detected_devices_record(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    fake_device(monkeypatch, H100_PCIE)  # 114 SMs, where the h200 default has 132
    out = tmp_path / "s.json"
    code, stdout, err = cli(capsys, "lower", "--model", str(tiny_checkpoint("llama")), "-o", str(out))
    assert code == 0, err
    assert err.splitlines()[0] == "gpu: h100-pcie (detected: NVIDIA H100 PCIe)"
    assert json.loads(out.read_text())["num_sms"] == 114 and stdout.startswith(f"wrote {out}")


def test_lower_without_a_gpu_says_the_default(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    fake_device(monkeypatch, reason="no CUDA device visible (test)")
    out = tmp_path / "s.json"
    code, _, err = cli(capsys, "lower", "--model", str(tiny_checkpoint("llama")), "-o", str(out))
    assert code == 0, err
    assert err.splitlines()[0] == "gpu: h200 (default; no GPU visible: no CUDA device visible (test))"
    assert json.loads(out.read_text())["num_sms"] == 132


def test_lower_for_another_record_than_the_device_is_an_offline_use(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    fake_device(monkeypatch, H100_PCIE)
    out = tmp_path / "s.json"
    code, _, err = cli(capsys, "lower", "--model", str(tiny_checkpoint("llama")), "--gpu", "h200", "-o", str(out))
    assert code == 0, err
    assert err.splitlines()[0].startswith("gpu: h200 (--gpu; not the detected NVIDIA H100 PCIe")
    assert json.loads(out.read_text())["num_sms"] == 132


def test_a_device_without_a_record_is_refused_unless_named(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    fake_device(monkeypatch, ("NVIDIA H200", (9, 0), 60))  # a MIG slice
    args = ["lower", "--model", str(tiny_checkpoint("llama")), "-o", str(tmp_path / "s.json")]
    one_error(*cli(capsys, *args), "matches no registered GPU record", "mosaic gpus", "(--gpu)")
    assert not (tmp_path / "s.json").exists()
    code, _, err = cli(capsys, *args, "--gpu", "h200")
    assert code == 0 and "matches no registered record" in err.splitlines()[0], err


@pytest.mark.parametrize("args", [
    ["bench", "--shape", "smollm2-135m", "--gpu", "h200"],
    ["generate", "--prompt-ids", "1,2", "--vm", "cuda", "--gpu", "h200"],
    ["parity", "--criterion", "bf16", "--gpu", "h200"],
    ["tune", "--vm", "cuda", "--gpu", "h200"],
])
def test_the_cuda_vm_commands_refuse_a_record_that_is_not_the_device(tiny_checkpoint, tmp_path, monkeypatch,
                                                                       capsys, args):
    fake_device(monkeypatch, H100)
    model = [] if args[0] == "bench" else ["--model", str(tiny_checkpoint("llama"))]
    out = ["-o", str(tmp_path / "t")] if args[0] == "tune" else []
    one_error(*cli(capsys, *args, *model, *out), "GPU record 'h200' is not the detected device 0 (NVIDIA H100 80GB "
              "HBM3, sm_90, 132 SMs: record 'h100-sxm')")


def test_generate_json_carries_the_record_and_its_provenance(tiny_checkpoint, monkeypatch, capsys):
    fake_device(monkeypatch, H100)
    code, out, err = cli(capsys, "generate", "--model", str(tiny_checkpoint("llama")), "--prompt-ids", "1,2",
                         "--tokens", "2", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert (got["gpu"], got["gpu_provenance"]) == ("h100-sxm", "detected: NVIDIA H100 80GB HBM3")
    assert len(got["tokens"]) == 2 and "gpu:" not in err  # the JSON says it; stderr stays quiet


def test_tune_records_the_provenance_and_resumes_on_the_journals_record(tiny_checkpoint, tmp_path, monkeypatch,
                                                                         capsys):
    fake_device(monkeypatch, reason="no CUDA device visible (test)")
    ck, out = str(tiny_checkpoint("smollm2")), tmp_path / "run"
    small = ["--vm", "reference", "--prompts", "1", "--tokens", "2", "--knobs", "wait_mode", "--max-trials", "1"]
    code, _, err = cli(capsys, "tune", "--model", ck, "-o", str(out), "--gpu", "h100-pcie", *small)
    assert code == 0, err
    assert err.splitlines()[0] == "gpu: h100-pcie (--gpu)"
    head = json.loads((out / "journal.jsonl").read_text().splitlines()[0])
    assert (head["gpu"], head["gpu_provenance"]) == ("h100-pcie", "--gpu")
    # --resume without --gpu continues on the journal's record, not the h200 default
    code, _, err = cli(capsys, "tune", "--model", ck, "-o", str(out), "--resume", *small)
    assert code == 0, err
    assert err.splitlines()[0] == f"gpu: h100-pcie (gpu of {out / 'journal.jsonl'})"


def test_bench_floor_names_the_record_and_bandwidth_it_used():
    from mosaic_amk.bench.bench import format_table

    res = {"model": "llama", "layers": 16, "hidden": 2048, "vocab": 128256, "params": 1.2e9, "gpu": "h100-sxm",
           "gpu_provenance": "detected: NVIDIA H100 80GB HBM3", "floor_ms_datasheet": 0.738,
           "floor_gbs_datasheet": 3350.0, "contenders": []}
    lines = format_table(res).splitlines()
    assert lines[0].endswith("on h100-sxm (detected: NVIDIA H100 80GB HBM3)")
    assert lines[1] == "  weight-bandwidth floor: 0.738 ms/token (h100-sxm: 3.35 TB/s datasheet)"
