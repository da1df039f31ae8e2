"""The spot-check: after a timing session, the outputs of one timed run (the candidate's last of a round drawn by
the campaign's process) go to the float64 oracle. A real worker (``worker_script.py --cpu-device``: the live worker
whose kernels run on the CPU, timed by the CPU's clock) times a gemm stand-in that is right at its first launch and
wrong at every later one: its session records the failed spot-check, the Timed says so, the offline workbench reads
it back. The loop rejects a timed candidate whose spot-check failed (re-decided from a recorded campaign whose
candidate's session records one); an honest kernel's spot-check passes. Offline re-decision reads each candidate's
own recorded inputs (their seed), the reference's only for bundles of campaigns gated with seed 0."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from mosaic.bundle import save_bundle
from mosaic.records import KernelSpec
from mosaic.run.campaign import Campaign
from mosaic.run.live.parent import LiveWorkbench
from mosaic.run.offline import OfflineWorkbench, redecide
from mosaic.run.workbench import REFERENCE, Kernel, candidate_key, save_kernel_bundle, update_bundle

HERE = Path(__file__).resolve().parent
SCRIPT = [sys.executable, str(HERE / "worker_script.py"), "--cpu-device"]
ROOT = HERE.parents[2]
SPEC = KernelSpec("gemm", {"m": 64, "n": 32, "k": 48}, "bf16", "numpy", {})


def _bench(tmp_path) -> LiveWorkbench:
    c = Campaign.from_json({"source": "pallas", "target": "cute", "family": "gemm", "shape": "64x32x48",
                            "dtype": "bf16", "budget_min": 30, "rounds": 3, "runs_per_block": 3, "yardstick": False})
    return LiveWorkbench(c, tmp_path, progress=lambda line: None, worker_argv=SCRIPT)


def _timed(tmp_path, language: str):
    bench = _bench(tmp_path)
    inc = Kernel("incumbent", SPEC)
    spec = KernelSpec("gemm", dict(SPEC.shape), "bf16", language, {})
    k = Kernel(candidate_key(spec), spec)
    save_kernel_bundle(bench.dest(k.key), spec=spec, key=k.key, role="candidate", cost_s=1.0, gpu="h200")
    try:
        t = bench.time(inc, k, 3)
    finally:
        bench.close()
    session = json.loads((bench.dest(k.key) / "timings.json").read_text())["sessions"][-1]
    return bench, k, t, session


def test_a_kernel_that_differs_when_timed_fails_the_spot_check(tmp_path):
    bench, k, t, session = _timed(tmp_path, "numpy-when-timed")
    spot = session["spot_check"]
    assert spot["passed"] is False and "outside the guard band" in spot["reason"] and 0 <= spot["round"] < 3
    assert t.spot_failed and t.to_json()["spot_check"] == spot
    assert session["inputs"] == {"seed": bench.gate_seeds[0], "values": "normal"} and 0 not in bench.gate_seeds
    save_bundle(tmp_path / "bundles" / "reference.bundle", kernel=SPEC, language="numpy", files={}, gpu="h200",
                extra={"mosaic_run": {"key": REFERENCE, "role": "reference", "build": {"ok": True}, "cost_s": 1.0}})
    again = OfflineWorkbench(tmp_path, "gemm", "bf16").time(Kernel("incumbent", SPEC), k, 3)
    assert again.spot_failed and again.spot_check == spot


def test_an_honest_kernel_passes_the_spot_check(tmp_path):
    _, _, t, session = _timed(tmp_path, "numpy")
    assert session["spot_check"]["passed"] is True and not t.spot_failed


def test_the_loop_rejects_a_timed_candidate_whose_spot_check_failed(tmp_path):
    src = tmp_path / "camp"
    shutil.copytree(ROOT / "examples" / "h200-pallas-to-cute-gemm-4096", src)
    shutil.rmtree(src / "offline", ignore_errors=True)
    events = [json.loads(line) for line in (src / "journal.jsonl").read_text().splitlines()]
    step = next(e for e in events if e["event"] == "verdict" and e["step"] == 1)
    bundle = src / "bundles" / f"cand-{step['key']}.bundle"
    timings = json.loads((bundle / "timings.json").read_text())
    for s in timings["sessions"]:
        s["spot_check"] = {"round": 1, "run": "the candidate's last timed run of that round", "passed": False,
                           "reason": "c: 1 element(s) outside the guard band"}
    update_bundle(bundle, files={"timings.json": ("timings", json.dumps(timings))})
    r = redecide(src, tmp_path / "out", quiet=True)
    verdicts = [json.loads(line) for line in (tmp_path / "out" / "journal.jsonl").read_text().splitlines()]
    got = next(e for e in verdicts if e["event"] == "verdict" and e.get("key") == step["key"])
    assert got["decision"] == "rejected" and got["reason_code"] == "numerics"
    assert got["reason"].startswith("failed the spot-check of a timed run (round 1): c: 1 element")
    assert any(f"verdict {step['seq']}" in p or step["key"] in p for p in r.problems)  # differs from the record
    timed = next(e for e in verdicts if e["event"] == "timed" and e["key"] == step["key"])
    assert timed["spot_check"]["passed"] is False  # the journal records it


def _gemm_outputs(inputs):
    from mosaic.oracle.formats import FORMATS

    return {"c": FORMATS["bf16"].round(inputs["a"].astype(np.float64) @ inputs["b"]).astype(np.float32)}


def test_offline_checks_each_candidate_against_its_own_seeded_inputs(tmp_path):
    from mosaic.families import make_inputs

    ref_inputs = make_inputs(SPEC, 0, "normal")
    save_bundle(tmp_path / "bundles" / "reference.bundle", kernel=SPEC, language="numpy", gpu="h200",
                files={"inputs.npz": ("inputs", _npz(ref_inputs))},
                extra={"mosaic_run": {"key": REFERENCE, "role": "reference", "build": {"ok": True}, "cost_s": 1.0}})
    seeded = make_inputs(SPEC, 1234567, "normal")
    keys = []
    for name, files in (
            ("own-file", {"inputs.npz": ("inputs", _npz(seeded))}),  # its own recorded inputs
            ("own-seed", {"inputs-meta.json": ("other", json.dumps({"seed": 1234567, "values": "normal"}))}),
            ("seed-zero", {})):  # a bundle of a campaign gated with seed 0: the reference's inputs
        spec = KernelSpec("gemm", dict(SPEC.shape), "bf16", "numpy", {"v": name})
        key = candidate_key(spec)
        outs = _gemm_outputs(ref_inputs if name == "seed-zero" else seeded)
        save_bundle(tmp_path / "bundles" / f"cand-{key}.bundle", kernel=spec, language="numpy", gpu="h200",
                    files={**files, "outputs.npz": ("outputs", _npz(outs))},
                    extra={"mosaic_run": {"key": key, "role": "candidate", "build": {"ok": True}, "cost_s": 1.0}})
        keys.append((key, spec))
    off = OfflineWorkbench(tmp_path, "gemm", "bf16")
    for key, spec in keys:
        k = Kernel(key, spec)
        checked = off.check(k, off.build(k), Kernel(REFERENCE, SPEC))
        assert checked.passed, (spec.knobs, checked.reason)


def _npz(arrays) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@pytest.mark.parametrize("bad", [[], [-1], ["1"], [True], [1.5]])
def test_recorded_gate_seeds_are_kept_and_a_malformed_record_is_one_error(bad):
    from mosaic.errors import BadInput
    from mosaic.gate import campaign_seeds

    assert campaign_seeds([5, 9]) == (5, 9)  # what a journal header recorded (resume)
    drawn = campaign_seeds()
    assert len(drawn) == 2 and 0 not in drawn and drawn != campaign_seeds()  # drawn afresh per campaign
    with pytest.raises(BadInput, match="gate_seeds .* must be non-negative integers"):
        campaign_seeds(bad)
