"""The live workbench's device gate with the campaign's own seeds and two unseen shapes, run by a real worker
(``worker_script.py --cpu-device``: the live worker whose kernels run in jax's GPU interpreter on the CPU, timed by
the CPU's clock). The seed-0 exploit passes a gate run with seed 0 (the gate before per-campaign seeds) and is
rejected at the oracle with the campaign's seeds; the request the kernel's process reads names an inputs file,
never a seed; the hard-coded-shape exploit is rejected at an unseen shape, named; the honest control passes every
case; a template's unseen shapes stay inside its can_implement."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12): run in .venv312")
from mosaic.bundle import load_bundle  # noqa: E402
from mosaic.records import KernelSpec  # noqa: E402
from mosaic.run.campaign import Campaign  # noqa: E402
from mosaic.run.live.parent import LiveWorkbench  # noqa: E402
from mosaic.run.workbench import Kernel, candidate_key, save_kernel_bundle  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
EXPLOITS = ROOT / "packages" / "target-pallas" / "src" / "mosaic_target_pallas" / "exploits"
SCRIPT = [sys.executable, str(ROOT / "packages" / "core" / "tests" / "worker_script.py"), "--cpu-device"]
SHAPE = {"rows": 16, "cols": 256}


def _bench(tmp_path, **more) -> LiveWorkbench:
    c = Campaign.from_json({"source": "cute", "target": "pallas", "family": "softmax", "shape": "16x256",
                            "dtype": "bf16", "budget_min": 30, "yardstick": False})
    return LiveWorkbench(c, tmp_path / "camp", progress=lambda line: None, worker_argv=SCRIPT, **more)


def _gate(bench, file: str | None, knobs: dict | None = None, shape: dict | None = None):
    spec = KernelSpec(family="softmax", shape=dict(shape or SHAPE), dtype="bf16", language="pallas", knobs=knobs or {},
                      name=file or "")
    source = (EXPLOITS / file).read_text() if file else None
    k = Kernel(candidate_key(spec, source), spec, source)
    save_kernel_bundle(bench.dest(k.key), spec=spec, key=k.key, role="candidate", cost_s=1.0, gpu="h200")
    sent: list[str] = []
    real = bench.workers.serve

    def serve(request, timeout):  # what the kernel's process is sent
        sent.append(json.dumps(request))
        return real(request, timeout)

    bench.workers.serve = serve
    checked = bench._gate(k, bench.dest(k.key))
    return checked, load_bundle(bench.dest(k.key)), sent


def test_seed_zero_exploit_passes_with_seed_zero_and_fails_with_the_campaigns_seeds(tmp_path):
    old = _bench(tmp_path / "zero", gate_seeds=(0,))  # the seed the gate used before per-campaign seeds
    try:
        checked, bundle, _ = _gate(old, "seed_zero_answer.py")
    finally:
        old.close()
    # the gate's own capture (the campaign's shape, seed 0, normal: all the gate was before) passes the oracle; only
    # another distribution of the cases added with it catches the exploit
    oracle = bundle.manifest["capture"]["summary"]["oracle"]["y"]
    assert oracle["failures"] == 0 and oracle["max_error_over_band"] <= 1.0, oracle
    assert not checked.passed and " normal" not in checked.reason.split("]")[1].split(":")[0], checked.reason
    bench = _bench(tmp_path / "drawn")
    try:
        checked, bundle, sent = _gate(bench, "seed_zero_answer.py")
    finally:
        bench.close()
    seeds = bench.gate_seeds
    assert len(seeds) == 2 and 0 not in seeds
    assert not checked.passed and checked.reason == "failed the float64 oracle"  # case 0: the gate's own capture
    cap = bundle.manifest["capture"]
    assert cap["status"] == "numerics-failed" and cap["options"]["seed"] == seeds[0]
    assert json.loads(bundle.read_bytes("inputs-meta.json"))["seed"] == seeds[0]  # recorded in the campaign's bundle
    assert sent and all(str(s) not in text for s in seeds for text in sent)  # never sent to the kernel's process
    assert all('"inputs": {"path": ' in text for text in sent if '"mode": "check"' in text)


def test_hard_coded_shape_is_rejected_at_an_unseen_shape_named(tmp_path):
    bench = _bench(tmp_path)
    try:
        checked, bundle, _ = _gate(bench, "hard_coded_shape.py", shape={"rows": 8, "cols": 256})  # its own
    finally:
        bench.close()
    assert not checked.passed and checked.reason.startswith("failed the device gate: [oracle] case "), checked.reason
    assert "(unseen shape)" in checked.reason
    cases = bundle.manifest["capture"]["summary"]["gate_cases"]
    assert cases["passed"] is False and cases["first"]["stage"] == "oracle"
    record = json.loads(bundle.read_bytes("gate-device.json"))
    bad = record["plan"]["cases"][cases["first"]["case"]]
    assert bad["seen"] is False and bad["shape"] != {"rows": 8, "cols": 256}


def test_honest_kernel_file_passes_every_case_inside_its_multiple_of(tmp_path):
    bench = _bench(tmp_path)
    try:
        checked, bundle, _ = _gate(bench, "honest_softmax.py")
    finally:
        bench.close()
    assert checked.passed, checked.reason
    record = json.loads(bundle.read_bytes("gate-device.json"))
    shapes = record["plan"]["shapes"]
    assert len(shapes) == 3 and shapes[0] == SHAPE and record["missing"] == []
    for s in shapes[1:]:  # odd multiples of what the file declares (rows: block_rows=4, cols: 64), smaller
        assert s != SHAPE and s["rows"] % 4 == 0 and (s["rows"] // 4) % 2 == 1 and s["cols"] % 64 == 0
        assert s["rows"] * s["cols"] <= max(SHAPE["rows"] * SHAPE["cols"] // 4, 4096)
    assert record["verdict"]["passed"] and record["verdict"]["cases_run"] == len(record["plan"]["cases"]) - 1 == 21
    assert bundle.manifest["capture"]["summary"]["gate_cases"]["passed"] is True


def test_template_unseen_shapes_stay_inside_its_can_implement(tmp_path):
    from mosaic.plugins import host
    from mosaic_target_pallas.rowwise_knobs import can_implement

    bench = _bench(tmp_path)
    try:
        checked, bundle, _ = _gate(bench, None)
    finally:
        bench.close()
    assert checked.passed, checked.reason
    record = json.loads(bundle.read_bytes("gate-device.json"))
    assert record["domain"] == "can_implement"
    knob_cls = host().get("languages", "pallas").backend.knobs("softmax")
    for s in record["plan"]["shapes"][1:]:
        spec = KernelSpec(family="softmax", shape=s, dtype="bf16", language="pallas", knobs={})
        assert s != SHAPE and can_implement(knob_cls(), spec, host().get("gpus", "h200")) == []
