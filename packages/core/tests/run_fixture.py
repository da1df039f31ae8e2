"""A recorded campaign for the convergence-loop tests: bundles written with save_bundle from recorded
per-run times at H200 scale (bf16 GEMM 4096^3: reference Pallas 172.8 us, cuBLAS 168.8 us), real sm_90a
SASS from the lift corpus (nvcc-built), launch records, and oracle-checkable outputs of a small GEMM.

Not a test module (no ``test_`` prefix); test files put this directory on sys.path and import it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mosaic.records import KernelSpec, LaunchRecord
from mosaic.run.workbench import REFERENCE, candidate_key, save_kernel_bundle

CORPUS = Path(__file__).resolve().parent / "lift" / "corpus" / "artifacts"
SHAPE = {"m": 4096, "n": 4096, "k": 4096}
HOPPER = {"kernel": "hopper", "tile_mn": [128, 128], "tile_k": 64, "cluster_mn": [1, 1], "stages": 4,
          "persistent": False, "raster": "m", "swizzle": 1, "epi_tile": [64, 32], "block_mn": [16, 16]}
NAIVE = {**HOPPER, "kernel": "naive"}

CAMPAIGN_TOML = """\
source = "pallas"
target = "cute"
family = "gemm"
shape = "4096x4096x4096"
dtype = "bf16"
gpu = "h200"
beam = 3
budget_min = 10.0
max_candidates = 40
reference_knobs = {kernel = "jax-hopper"}
start_knobs = {kernel = "naive"}
"""


def launch(grid, block=384, smem=197_632, regs=168, cluster=1) -> str:
    return LaunchRecord(kernel_name="gemm", grid=grid, block=block, cluster=cluster, dynamic_smem=smem,
                        registers_per_thread=regs).to_json()


def small_problem(seed=0):
    """A small GEMM whose bf16 inputs and exact bf16-rounded product the float64 oracle can check."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, size=(32, 16)).astype(np.float32)
    b = rng.integers(-4, 5, size=(16, 24)).astype(np.float32)
    return {"a": a, "b": b}, {"c": (a.astype(np.float64) @ b).astype(np.float32)}


def blocks(center_us: float, rel_sd: float, n_blocks: int, runs: int, seed: int) -> list[list[float]]:
    """Per-run device times (ns): block medians spread by rel_sd, runs within a block by rel_sd/2."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_blocks):
        med = center_us * 1e3 * (1 + rng.normal(0, rel_sd))
        out.append([round(float(med * (1 + rng.normal(0, rel_sd / 2))), 1) for _ in range(runs)])
    return out


EXPLORE_TOML = CAMPAIGN_TOML.replace("max_candidates = 40", "max_candidates = 12")
REF_LAUNCH = launch((132,), smem=5 * 32768 + 4096, cluster=(2, 1, 1))
UNREACHABLE_US = 160.0  # a reference no candidate of the model reaches: the loop explores until exhausted
STORY = Path(__file__).resolve().parent / "run_story.json"


def model(k: dict):
    """Recorded outcome of one cute knob set: (SASS variant, launch, time us, numerics ok, buildable, reason).

    Hopper bf16 GEMM 4096^3 at H200 scale: non-persistent 205 us; persistence, a 2x1 cluster and a deeper
    pipeline each buy a few us; 8 stages of 128x128x64 bf16 tiles exceed 227 KiB of shared memory
    (unbuildable); raster 'n' and a 32x32 epilogue tile carry planted numerics bugs (never timed).
    """
    if k["kernel"] == "naive":
        return "ld32", launch((256, 256), block=256, smem=0, regs=40), 6900.0, True, True, ""
    smem = k["stages"] * 32768 + 4096
    lau = launch((132,) if k["persistent"] else (1024,), smem=smem, cluster=(*k["cluster_mn"], 1))
    if smem > 232448:
        return "tma", lau, 0.0, True, False, f"[smem-per-block] {smem} B exceed h200's 232448 B per block"
    t = 205.0 - (23.5 if k["persistent"] else 0.0)
    t += {(1, 1): 0.0, (2, 1): -5.0}.get(tuple(k["cluster_mn"]), 2.0)
    t += {2: 9.0, 3: 2.5, 4: 0.0, 5: -3.6, 6: -3.5, 7: -3.4}[k["stages"]]
    t += {1: 0.0, 2: -0.1, 4: 6.0, 8: 9.0}[k["swizzle"]]
    t += 0.0 if tuple(k["epi_tile"]) == (64, 32) else 0.4
    t += 0.0 if tuple(k["tile_mn"]) == (128, 128) else 11.0
    ok = k["raster"] == "m" and tuple(k["epi_tile"]) != (32, 32)
    return "tma", lau, t, ok, True, ""


def knob_sets() -> list[dict]:
    import json

    return json.loads(STORY.read_text()) if STORY.is_file() else [NAIVE]


def build_campaign(root: Path, *, toml: str = CAMPAIGN_TOML, yardstick: bool = True, sets=None,
                   ref_us: float = 172.8) -> Path:
    """Write root/campaign.toml and root/bundles/*.bundle; return root."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "campaign.toml").write_text(toml)
    bundles = root / "bundles"
    inputs, outputs = small_problem()
    ref_spec = KernelSpec("gemm", SHAPE, "bf16", "pallas", {"kernel": "jax-hopper"})
    save_kernel_bundle(bundles / "reference.bundle", spec=ref_spec, key=REFERENCE, role="reference",
                       files=_sass("tma", REF_LAUNCH), blocks=blocks(ref_us, 0.002, 20, 20, 1),
                       inputs=inputs, outputs=outputs, gpu="h200", cost_s=30.0)
    if yardstick:
        save_kernel_bundle(bundles / "cublas.bundle", spec=KernelSpec("gemm", SHAPE, "bf16", "cublas", {}),
                           key="cublas", role="yardstick", blocks=blocks(168.8, 0.002, 5, 20, 2), gpu="h200")
    for knobs in knob_sets() if sets is None else sets:
        sass, lau, us, ok, build, reason = model(knobs)
        spec = KernelSpec("gemm", SHAPE, "bf16", "cute", knobs)
        key = candidate_key(spec)
        bad = {"c": outputs["c"] + (np.arange(outputs["c"].size).reshape(outputs["c"].shape) % 7 == 3) * 8.0}
        save_kernel_bundle(bundles / f"cand-{key}.bundle", spec=spec, key=key, role="candidate",
                           files=_sass(sass, lau) if build else {"build.log": ("log", reason)},
                           blocks=blocks(us, 0.002, 5, 20, int(key[:8], 16)) if build and ok else None,
                           outputs=(outputs if ok else bad) if build else None, build_ok=build,
                           build_reason=reason, cost_s=6.0, gpu="h200")
    return root


def _sass(variant: str, launch_json: dict) -> dict:
    import json

    return {"kernel.sass": ("sass", CORPUS / f"{variant}.sass"), "launch.json": ("launch", json.dumps(launch_json))}


def discover(root: Path) -> list[dict]:
    """Regenerate run_story.json: run the offline loop (reachable and unreachable reference), record every knob
    set it asks for, repeat until nothing is unrecorded; keep only the sets the final runs used."""
    import json
    import shutil
    import subprocess
    import sys

    def run(sets, ref_us):
        shutil.rmtree(root, ignore_errors=True)
        build_campaign(root, sets=sets, ref_us=ref_us,
                       toml=CAMPAIGN_TOML if ref_us != UNREACHABLE_US else EXPLORE_TOML)
        subprocess.run([str(Path(sys.executable).parent / "mosaic"), "run", "--offline", str(root), "--quiet"],
                       check=False, capture_output=True)
        return [json.loads(line) for line in (root / "offline" / "journal.jsonl").read_text().splitlines()]

    sets, used = [NAIVE], {}
    for ref_us in (172.8, UNREACHABLE_US):
        for _ in range(60):
            events = run(sets, ref_us)
            asked = {e["key"]: e["knobs"] for e in events if e["event"] == "proposal" and e.get("key")}
            missing = [asked[e["key"]] for e in events if e["event"] == "build" and e["reason_code"] == "unrecorded"]
            if not missing:
                used.update(asked)
                break
            sets += missing
        else:
            raise RuntimeError(f'discovery did not settle for reference {ref_us} us')
    STORY.write_text("[" + ",\n ".join(json.dumps(k) for k in used.values()) + "]\n")
    return list(used.values())
