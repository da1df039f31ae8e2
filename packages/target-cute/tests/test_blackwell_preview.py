"""`mosaic run --source pallas --target cute --gpu b200` without a B200 (issue 37): the naive CuTe translation is
the tcgen05 kernel lowered here for the b200 record; the Pallas plugin ships no b200 capture, so the preview first
lowers the Pallas reference here for b200 (jax's Hopper kernel is refused by rule, and the refusal says that jax's
Blackwell matmul, kernel=jax-blackwell, cannot go to PTX without a CUDA device), then diffs against the nearest
honest reference: the plugin's shipped H200 capture of the same problem, said to be a stand-in, its H200 time not
shown as the B200's. The diff's first rows are the generational differences; the proposer's first edits follow. A
source whose kernel lowers here for b200 (CuTe) is lowered here as the reference itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass.cute", reason="CuTe DSL (Python 3.12, .venv312)")
pytest.importorskip("mosaic_gpu_blackwell")


def _run(tmp_path, *args):
    mosaic = str(Path(sys.executable).parent / "mosaic")
    done = subprocess.run([mosaic, "run", "--family", "gemm", "--dtype", "bf16", "--gpu", "b200", "--quiet",
                           "--out", str(tmp_path / "d"), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((tmp_path / "d" / "preview.json").read_text())


def test_pallas_to_cute_on_b200_diffs_against_a_said_stand_in_and_proposes(tmp_path):
    data = _run(tmp_path, "--source", "pallas", "--target", "cute", "--shape", "4096x4096x4096")
    done, skipped = ({d["step"]: d["what"] for d in data["done"]}, {s["step"]: s["why"] for s in data["skipped"]})
    assert list(done) == ["campaign", "reference stand-in", "naive translation", "diff", "proposals"], skipped
    why = skipped["reference"]
    assert "no capture of pallas gemm 4096x4096x4096 bf16 on b200" in why and "lowering pallas's kernel here" in why
    if "PALLAS-ARCH-WGMMA" in why:  # jax here (.venv312): the rule, and why jax's Blackwell matmul is not used
        assert "kernel=jax-blackwell is jax's blackwell_matmul_mgpu" in why and "cannot lower to PTX here" in why
    assert "\n" not in why
    assert "shipped capture on h200 (sm_90a" in done["reference stand-in"] and "not this GPU's" in done["reference stand-in"]
    ref = data["reference"]
    assert ref["stand_in"] and ref["gpu"] == "h200" and ref["recorded_time_ns"] is None
    assert data["naive"]["status"] == "lowered"
    rows = {r["key"]: r for r in data["rows"]}
    assert data["rows"][0]["key"] == "mma.form" and (rows["mma.form"]["reference"], rows["mma.form"]["candidate"]) \
        == (["wgmma"], ["tcgen05"])
    assert rows["mma.accumulator"]["candidate"] == ["tmem"] and "alloc" in rows["tmem.ops"]["candidate"]
    edits = [e for e in data["edits"] if e["ok"]]
    assert edits and all(e["edit"]["kind"] == "knob" for e in edits)
    md = (tmp_path / "d" / "preview.md").read_text()
    assert "**reference stand-in**" in md and "## First edits" in md


def test_a_source_that_lowers_for_b200_here_is_the_reference(tmp_path):
    data = _run(tmp_path, "--source", "cute", "--target", "cute", "--shape", "1024x1024x512")
    done = {d["step"]: d["what"] for d in data["done"]}
    assert "cute's kernel lowered here for b200" in done["reference"], data["skipped"]
    assert data["reference"]["lowered_here"] and data["reference"]["recorded_time_ns"] is None
    assert "diff" in done and "reference stand-in" not in done
