"""The CUTLASS (CuTe C++) attention forward captured on the GPU through `mosaic capture --lang cutlass --family attention`
(marked ``gpu``; skipped without a CUDA device, nvcc or the CUTLASS headers): the backend's ``prepare`` builds the
lowering's own translation unit, runs it through the build's shim (``backend.AttentionRunnable``) on the family's
seeded inputs in the oracle's layout, and the float64 oracle must pass for every configuration of
``tools/attention_capture_configs.txt`` (the default bf16, causal f16, GQA 2:1 causal, seq 300, P staged in shared
memory with block_n 64 and 3 stages, head_dim 64 on one 128-row consumer warpgroup) and it is timed; the launch CUPTI
saw (when it is the timer) is the one the knobs give: grid (ceil(seq / block_m), heads, batch), 128 x (1 +
consumer_warpgroups) threads, the rules' shared-memory figure. tools/attention_capture_check.sh runs the same
captures on the device in one call and prints one line each.

    python3 -m pytest -q -s -m gpu packages/target-cutlass/tests/test_attention_gpu.py
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic_target_cutlass import attention
from mosaic_target_cutlass.attention import AttentionKnobs

pytestmark = pytest.mark.gpu
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
CONFIGS = Path(__file__).resolve().parents[1] / "tools" / "attention_capture_configs.txt"


def configs() -> list[tuple[str, str, str, str]]:
    """(name, shape, knobs, dtype) of each line of the table."""
    rows = []
    for line in CONFIGS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, shape, knobs, dtype = line.split("|")
            rows.append((name, shape, knobs, dtype))
    return rows


@pytest.fixture(autouse=True)
def device(monkeypatch):
    from mosaic.gpus import probe_devices

    found, why = probe_devices()
    if not found:
        pytest.skip(f"needs a CUDA device ({why})")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    try:
        from mosaic_target_cutlass.build import cutlass_include

        cutlass_include()
    except Exception as exc:  # noqa: BLE001 -- ToolMissing or an import error: skip
        pytest.skip(f"CUTLASS headers not found: {exc}")


@pytest.mark.parametrize("name,shape,knobs,dtype", configs(), ids=[c[0] for c in configs()])
def test_capture_passes_the_oracle_and_launches_the_lowered_kernel(name, shape, knobs, dtype, tmp_path):
    from mosaic.bundle import load_bundle

    args = [a for k in knobs.split() for a in ("--knob", k)]
    bundle = tmp_path / f"{name}.bundle"
    p = subprocess.run([*MOSAIC, "capture", "--lang", "cutlass", "--family", "attention", "--shape", shape,
                        "--dtype", dtype, *args, "--runs", "5", "--blocks", "2", "--timeout", "600", "--json",
                        "-o", str(bundle)], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert p.stdout.strip().startswith("{"), (p.stdout[-3000:], p.stderr[-3000:])
    r = json.loads(p.stdout)
    s = r["summary"]
    assert r["status"] == "ok" and p.returncode == 0, (r, p.stderr[-3000:])
    assert s["numerics_pass"] is True and s["oracle"]["o"]["failures"] == 0, s
    assert s["time_ns"] > 0, s

    dims = dict(kv.split("=") for kv in shape.split(","))
    b_, seq, heads, d = (int(dims[k]) for k in ("batch", "seq", "heads", "head_dim"))
    k = AttentionKnobs(**dict(kv.split("=") for kv in knobs.split()))
    want = {"grid": list(attention.grid(k, b_, seq, heads)), "block": [k.threads, 1, 1],
            "dynamic_smem": attention.smem_bytes(k, d)}
    b = load_bundle(bundle)
    notes = json.loads(b.read_bytes("lowering.json"))["notes"]
    assert (f"launch grid={tuple(want['grid'])} block={k.threads} dynamic_smem={want['dynamic_smem']}" in notes), notes
    if s.get("launch"):  # CUPTI's record of the timed launches
        got = {key: s["launch"][key] for key in want}
        assert got == want, (got, want)
    assert "HGMMA" in (b.read_text("sass") or "")
    print(f"\ncutlass attention {name} ({dtype}, {shape}, {knobs or 'default'}): {s['time_ns'] / 1e3:.2f} us, "
          f"err/band {s['oracle']['o']['max_error_over_band']:.3f}, launch {s.get('launch')}")
