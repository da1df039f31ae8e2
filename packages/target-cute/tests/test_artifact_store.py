"""Compile once (mosaic_target_cute.artifact_store): the lowering keeps its compiled function; a fresh process
loads it with no GPU; the bundle is the same with and without the store; a missing artifact, one built by
another CuTe DSL version, or a changed one (discarded, never linked in) is refused with its reason. The
``gpu`` test: the worker's ``prepare()`` runs the loaded artifact, with the same output bits and the same
cubin as a compile in the worker."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from mosaic.bundle import load_bundle
from mosaic.plugins import PluginHost
from mosaic.records import KernelSpec

pytest.importorskip("cutlass.cute",
                    reason="needs nvidia-cutlass-dsl (Python >= 3.12): run in .venv312 (make test does)")

from mosaic_target_cute import artifact_store  # noqa: E402
from mosaic_target_cute.backend import CuteBackend  # noqa: E402
from mosaic_target_cute.knobs import GemmKnobs  # noqa: E402

SHAPE = {"m": 4096, "n": 4096, "k": 4096}


@pytest.fixture(scope="module")
def h200():
    return PluginHost(allow="hopper").load().get("gpus", "h200")


def _spec(**knobs):
    return KernelSpec(family="gemm", shape=SHAPE, dtype="bf16", language="cute", knobs=knobs, name="g")


def _key(h200, **knobs):
    return artifact_store.artifact_key(artifact_store.key_inputs(GemmKnobs(**knobs), 4096, 4096, 4096, "bf16",
                                                                 h200.arch, h200.sm_count, False))


def _note(low, name):
    return next(n.split("=", 1)[1] for n in low.notes if n.startswith(f"{name}="))


def test_key_is_the_built_configuration(h200):
    assert _key(h200) == _key(h200, stages=4, tile_mn=[128, 128])  # defaults spelled out: the same build
    others = {_key(h200, stages=3), _key(h200, persistent=True), _key(h200, kernel="naive")}
    assert _key(h200) not in others and len(others) == 3
    inputs = artifact_store.key_inputs(GemmKnobs(), 4096, 4096, 2048, "bf16", h200.arch, h200.sm_count, False)
    assert artifact_store.artifact_key(inputs) != _key(h200)


def test_lowering_keeps_an_artifact_a_fresh_process_loads_without_a_gpu(tmp_path, h200, monkeypatch):
    monkeypatch.setenv(artifact_store.ENV, str(tmp_path / "store"))
    low = CuteBackend().lower(_spec(), h200, tmp_path / "lower")
    key = _key(h200)
    assert _note(low, "artifact") == key[:12]
    entry = tmp_path / "store" / key
    cubin = low.cubin.read_bytes()
    assert (entry / "kernel.cubin").read_bytes() == cubin
    assert cubin in (entry / "kernel.o").read_bytes()  # the object file carries the very cubin the bundle holds
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["nvidia-cutlass-dsl"] == artifact_store.dsl_version() and manifest["key"] == key
    code = (
        "import json, sys\n"
        "from mosaic_target_cute import artifact_store\n"
        "from mosaic.toolchain.cubin import read_cubin\n"
        "got = artifact_store.load(sys.argv[1])\n"
        "if isinstance(got, str): raise SystemExit(got)\n"
        "main = max(read_cubin(got.build.cubin.read_bytes()), key=lambda k: k.code_bytes)\n"
        "print(json.dumps({'type': type(got.function).__name__, 'registers': main.registers,"
        " 'build_registers': got.build.registers, 'dynamic_smem': got.build.dynamic_smem,"
        " 'threads': got.build.threads, 'kernel': got.build.kernel_name}))\n")
    env = {"MOSAIC_CUTE_ARTIFACTS": str(tmp_path / "store"), "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, "-c", code, key], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["type"].endswith("JitCompiledFunction")
    assert got["registers"] == got["build_registers"] == low.resources.registers and got["kernel"] == low.kernel_name
    assert got["dynamic_smem"] == int(_note(low, "dynamic_smem")) > 0
    assert got["threads"] == int(_note(low, "threads"))


def test_bundle_is_the_same_with_and_without_the_store(tmp_path, h200, monkeypatch):
    from mosaic.capture import CaptureOptions, capture_in_process

    spec = _spec(stages=3)
    bundles = {}
    for mode, value in (("off", "off"), ("on", str(tmp_path / "store"))):
        monkeypatch.setenv(artifact_store.ENV, value)
        r = capture_in_process(spec, "h200", tmp_path / f"{mode}.bundle", CaptureOptions(lower_only=True))
        assert r.status == "lowered", r
        bundles[mode] = r.bundle
    assert (tmp_path / "store" / _key(h200, stages=3) / "kernel.o").is_file()
    stored = {m: load_bundle(bundles[m]) for m in bundles}
    assert all(f in stored[m].manifest["files"] for m in bundles for f in ("kernel.cubin", "kernel.ptx"))
    def steady_log(path):  # ptxas -v's own 'Compile time = N ms' line varies run to run
        return [ln for ln in path.read_text().splitlines() if "Compile time" not in ln]

    for name in ("kernel.cubin", "kernel.ptx", "kernel.sass", "ptxas.log"):
        has = {m: name in stored[m].manifest["files"] for m in bundles}
        assert has["off"] == has["on"], name
        if has["off"] and name == "ptxas.log":
            assert steady_log(stored["off"].path(name)) == steady_log(stored["on"].path(name))
        elif has["off"]:
            assert stored["off"].path(name).read_bytes() == stored["on"].path(name).read_bytes(), name
    low = {m: json.loads((bundles[m] / "lowering.json").read_text()) for m in bundles}
    assert low["off"]["resources"] == low["on"]["resources"] and low["off"]["kernel_name"] == low["on"]["kernel_name"]

    def steady(notes):
        return [n for n in notes if not n.startswith(("compile_seconds=", "artifact="))]

    assert steady(low["off"]["notes"]) == steady(low["on"]["notes"])
    assert "artifact=off" in low["off"]["notes"] and f"artifact={_key(h200, stages=3)[:12]}" in low["on"]["notes"]


def test_load_refuses_a_missing_a_foreign_or_a_broken_artifact(tmp_path, h200, monkeypatch):
    monkeypatch.setenv(artifact_store.ENV, str(tmp_path / "store"))
    key = _key(h200, kernel="naive")
    assert artifact_store.load(key).startswith(f"no artifact {key[:12]}")
    CuteBackend().lower(_spec(kernel="naive"), h200, tmp_path / "lower")
    assert isinstance(artifact_store.load(key), artifact_store.Loaded)
    mpath = tmp_path / "store" / key / "manifest.json"
    manifest = json.loads(mpath.read_text())
    mpath.write_text(json.dumps({**manifest, "nvidia-cutlass-dsl": "4.7.0"}))
    why = artifact_store.load(key)
    assert why == f"artifact {key[:12]} was built by CuTe DSL 4.7.0, this is {artifact_store.dsl_version()}"
    mpath.write_text(json.dumps({**manifest, "runtime": "cu99"}))
    assert artifact_store.load(key).startswith(f"artifact {key[:12]} links CuTe DSL's cu99 runtime, this process has ")
    mpath.write_text(json.dumps(manifest))
    (tmp_path / "store" / key / "kernel.o").write_bytes(b"not an object file")
    why = artifact_store.load(key)  # a changed object file is never linked in: the entry is discarded
    assert why.startswith(f"artifact {key[:12]} discarded: ") and "kernel.o changed since it was written" in why
    assert not (tmp_path / "store" / key).exists()
    monkeypatch.setenv(artifact_store.ENV, "off")
    assert artifact_store.root() is None and "off" in artifact_store.load(key)


def test_two_artifacts_load_side_by_side_in_one_process(tmp_path, h200, monkeypatch):
    """The worker keeps several prepared kernels: each artifact's symbols carry its own prefix."""
    monkeypatch.setenv(artifact_store.ENV, str(tmp_path / "store"))
    for knobs in ({"stages": 2}, {"stages": 3, "persistent": True}):
        CuteBackend().lower(_spec(**knobs), h200, tmp_path / "lower")
    one, two = artifact_store.load(_key(h200, stages=2)), artifact_store.load(_key(h200, stages=3, persistent=True))
    assert isinstance(one, artifact_store.Loaded) and isinstance(two, artifact_store.Loaded), (one, two)
    assert one.manifest["prefix"] != two.manifest["prefix"] and one.function is not two.function
    assert one.build.dynamic_smem != two.build.dynamic_smem  # 2 vs 3 pipeline stages of A+B tiles


def test_a_compile_for_torch_tensors_of_the_lowered_layouts_builds_the_lowerings_cubin(tmp_path):
    """What the worker compiled before (torch tensors, CPU ones here) is the kernel the artifact holds."""
    torch = pytest.importorskip("torch")
    from cutlass.cute.runtime import from_dlpack
    from mosaic_target_cute.lowering import compile_gemm

    m = n = k = 4096
    a, b, c = (torch.zeros(s, dtype=torch.bfloat16) for s in ((m, k), (k, n), (m, n)))
    views = (from_dlpack(a[None].permute(1, 2, 0), assumed_align=16),  # as CuteRunnable builds them
             from_dlpack(b[None].permute(2, 1, 0), assumed_align=16),
             from_dlpack(c[None].permute(1, 2, 0), assumed_align=16))
    _, fake = compile_gemm(GemmKnobs(stages=3), m, n, k, "bf16", "sm_90a", 132, tmp_path / "fake")
    _, real = compile_gemm(GemmKnobs(stages=3), m, n, k, "bf16", "sm_90a", 132, tmp_path / "torch", tensors=views)
    assert real.cubin.read_bytes() == fake.cubin.read_bytes() and real.kernel_name == fake.kernel_name


def _prepare_and_run(spec, h200, workdir, a, b):
    t0 = time.perf_counter()
    r = CuteBackend().prepare(spec, h200, workdir, {"a": a, "b": b})
    seconds = time.perf_counter() - t0
    try:
        r.poison()
        r.launch()
        return r.prepared_how, seconds, r.output()["c"]
    finally:
        r.close()


@pytest.mark.gpu
def test_worker_runs_the_loaded_artifact_same_bits_same_cubin_as_a_compile(tmp_path, h200, monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")
    monkeypatch.setenv(artifact_store.ENV, str(tmp_path / "store"))
    low = CuteBackend().lower(_spec(), h200, tmp_path / "lower")
    CuteBackend().lower(_spec(stages=3, persistent=True), h200, tmp_path / "lower2")
    rng = np.random.default_rng(0)
    a = rng.integers(-2, 3, (4096, 4096)).astype(np.float32)  # small integers: exact in bf16 and in fp32 sums
    b = rng.integers(-2, 3, (4096, 4096)).astype(np.float32)
    want = a @ b
    runs = {"store": _prepare_and_run(_spec(), h200, tmp_path / "run-store", a, b),
            "store2": _prepare_and_run(_spec(stages=3, persistent=True), h200, tmp_path / "run-store2", a, b)}
    monkeypatch.setenv(artifact_store.ENV, "off")
    runs["off"] = _prepare_and_run(_spec(), h200, tmp_path / "run-off", a, b)
    monkeypatch.setenv(artifact_store.ENV, str(tmp_path / "store"))
    mpath = tmp_path / "store" / _key(h200) / "manifest.json"
    mpath.write_text(json.dumps({**json.loads(mpath.read_text()), "nvidia-cutlass-dsl": "0.0"}))
    runs["foreign"] = _prepare_and_run(_spec(), h200, tmp_path / "run-foreign", a, b)
    for mode, (how, seconds, _) in runs.items():
        print(f"{mode}: prepare {seconds:.2f} s: {how}")
    assert runs["store"][0].startswith(f"loaded artifact {_key(h200)[:12]}")
    assert runs["store2"][0].startswith(f"loaded artifact {_key(h200, stages=3, persistent=True)[:12]}")
    assert runs["off"][0].startswith("compiled in ") and "store off" in runs["off"][0]
    assert runs["foreign"][0].startswith("compiled in ") and "was built by CuTe DSL 0.0" in runs["foreign"][0]
    np.testing.assert_allclose(runs["store"][2], want, rtol=2 ** -7, atol=0)
    np.testing.assert_allclose(runs["store2"][2], want, rtol=2 ** -7, atol=0)
    assert np.array_equal(runs["store"][2], runs["off"][2])  # the loaded kernel and a fresh compile: same bits
    assert np.array_equal(runs["store"][2], runs["foreign"][2])
    compiled_cubin = sorted((tmp_path / "run-off" / "cute_run_dump").glob("*.cubin"))
    assert compiled_cubin and compiled_cubin[0].read_bytes() == low.cubin.read_bytes(), \
        "the worker's compile for CUDA tensors built another cubin than the lowering's (now the one run)"


def test_campaign_cost_compile_once_measures_compile_against_load():
    """benchmarks/campaign_cost.py compile-once, one round: fresh processes; loading beats compiling."""
    import importlib

    row = importlib.import_module("campaign_cost").compile_once(sys.executable, 1, "4096x4096x4096",
                                                                {"stages": 5}, "h200")
    assert row["cubin_same_as_lowering"] and row["object_embeds_cubin"] and row["artifact_note"].startswith("artifact=")
    assert 0 < row["load_median_s"] < row["compile_median_s"], row
