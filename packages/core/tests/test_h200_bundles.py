"""Bundles captured on the lent H200 (2026-11-30, benchmarks/gemm_capture.py), re-read on a
machine with no GPU: integrity, the oracle re-decided from stored arrays, the noise re-derived from the
stored per-run times, and lift/diff of real CUTLASS GEMM pairs."""

import json
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle, restore, verify_bundle
from mosaic.oracle import check
from mosaic.timing import measure_noise

DATA = Path(__file__).parent / "data" / "h200"
BUNDLES = sorted(DATA.glob("*.bundle"))


def mosaic(*args: str, check: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(Path(sys.executable).parent / "mosaic"), *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == check, (proc.returncode, proc.stderr[-2000:])
    return proc


def test_the_captures_are_here():
    names = {b.name for b in BUNDLES}
    assert {"coop-128x256x64-c2x1-4096.bundle", "cublas-4096.bundle", "pallas-jax-128x128x64-s4.bundle",
            "coop-128x256x64-c2x1-small.bundle"} <= names


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_every_h200_bundle_verifies(bundle):
    assert verify_bundle(bundle) == []


def test_oracle_re_decides_the_small_cutlass_capture(tmp_path):
    b = load_bundle(DATA / "coop-128x256x64-c2x1-small.bundle")
    inputs, outputs = b.arrays("inputs"), b.arrays("outputs")
    assert inputs["a"].shape == (512, 256) and outputs["c"].shape == (512, 384)
    verdict = check("gemm", inputs, outputs, "bf16")
    recorded = json.loads((b.root / "oracle.json").read_text())
    assert verdict.passed and recorded["passed"] is True
    # integer inputs: every partial sum is exact in fp32, so the check is bit-exact on every element
    assert verdict.outputs[0].exact_checked == 512 * 384
    wrong = {"c": outputs["c"].copy()}
    wrong["c"][17, 300] += 1.0  # one stale element in a bit-exact regime
    assert not check("gemm", inputs, wrong, "bf16").passed


@pytest.mark.parametrize("name", ["coop-128x256x64-c2x1-4096", "cublas-4096", "pallas-jax-128x128x64-s4"])
def test_noise_re_derived_from_the_stored_runs(name):
    timings = load_bundle(DATA / f"{name}.bundle").read_json("timings")
    assert timings["source"] == "cupti"
    blocks = [b["times_ns"] for b in timings["blocks"]]
    noise = measure_noise(blocks)
    assert noise.value == pytest.approx(timings["noise"]["value_ns"], rel=1e-9)
    # interleaved self-pairs keep the noise well under 1% although the clock drifted between blocks
    assert noise.relative < 0.01
    assert 150_000 < timings["time_ns"] < 220_000  # bf16 4096^3 on an H200: ~170-190 us


def test_cutlass_pair_diff_names_the_planted_knobs():
    out = mosaic("diff", "--json", str(DATA / "coop-128x128x64-c1x2-4096.bundle"),
                 str(DATA / "coop-128x256x64-c2x1-4096.bundle"), check=0).stdout
    rows = {(r["layer"], r["key"]): r for r in json.loads(out)["rows"]}
    assert rows[("launch", "cluster")]["reference"] == [1, 2, 1]
    assert rows[("launch", "cluster")]["candidate"] == [2, 1, 1]
    assert rows[("instruction", "mma.shape")]["candidate"] == ["m64n256k16"]
    assert rows[("launch", "cluster")]["rank"] <= 3 and rows[("launch", "cluster")]["edit"] == "knob"


def test_a_tampered_capture_is_refused(tmp_path):
    copy = tmp_path / "x.bundle"
    shutil.copytree(DATA / "cublas-4096.bundle", copy)
    assert load_bundle(copy).file("timings.json").codec == "xz"  # stored compressed; tamper with the stored stream
    t = load_bundle(copy).read_json("timings")
    t["time_ns"] *= 0.9  # a "speed-up" edited into the record, recompressed as a careful forger would
    (copy / "timings.json.xz").write_bytes(lzma.compress(json.dumps(t).encode(), format=lzma.FORMAT_XZ))
    proc = mosaic("bundle", "verify", str(copy), check=1)
    assert "timings.json.xz" in proc.stderr


def test_a_tampered_plain_capture_is_refused(tmp_path):
    copy = tmp_path / "x.bundle"
    shutil.copytree(DATA / "cublas-4096.bundle", copy)
    restore(copy, compress=False)  # every member plain, as bundles were stored before compression
    assert (copy / "timings.json").is_file() and not (copy / "timings.json.xz").exists()
    t = json.loads((copy / "timings.json").read_text())
    t["time_ns"] *= 0.9
    (copy / "timings.json").write_text(json.dumps(t))
    proc = mosaic("bundle", "verify", str(copy), check=1)
    assert "timings.json" in proc.stderr


def test_pallas_to_cute_diff_of_real_captures():
    """The port the product exists for: jax's Pallas hopper matmul (182.8 us) against the project's CuTe
    gemm (172.7 us), both captured on the H200; the Pallas SASS was assembled from jax's PTX by ptxas."""
    ref = DATA / "pallas-jax-128x128x64-s4-sass.bundle"
    cand = DATA / "cute-128x256-s4-persistent-c2x1-sw8.bundle"
    notes = (ref / "capture.log").read_text() + json.dumps(json.loads((ref / "manifest.json").read_text()))
    assert "ptxas" in notes
    rows = json.loads(mosaic("diff", "--json", str(ref), str(cand), check=0).stdout)["rows"]
    by_key = {(r["layer"], r["key"]): r for r in rows}
    assert by_key[("launch", "cluster")]["reference"] == [1, 1, 1]
    assert by_key[("launch", "cluster")]["candidate"] == [2, 1, 1]
    assert by_key[("instruction", "mma.shape")]["reference"] == ["m64n128k16"]
    assert by_key[("instruction", "mma.shape")]["candidate"] == ["m64n256k16"]
    # both are persistent (jax's nd_loop over tiles, CuTe's tile scheduler) and warp-specialised alike (one
    # producer at 40 registers, two consumers at 232): neither is a remaining difference
    assert ("control", "persistent") not in by_key and ("launch", "roles") not in by_key
    lifted = json.loads(mosaic("lift", "--json", str(ref), check=0).stdout)
    control = {f["key"]: f["value"] for f in lifted["layers"]["control"] if not f["role"]}
    assert control["persistent"] is True
    assert [r["rank"] for r in rows] == sorted(r["rank"] for r in rows)


def test_diff_text_shows_each_bundles_measured_time():
    out = mosaic("diff", str(DATA / "coop-128x128x64-c1x2-4096.bundle"),
                 str(DATA / "coop-128x256x64-c2x1-4096.bundle"), check=0).stdout.splitlines()
    t = load_bundle(DATA / "coop-128x256x64-c2x1-4096.bundle").read_json("timings")
    assert out[0].startswith("reference ") and "204.82 us (noise 0.77 us, cupti)" in out[0]
    assert f"{t['time_ns'] / 1e3:.2f} us" in out[1] and out[1].startswith("candidate ")
