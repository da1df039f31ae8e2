"""A campaign's numerics gate starts on the CPU for Pallas kernel files: `mosaic run ... --start FILE` without a GPU
runs the start file through the gate's CPU stage (mosaic.gate.cpu_stage: jax's GPU interpreter with its race
detector, 3 shapes x 2 drawn seeds x every distribution, in a child process) before anything the device does. The
honest softmax passes; the planted racy one is rejected by the interpreter with the stage and case named."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312")
ROOT = Path(__file__).resolve().parents[3]
EXPLOITS = ROOT / "packages" / "target-pallas" / "src" / "mosaic_target_pallas" / "exploits"
QUACK = ROOT / "examples" / "kernels" / "cute" / "quack_softmax.py"


def _preview(tmp_path, start: str) -> dict:
    from mosaic_target_pallas.backend import jax_has_gpu

    if jax_has_gpu():
        pytest.skip("a GPU is visible: mosaic run would start the live campaign, not the preview")
    out = tmp_path / "camp"
    p = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "run", "--source", "cute",
                        "--target", "pallas", "--family", "softmax", "--shape", "8x256", "--dtype", "bf16",
                        "--reference", str(QUACK), "--start", str(EXPLOITS / start), "--quiet", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert not (out / "journal.jsonl").exists()
    prev = json.loads((out / "preview.json").read_text())
    assert prev["naive"]["status"] == "lowered", prev["naive"]
    return prev


def test_honest_start_file_passes_the_cpu_gate(tmp_path):
    prev = _preview(tmp_path, "honest_softmax.py")
    gate = prev["gate"]
    assert gate["passed"] and gate["cases_run"] == 30, gate["reason"]
    assert len(gate["plan"]["shapes"]) == 3 and 0 not in gate["plan"]["seeds"]
    done = {d["step"]: d["what"] for d in prev["done"]}
    assert done["numerics gate on the CPU"].startswith("passed 30 cases")


def test_racy_start_file_is_rejected_by_the_interpreter(tmp_path):
    prev = _preview(tmp_path, "racy_store.py")
    gate = prev["gate"]
    assert not gate["passed"] and gate["findings"][0]["stage"] == "race", gate
    done = {d["step"]: d["what"] for d in prev["done"]}
    assert done["numerics gate on the CPU"].startswith("REJECTED [race]")
    assert "[race]" in (tmp_path / "camp" / "preview.md").read_text()


def _live_cpu_gate(tmp_path, start: str):
    """The live workbench's CPU stage (LiveWorkbench._cpu_gate) on a candidate (a source file, or None: the
    template at its default knobs), with a lowered bundle to record into; the rest of the live workbench needs a
    GPU."""
    from mosaic.bundle import load_bundle, save_bundle
    from mosaic.records import KernelSpec
    from mosaic.run.campaign import Campaign
    from mosaic.run.live.parent import LiveWorkbench
    from mosaic.run.workbench import Kernel

    camp = tmp_path / "camp"
    (camp / "bundles" / "reference.bundle").mkdir(parents=True)
    (camp / "journal.jsonl").write_text('{"event": "header"}\n')
    spec = KernelSpec(family="softmax", shape={"rows": 16384, "cols": 8192}, dtype="bf16", language="pallas",
                      knobs={}, name=start or "")
    dest = camp / "bundles" / "cand-x.bundle"
    save_bundle(dest, kernel=spec, language="pallas", files={"build.log": ("log", "lowered")}, gpu="h200",
                extra={"mosaic_run": {"key": "x", "cost_s": 1.0}})
    lines: list[str] = []
    c = Campaign.from_json({"source": "cute", "target": "pallas", "family": "softmax", "shape": "16384x8192",
                            "dtype": "bf16"})
    bench = LiveWorkbench(c, camp, progress=lines.append)
    try:
        checked = bench._cpu_gate(Kernel("x", spec, (EXPLOITS / start).read_text() if start else None), dest)
    finally:
        bench.close()
    return checked, load_bundle(dest), lines


def test_live_campaign_rejects_a_racy_candidate_before_the_device(tmp_path):
    checked, bundle, lines = _live_cpu_gate(tmp_path, "racy_store.py")
    assert checked is not None and not checked.passed and "[race]" in checked.reason, checked
    cap = bundle.manifest["capture"]
    assert cap["status"] == "numerics-failed" and cap["summary"]["numerics_pass"] is False
    assert json.loads(bundle.read_bytes("gate-cpu.json"))["findings"][0]["stage"] == "race"
    assert any("CPU stage first" in ln for ln in lines)


def test_live_campaign_sends_an_honest_candidate_on_to_the_device_gate(tmp_path):
    checked, bundle, _ = _live_cpu_gate(tmp_path, "honest_softmax.py")
    assert checked is None  # passed here: the device's gate runs next
    assert json.loads(bundle.read_bytes("gate-cpu.json"))["passed"] is True
    assert bundle.manifest["mosaic_run"]["cost_s"] > 1.0  # the stage's seconds are counted


def test_live_campaign_runs_a_template_candidate_through_the_cpu_stage(tmp_path):
    """A knob (template) candidate of a template the interpreter runs (the rowwise softmax) meets the CPU stage as a
    source candidate does: three shapes inside its can_implement x two drawn seeds x every distribution."""
    from mosaic.plugins import host
    from mosaic.records import KernelSpec
    from mosaic_target_pallas.rowwise_knobs import can_implement

    checked, bundle, lines = _live_cpu_gate(tmp_path, None)
    assert checked is None  # passed here: the device's gate runs next
    v = json.loads(bundle.read_bytes("gate-cpu.json"))
    assert v["passed"] is True and v["cases_run"] == 30, v["reason"]
    plan = v["plan"]
    assert len(plan["shapes"]) == 3 and 0 not in plan["seeds"]
    knob_cls = host().get("languages", "pallas").backend.knobs("softmax")
    for s in plan["shapes"]:
        spec = KernelSpec(family="softmax", shape=s, dtype="bf16", language="pallas", knobs={})
        assert can_implement(knob_cls(), spec, host().get("gpus", "h200")) == []
    assert any("template in the interpreter" in ln for ln in lines)
