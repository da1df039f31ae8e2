"""Issue 19's reverse campaign, examples/campaigns/quack-rmsnorm-to-pallas.toml (quack's CuTe DSL rmsnorm as the
reference, the Pallas rmsnorm template as the first candidate), previewed without a GPU: the TOML is valid, the
reference's language (cute) is read from the kernel file, the reference path resolves relative to the TOML, and the
Pallas start kernel (the row-wise knob class's defaults) lowers for the H200 record here. The reference lowers only
where quack-kernels (and torch) are installed; in .venv312 the preview says it cannot import quack. Nothing is
written as a campaign (no journal)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312")
ROOT = Path(__file__).resolve().parents[3]
TOML = ROOT / "examples" / "campaigns" / "quack-rmsnorm-to-pallas.toml"
QUACK = ROOT / "examples" / "kernels" / "cute" / "quack_rmsnorm.py"


def test_the_reverse_campaign_previews_here(tmp_path):
    from mosaic_target_pallas.backend import jax_has_gpu
    from mosaic_target_pallas.rowwise_knobs import RmsnormKnobs

    if jax_has_gpu():
        pytest.skip("a GPU is visible: mosaic run would start the live campaign, not the preview")
    p = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "run", str(TOML), "--quiet",
                        "--out", str(tmp_path / "camp")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    prev = json.loads((tmp_path / "camp" / "preview.json").read_text())
    c = prev["campaign"]
    assert (c["source"], c["target"], c["family"], c["dtype"]) == ("cute", "pallas", "rmsnorm", "bf16")
    assert c["shape"] == {"rows": 16384, "cols": 8192} and c["reference"] == str(QUACK) and c["start"] is None
    naive = prev["naive"]
    assert naive["status"] == "lowered", naive
    assert naive["knobs"] == attrs.asdict(RmsnormKnobs())  # the template's defaults: the knob table's origin
    from mosaic.bundle import load_bundle

    source = load_bundle(naive["bundle"]).read_text("source")
    assert "stablehlo.custom_call @mosaic_gpu" in source
    skipped = {s["step"]: s["why"] for s in prev["skipped"]}
    if importlib.util.find_spec("quack") is None:
        assert "No module named 'quack'" in skipped["reference"], skipped
    else:
        assert "reference" not in skipped and prev["reference"]["file"] == "quack_rmsnorm.py"
    assert "torch" in skipped["yardstick"]  # the family's yardstick, timed in the same run on the device
    assert not (tmp_path / "camp" / "journal.jsonl").exists()
