"""Choosing an executor, with or without Ray installed: the flags' one-line refusals, several GPUs' reference
noise read back offline from their bundles, and the report naming the executor and the GPUs that timed."""

import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.run.offline import OfflineWorkbench

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402

MOSAIC = str(Path(sys.executable).parent / "mosaic")


def _ours(stderr: str) -> list[str]:
    return [x for x in stderr.strip().splitlines() if not x.startswith("warning: plugin")]  # others' plugins


def test_without_ray_the_ray_executor_is_refused_in_one_line_and_local_is_the_default(tmp_path):
    hide = ("import sys; sys.modules['ray'] = None; from mosaic.run.executor import default_executor; "
            "print(default_executor()); from mosaic.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", hide, "run", "--executor", "ray", "--source", "pallas", "--target",
                        "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype", "bf16"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.splitlines()[0] == "local"
    assert r.returncode == 2 and "--executor ray needs Ray (pip install ray)" in r.stderr
    assert len(_ours(r.stderr)) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("argv, says", [
    (["--executor", "threads", "--source", "pallas", "--target", "cute", "--family", "gemm", "--shape", "64x64x64",
      "--dtype", "bf16"], "unknown executor 'threads'"),
    (["--offline", "DIR", "--executor", "ray"], "--executor/--ray-address/--gpus apply to live runs"),
    (["--executor", "local", "--ray-address", "auto"], "--ray-address joins a Ray cluster: it needs --executor ray"),
])
def test_bad_executor_flags_are_one_line_and_exit_2(tmp_path, argv, says):
    r = subprocess.run([MOSAIC, "run", *[str(tmp_path) if a == "DIR" else a for a in argv]],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
    assert len(_ours(r.stderr)) == 1


def test_offline_reads_each_gpus_reference_noise_from_its_bundles(tmp_path):
    from mosaic.errors import BundleError
    from mosaic.records import KernelSpec
    from mosaic.run.workbench import REFERENCE, run_meta, save_kernel_bundle, update_bundle

    src = rf.build_campaign(tmp_path / "c")
    bench = OfflineWorkbench(src, "gemm", "bf16")
    assert bench.noise_by_gpu() == {}  # one GPU: nothing more
    ref = src / "bundles" / "reference.bundle"
    update_bundle(ref, extra=run_meta(REFERENCE, "reference", cost_s=30.0, gpu={"uuid": "GPU-a", "index": 0}))
    other = rf.blocks(175.0, 0.01, 20, 20, 7)
    spec = KernelSpec("gemm", rf.SHAPE, "bf16", "pallas", {"kernel": "jax-hopper"})
    b1 = src / "bundles" / "reference-gpu1.bundle"
    save_kernel_bundle(b1, spec=spec, key="reference-gpu1", role="reference-gpu", blocks=other, gpu="h200")
    with pytest.raises(BundleError, match="must name its GPU"):
        OfflineWorkbench(src, "gemm", "bf16").noise_by_gpu()
    update_bundle(b1, extra=run_meta("reference-gpu1", "reference-gpu", gpu={"uuid": "GPU-b", "index": 1}))
    got = OfflineWorkbench(src, "gemm", "bf16").noise_by_gpu()
    assert set(got) == {"GPU-a", "GPU-b"}
    assert [list(x) for x in got["GPU-b"]] == [list(x) for x in other]
    assert [list(x) for x in got["GPU-a"]] == [list(x) for x in bench.capture_reference(spec).noise_blocks]
    assert "reference-gpu1" not in OfflineWorkbench(src, "gemm", "bf16").by_key  # never a candidate


def test_several_gpus_need_the_ray_executor(tmp_path):
    r = subprocess.run([MOSAIC, "run", "--executor", "local", "--gpus", "2", "--source", "pallas", "--target",
                        "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype", "bf16"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "several GPUs need --executor ray" in r.stderr and "Traceback" not in r.stderr


def test_the_report_names_the_executor_and_the_gpus_that_timed(tmp_path):
    from mosaic.run.report import build_report, to_markdown

    head = {"event": "campaign", "campaign": {"source": "pallas", "target": "cute", "family": "gemm",
                                              "shape": {"k": 64, "m": 128, "n": 32}, "dtype": "bf16"},
            "gpu": {"name": "h200"}, "workbench": "live", "proposer": "knobs", "executor": "ray"}
    timed = [{"event": "timed", "key": k, "against": "x", "gpu": {"uuid": u, "index": i, "name": "H200"}}
             for k, u, i in (("a", "GPU-1", 0), ("b", "GPU-2", 1), ("c", "GPU-1", 0))]
    rep = build_report([head, *timed])
    assert rep["executor"] == "ray" and [(g["uuid"], g["timed"]) for g in rep["gpus"]] == [("GPU-1", 2), ("GPU-2", 1)]
    md = to_markdown(rep)
    assert "gemm 128x32x64 bf16" in md.splitlines()[0] and "; executor: ray." in md
    assert "Timed on: GPU 0 GPU-1 (2 comparisons); GPU 1 GPU-2 (1 comparisons)." in md
