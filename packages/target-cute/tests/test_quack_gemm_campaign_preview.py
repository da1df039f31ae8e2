"""examples/campaigns/quack-gemm-to-pallas.toml (issue 19's second reverse port: quack's CuTe DSL sm_90 GEMM as the
reference, the Pallas Mosaic GPU GEMM template as the first candidate), previewed without a GPU: the TOML is
valid, the reference's language (cute) is read from the adapter kernel file and its path resolves relative to
the TOML, and each half lowers for the H200 record where its packages are: the reference (quack's kernel, wgmma)
where quack-kernels and torch are (.venv), the Pallas start kernel (the GEMM knob class's defaults) where jax
0.11.2 is (.venv312); the other half is skipped with the missing module named. No CPU environment here holds
both, and a Pallas kernel has no SASS without jax's CUDA backend, so the ranked rows come on the device, where
one interpreter holds torch, jax, CuTe DSL and quack. Nothing is written as a campaign (no journal)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle

pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl")
ROOT = Path(__file__).resolve().parents[3]
TOML = ROOT / "examples" / "campaigns" / "quack-gemm-to-pallas.toml"
QUACK = ROOT / "examples" / "kernels" / "cute" / "quack_gemm.py"


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def test_the_reverse_gemm_campaign_previews_here(tmp_path):
    if has("torch"):
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is visible: mosaic run would start the live campaign, not the preview")
    p = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "run", str(TOML), "--quiet",
                        "--out", str(tmp_path / "camp")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    prev = json.loads((tmp_path / "camp" / "preview.json").read_text())
    c = prev["campaign"]
    assert (c["source"], c["target"], c["family"], c["dtype"], c["gpu"]) == ("cute", "pallas", "gemm", "bf16", "h200")
    assert c["shape"] == {"m": 4096, "n": 4096, "k": 4096} and c["reference"] == str(QUACK) and c["start"] is None
    assert c["budget_min"] <= 8 and c["max_candidates"] >= 16
    skipped = {s["step"]: s["why"] for s in prev["skipped"]}
    if has("quack"):
        assert "reference" not in skipped, skipped
        ref = prev["reference"]
        assert ref["file"] == "quack_gemm.py" and ref["knobs"]["tile_n"] == 192
        rb = load_bundle(ref["bundle"])
        assert rb.one("source").read_bytes() == QUACK.read_bytes()
        ptx = rb.read_text("ptx")
        assert "quackgemm_default_epiGemmDefaultSm90" in ptx and "wgmma.mma_async" in ptx
    else:
        assert "No module named 'quack'" in skipped["reference"], skipped
    naive = prev["naive"]
    if has("jax") and has("mosaic_target_pallas"):
        import attrs
        from mosaic_target_pallas.knobs import GemmKnobs

        assert naive["status"] == "lowered", naive
        assert naive["knobs"] == attrs.asdict(GemmKnobs())  # the template's defaults: the knob table's origin
        assert "stablehlo.custom_call @mosaic_gpu" in load_bundle(naive["bundle"]).read_text("source")
    else:
        assert naive["status"] == "failed" and "No module named 'jax'" in naive["message"], naive
    if not (has("quack") and has("jax")):
        assert "diff and proposals" in skipped  # the ranked rows need both halves
    assert "device" in skipped["yardstick"]  # cuBLAS, timed in the same run on the device
    assert not (tmp_path / "camp" / "journal.jsonl").exists()
