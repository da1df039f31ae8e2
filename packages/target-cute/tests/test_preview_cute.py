"""`mosaic run --source pallas --target cute` without a GPU, in full: the Pallas plugin's shipped H200 reference,
the naive CuTe translation lowered here by CuTe DSL for the h200 record, the diff, the proposer's first edits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass.cute", reason="CuTe DSL (Python 3.12, .venv312)")


def test_preview_lowers_the_naive_translation_diffs_it_and_lists_first_edits(tmp_path):
    mosaic = str(Path(sys.executable).parent / "mosaic")
    done = subprocess.run([mosaic, "run", "--source", "pallas", "--target", "cute", "--family", "gemm", "--shape",
                           "4096x4096x4096", "--dtype", "bf16", "--out", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "d" / "preview.json").read_text())
    steps = [d["step"] for d in data["done"]]
    assert steps == ["campaign", "reference", "naive translation", "diff", "proposals"], data["skipped"]
    assert data["naive"]["status"] == "lowered" and Path(data["naive"]["bundle"]).is_dir()
    keys = {r["key"] for r in data["rows"]}
    # both are warp-specialised alike (jax's hopper matmul: one producer warpgroup at 40 registers, two compute
    # warpgroups at 232; the CuTe kernel: the same) and both loop over tiles: no roles or persistence row
    assert not {"roles", "roles.registers", "roles.warpgroups", "persistent"} & keys
    assert data["rows"]
    edits = [e for e in data["edits"] if e["ok"]]
    assert edits and all(e["edit"]["kind"] == "knob" for e in edits)
    assert len({e["key"] for e in edits}) == len(edits)  # distinct candidates
    assert "## First edits the 'knobs' proposer would build" in done.stdout


def test_preview_never_runs_a_campaign_files_agent_command(tmp_path):
    # a colleague's campaign.toml naming an agent: the preview shows the built-in knob walk and runs nothing
    marker = tmp_path / "ran"
    toml = tmp_path / "campaign.toml"
    toml.write_text('source = "pallas"\ntarget = "cute"\nfamily = "gemm"\nshape = "4096x4096x4096"\n'
                    'dtype = "bf16"\nproposer = "command"\n'
                    f'command = ["sh", "-c", "touch {marker}; echo \'{{\\"done\\": true}}\'"]\n')
    mosaic = str(Path(sys.executable).parent / "mosaic")
    done = subprocess.run([mosaic, "run", str(toml), "--out", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    data = json.loads((tmp_path / "d" / "preview.json").read_text())
    assert any(s["step"] == "the agent's proposals" for s in data["skipped"]), data["skipped"]
    assert [e for e in data["edits"] if e["ok"]]
    assert "## First edits the 'knobs' proposer would build" in done.stdout
