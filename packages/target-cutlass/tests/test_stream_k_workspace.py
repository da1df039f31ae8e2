"""The stream-K tile scheduler's workspace is re-initialised before every launch.

CUTLASS zeroes stream-K's reduction locks only in ``initialize_workspace``; the kernel's fixup only increments
them and waits for exact values, so a second ``Gemm::run(stream)`` on the same workspace waits forever (the
H200 8192^3 gate hang: 128x128 cooperative stream-K, 4096 output tiles on 132 SMs = 31 waves + 4 tiles, so the
heuristic picks stream-K; at 4096^3 the 100-tile tail is over half a wave and the heuristic picks
data-parallel, which touches no lock). The first two tests read the installed CUTLASS headers, so they fail if
a CUTLASS release changes what the template relies on; the third compiles the candidate with nvcc."""

import re
import shutil

import pytest
from mosaic.capture import CaptureOptions, capture
from mosaic.records import KernelSpec
from mosaic_target_cutlass import build
from mosaic_target_cutlass.backend import CutlassBackend


def spec(shape=(8192, 8192, 8192), **knobs):
    base = dict(kernel_schedule="cooperative", epilogue_schedule="tma-cooperative", tile_m=128, tile_n=128,
                tile_k=64, cluster_m=1, cluster_n=1, tile_scheduler="stream-k")
    return KernelSpec(family="gemm", shape=dict(zip("mnk", shape, strict=True)), dtype="bf16", language="cutlass",
                      knobs={**base, **knobs})


def _function(src: str, name: str) -> str:
    start = src.index(f"int {name}(")
    body = src.index("{", start)
    depth, i = 0, body
    while True:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        if depth == 0:
            return src[body:i + 1]
        i += 1


def _headers():
    try:
        inc, _ = build.cutlass_include()
    except Exception as e:  # noqa: BLE001 - no CUTLASS headers here
        pytest.skip(f"CUTLASS headers not installed: {e}")
    return inc / "cutlass"


def test_the_headers_reset_stream_k_locks_only_in_initialize_workspace():
    cutlass = _headers()
    sched = (cutlass / "gemm/kernel/sm90_tile_scheduler_stream_k.hpp").read_text()
    start = sched.index("fixup_helper(")
    fixup = sched[start:re.search(r"static void\s+separate_reduction\(", sched[start:]).start() + start]
    assert "BarrierManager::arrive_inc" in fixup and "BarrierManager::wait_eq(" in fixup
    assert "wait_eq_reset" not in fixup  # nothing in the kernel puts a lock back to zero
    params = (cutlass / "gemm/kernel/tile_scheduler_params.h").read_text()
    assert "Only the barrier workspace needs to be cleared for stream-K." in params
    adapter = (cutlass / "gemm/device/gemm_universal_adapter.h").read_text()
    rerun = adapter[adapter.index("re-launch the same kernel without updating internal params"):]
    rerun = rerun[:rerun.index("}")]
    assert "initialize" not in rerun and "return run(params_, stream" in rerun


def test_every_launch_reinitialises_the_workspace_before_running():
    from mosaic_gpu_hopper.targets import H200

    src = CutlassBackend().source(spec(), H200)
    assert "cutlass::gemm::StreamKScheduler" in src
    launch = _function(src, "mosaic_launch")
    init = launch.index("GemmKernel::initialize_workspace(g->args, g->workspace, static_cast<cudaStream_t>(0))")
    assert init < launch.index("g->gemm.run(static_cast<cudaStream_t>(0))")
    assert "cudaDeviceSynchronize" not in launch and "cudaMalloc" not in launch
    create = _function(src, "mosaic_create")
    # the kept arguments and size are the ones the workspace was sized and initialised with
    kept = create.index("g->args = args;")
    assert create.index("Gemm::get_workspace_size(args)") < kept < create.index("g->gemm.initialize(args, g->workspace)")
    assert re.search(r"g->workspace_bytes = ws;", create)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA 12.3+) is not on PATH")
def test_stream_k_candidate_compiles(tmp_path):
    """Minutes of nvcc on a loaded CPU; the H200 8192^3 candidate that hung (93aad744f83e8e9e's knobs)."""
    r = capture(spec(stages="auto"), "h200", tmp_path / "sk.bundle", CaptureOptions(lower_only=True, timeout=1500))
    assert r.status == "lowered", r.message
    from mosaic.bundle import load_bundle

    assert "GemmKernel::initialize_workspace(g->args" in load_bundle(r.bundle).read_text("source")


@pytest.mark.gpu
def test_stream_k_8192_captures_and_passes_the_oracle_on_the_gpu(tmp_path):
    """The H200 run's hung candidate, captured for real: many launches (warmup, runs, blocks) on one workspace.
    Before the fix this capture hung at its second launch; the 300 s timeout kills it (status 'timeout')."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")
    r = capture(spec(), "h200", tmp_path / "sk.bundle", CaptureOptions(timeout=300, runs=20, blocks=4))
    assert r.status == "ok", r.message
    from mosaic.bundle import load_bundle

    b = load_bundle(r.bundle)
    s = b.manifest["capture"]["summary"]
    assert s["numerics_pass"] is True
    print(f"stream-K 128x128 cooperative 8192^3: grid {(s.get('launch') or {}).get('grid')}, "
          f"{s.get('time_ns')} ns; capture {b.manifest['capture'].get('wall_s')} s")
