"""Bad input, bundles, the CLI, and the `mosaic diff --json` contract."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import ARTIFACTS  # noqa: E402
from mosaic.bundle import save_bundle  # noqa: E402
from mosaic.cli import main  # noqa: E402
from mosaic.errors import BadInput  # noqa: E402
from mosaic.lift.ptx import parse_ptx  # noqa: E402
from mosaic.lift.sass import parse_sass  # noqa: E402
from mosaic.records import LAYERS, KernelSpec, LaunchRecord  # noqa: E402


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(list(map(str, args)))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_diff_json_contract(capsys):
    code, out, err = run(capsys, "diff", "--json", ARTIFACTS / "stages2.cubin", ARTIFACTS / "stages4.cubin")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"layers", "rows"}
    assert [layer["name"] for layer in data["layers"]] == list(LAYERS)
    assert all(isinstance(layer["distance"], float) for layer in data["layers"])
    assert data["rows"], "stages differ"
    for n, row in enumerate(data["rows"], 1):
        assert list(row) == ["rank", "layer", "key", "reference", "candidate", "edit", "where", "why", "cause", "cost"]
        assert isinstance(row["cost"], float) and row["cost"] >= 0 and isinstance(row["cause"], str)
        assert row["rank"] == n and row["edit"] in ("knob", "rewrite") and row["why"]
    assert any(r["key"] == "pipeline.stages" and r["reference"] == 2 and r["candidate"] == 4 for r in data["rows"])


def test_diff_text_puts_the_cause_first_and_lift_prints_layers(capsys):
    code, out, _ = run(capsys, "diff", ARTIFACTS / "cpasync.cubin", ARTIFACTS / "tma.cubin")
    assert code == 0
    assert "transfer.form" in out and "[cp.async]" in out and "[tma]" in out and "instruction" in out
    lines = out.splitlines()
    first = next(n for n, line in enumerate(lines) if line.lstrip().startswith("1 "))
    assert "transfer.form" in lines[first]  # the copy path is the cause; its symptoms follow it
    assert "<- barrier.ops" in out and out.index("transfer.form") < out.index("<- barrier.ops")
    code, out, _ = run(capsys, "lift", "--json", ARTIFACTS / "ws_on.cubin")
    assert code == 0
    fp = json.loads(out)
    assert set(fp["layers"]) == set(LAYERS)
    assert {r["name"] for r in fp["roles"]} == {"producer", "consumer"}
    launch = {f["key"]: f["value"] for f in fp["layers"]["launch"]}
    assert launch["block.max_threads"] == [256, 1, 1] and launch["grid"] is None  # a bare cubin has no grid


def test_occupancy_from_gpu_record_or_unknown(capsys, monkeypatch):
    code, out, _ = run(capsys, "lift", "--json", ARTIFACTS / "ws_on.cubin")
    occ = {f["key"]: f["value"] for f in json.loads(out)["layers"]["launch"]}["occupancy.warps_per_sm"]
    assert occ is None  # block size unknown from a cubin with only a launch bound: not invented
    from mosaic import plugins

    monkeypatch.setenv("MOSAIC_LOAD_PLUGINS", "")
    plugins.reset()
    code, out, err = run(capsys, "diff", "--json", ARTIFACTS / "fmad_on.cubin", ARTIFACTS / "fmad_off.cubin")
    assert code == 0 and "occupancy is unknown" in err


def _bundle(tmp_path, name, variant, *, with_sass=True, launch=None, metrics=None):
    files = {"k.cubin": ("cubin", ARTIFACTS / f"{variant}.cubin"),
             "ptxas.log": ("ptxas_log", ARTIFACTS / f"{variant}.ptxas.log"),
             "k.ptx": ("ptx", ARTIFACTS / f"{variant}.ptx")}
    if with_sass:
        files["k.sass"] = ("sass", ARTIFACTS / f"{variant}.sass")
    if launch:
        files["launch.json"] = ("launch", json.dumps(launch.to_json()))
    if metrics:
        files["metrics.json"] = ("metrics", json.dumps(metrics))
    spec = KernelSpec(family="sum", shape={"n": 4096}, dtype="f32", language="cuda")
    return save_bundle(tmp_path / f"{name}.bundle", kernel=spec, language="cuda", files=files).root


def test_bundle_lift_uses_launch_record_ptxas_log_and_metrics(tmp_path, capsys):
    lr = LaunchRecord(kernel_name="many_acc", grid=(132, 1, 1), block=(128, 1, 1), registers_per_thread=32,
                      source="cupti")
    ref = _bundle(tmp_path, "ref", "regs255", launch=attrs_evolve(lr, registers_per_thread=56))
    cand = _bundle(tmp_path, "cand", "regs32", launch=lr,
                   metrics={"smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio": 9.0,
                            "smsp__average_warp_latency_issue_stalled_lg_throttle.ratio": 4.0})
    code, out, err = run(capsys, "diff", "--json", ref, cand)
    assert code == 0, err
    rows = {r["key"]: r for r in json.loads(out)["rows"]}
    assert rows["registers"]["reference"] == 56 and rows["registers"]["candidate"] == 32
    assert rows["spills"]["candidate"]["spill_store_bytes"] == 740
    assert "stalls.top" not in rows  # metrics on one side only: absent, not compared
    code, out, _ = run(capsys, "lift", "--json", cand)
    machine = {f["key"]: f["value"] for f in json.loads(out)["layers"]["machine"]}
    assert machine["stalls.top"] == ["long_scoreboard", "lg_throttle"]
    assert machine["tensor_pipe"] is None  # absent metric stays absent
    launch = {f["key"]: f["value"] for f in json.loads(out)["layers"]["launch"]}
    assert launch["grid"] == [132, 1, 1] and launch["occupancy.warps_per_sm"] is not None


def attrs_evolve(rec, **kw):
    import attrs

    return attrs.evolve(rec, **kw)


def test_bundle_without_sass_or_cubin_is_refused(tmp_path, capsys):
    spec = KernelSpec(family="sum", shape={"n": 4096}, dtype="f32", language="cuda")
    root = save_bundle(tmp_path / "x.bundle", kernel=spec, language="cuda",
                       files={"k.ptx": ("ptx", ARTIFACTS / "stages2.ptx")}).root
    code, _, err = run(capsys, "lift", root)
    assert code == 2 and err.startswith("error: bundle has no SASS") and err.count("\n") == 1


@pytest.mark.parametrize("make", ["truncated_sass", "garbage", "png", "json", "truncated_ptx", "cut_line",
                                  "missing", "empty"])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, make):
    sass = (ARTIFACTS / "stages2.sass").read_text()
    ptx = (ARTIFACTS / "stages2.ptx").read_text()
    path = tmp_path / f"bad.{make}"
    content = {
        "truncated_sass": sass[: len(sass) // 2].rsplit("\n", 1)[0],
        "garbage": "hello world\nthis is not a kernel\n",
        "png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(64)),
        "json": '{"grid": [1, 1, 1]}',
        "truncated_ptx": ptx[: len(ptx) * 2 // 3],
        "cut_line": sass[: len(sass) // 2] + "\n",
        "empty": "",
    }.get(make)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    code, out, err = run(capsys, "diff", path, ARTIFACTS / "stages2.sass")
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_unknown_opcode_kept_as_other_counted_and_warned(tmp_path, capsys):
    sass = (ARTIFACTS / "fmad_on.sass").read_text()
    first = next(line for line in sass.splitlines() if "FMUL" in line)
    path = tmp_path / "odd.sass"
    path.write_text(sass.replace(first, first.replace("FMUL", "FROBNICATE"), 1))
    progs = parse_sass(path.read_text())
    (prog,) = progs.values()
    assert prog.unknown == {"FROBNICATE": 1}
    assert [i.opclass for i in prog.instructions if i.opcode == "FROBNICATE"] == ["other"]
    code, out, err = run(capsys, "lift", path)
    assert code == 0 and "unknown opcode" in err and "FROBNICATE×1" in err


def test_parsers_reject_what_is_not_theirs():
    with pytest.raises(BadInput, match="not a SASS listing"):
        parse_sass("/*0000*/ MOV R1, R2 ;\nrandom words here\n")
    with pytest.raises(BadInput, match="never closes"):
        parse_ptx(".version 8.0\n.target sm_90a\n.visible .entry k()\n{\n mov.u32 %r1, %tid.x;\n")
    with pytest.raises(BadInput, match="never defined"):
        parse_ptx(".version 8.0\n.target sm_90a\n.visible .entry k()\n{\n bra $L_nowhere;\n ret;\n}\n")


def test_lift_pair_in_two_processes_matches_serial(monkeypatch):
    from mosaic.lift import inputs
    from mosaic.lift.diff import diff_fingerprints

    serial = diff_fingerprints(*inputs.lift_pair(ARTIFACTS / "stages2.sass", ARTIFACTS / "stages4.sass"))
    monkeypatch.setattr(inputs, "PARALLEL_MIN_BYTES", 1)
    parallel = diff_fingerprints(*inputs.lift_pair(ARTIFACTS / "stages2.sass", ARTIFACTS / "stages4.sass"))
    assert parallel.to_json() == serial.to_json() and serial.rows
