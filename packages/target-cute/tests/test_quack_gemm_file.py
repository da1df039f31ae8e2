"""A third-party CuTe DSL GEMM as a kernel file: examples/kernels/cute/quack_gemm.py is our adapter whose entry
builds quack-kernels' own sm_90 GEMM (``quack.gemm_default_epi.GemmDefaultSm90``, the installed package) with
the knobs as quack's ``GemmConfig`` fields. On the CPU it lowers through `mosaic capture --file --lower-only` at
4096x4096x4096 bf16 into a bundle `mosaic lift` reads as a warp-specialised wgmma kernel (one TMA producer
warp group, two consumer warp groups); its defaults are quack's own sm_90 default config; B is read in the
family's (k, n) layout by the one kernel (no transpose kernel, wgmma's B operand MN-major); a knob replaces
one of quack's choices in the compiled code and a value quack refuses is one error line, exit 2. On a GPU
(marked gpu) it passes the gemm family's float64 oracle and is timed."""

import hashlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle

pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl")
pytest.importorskip("quack.gemm_default_epi", reason="needs quack-kernels (and torch): the .venv has them")

ADAPTER = Path(__file__).resolve().parents[3] / "examples" / "kernels" / "cute" / "quack_gemm.py"
SHAPE = "4096x4096x4096"
WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.f32\.bf16\.bf16\s*\{[^}]*\},\s*%rd\d+,\s*"
                   r"%rd\d+,\s*\w+,\s*(\d),\s*(\d),\s*(\d),\s*(\d);")


def mosaic(*args, cwd, timeout=900):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def lower(*knobs, cwd, out="q.bundle"):
    return mosaic("capture", "--file", str(ADAPTER), "--lang", "cute", "--family", "gemm", "--shape", SHAPE,
                  "--dtype", "bf16", *knobs, "--lower-only", "-o", out, "--force", cwd=cwd)


def adapter_module():
    spec = importlib.util.spec_from_file_location("quack_gemm_adapter", ADAPTER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_defaults_are_quacks_sm90_default_config():
    from quack.gemm_config import GemmConfig, _default_config_for_cap

    q = _default_config_for_cap(9)
    k = adapter_module().Knobs()
    assert (k.tile_m, k.tile_n, k.cluster_m, k.cluster_n, k.pingpong) == \
        (q.tile_m, q.tile_n, q.cluster_m, q.cluster_n, q.pingpong)
    assert q.tile_k is None and k.tile_k == 0  # 0: quack derives tile K from the MMA instruction
    assert k.max_swizzle_size == q.max_swizzle_size == GemmConfig().max_swizzle_size
    assert not q.is_dynamic_persistent and q.split_k == 1 and not q.swap_ab  # the launch this adapter fixes


def test_quack_gemm_lowers_on_the_cpu_and_lifts(tmp_path):
    from mosaic.toolchain.cubin import read_cubin

    p = lower(cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    b = load_bundle(tmp_path / "q.bundle")
    assert b.manifest["capture"]["status"] == "lowered"
    assert b.kernel.family == "gemm" and b.kernel.shape == {"m": 4096, "n": 4096, "k": 4096}
    assert b.one("source").read_bytes() == ADAPTER.read_bytes()
    assert b.manifest["kernel_file"]["sha256"] == hashlib.sha256(ADAPTER.read_bytes()).hexdigest()
    ptx = b.read_text("ptx")
    entry = re.search(r"\.entry\s+(\w+)", ptx).group(1)
    assert "quackgemm_default_epiGemmDefaultSm90" in entry, entry  # quack's class compiled, not a kernel of ours
    assert ".reqntid 384, 1, 1" in ptx  # quack's ping-pong: 1 producer + 2 consumer warp groups
    kernels = read_cubin(b.one("cubin").read_bytes())
    assert [k.name for k in kernels] == [entry]  # one kernel: no transpose or copy of B before the GEMM
    mmas = WGMMA.findall(ptx)
    assert mmas and {m[0] for m in mmas} == {"m64n192k16"}  # tile_n = 192 per consumer warp group
    # wgmma's immediates: scale-a, scale-b, trans-a, trans-b. A is K-major (row-major m x k, trans-a 0); B is
    # read MN-major (trans-b 1): the family's row-major k x n b as it lies in memory
    assert {m[1:] for m in mmas} == {("1", "1", "0", "1")}
    assert "multicast::cluster" in ptx  # the 2 x 1 cluster shares B's tiles by TMA multicast
    # the launch, read from the host code quack's launch compiled to (no GPU): one 2 x 1 cluster (the scheduler
    # bound stands in at 1 without a device), quack's 384 threads and its shared storage as dynamic shared memory
    launch = json.loads(b.one("launch").read_text())
    assert launch["cluster"] == [2, 1, 1] and launch["grid"] == [2, 1, 1] and launch["block"] == [384, 1, 1]
    assert 0 < launch["dynamic_smem"] <= 232448
    lift = mosaic("lift", "q.bundle", "--json", cwd=tmp_path)
    assert lift.returncode == 0, lift.stderr
    doc = json.loads(lift.stdout)
    assert doc["dialect"] == "sass" and doc["kernel"] == entry and doc["instructions"] > 500
    roles = {r["name"]: r for r in doc["roles"]}
    assert set(roles) == {"producer", "consumer"}
    assert roles["producer"]["warpgroups"] == 1 and roles["consumer"]["warpgroups"] == 2
    assert roles["consumer"]["setmaxnreg"] > roles["producer"]["setmaxnreg"]  # quack's register split
    layer = {name: {f["key"]: f["value"] for f in fs} for name, fs in doc["layers"].items()}
    assert layer["launch"]["block"] == [384, 1, 1] and layer["launch"]["warpgroups"] == 3
    assert layer["instruction"]["mma.form"] == ["wgmma"] and layer["instruction"]["mma.shape"] == ["m64n192k16"]
    assert layer["instruction"]["transfer.form"] == ["tma"]
    assert layer["control"]["persistent"] is True and layer["control"]["pipeline.stages"] > 1


def test_a_knob_replaces_quacks_choice_and_the_scheduler_bound_is_launch_only(tmp_path):
    p = lower("--knob", "tile_m=256", "--knob", "tile_n=128", "--knob", "pingpong=false", "--knob", "cluster_m=1",
              "--knob", "cluster_n=2", cwd=tmp_path, out="coop.bundle")
    assert p.returncode == 0, p.stdout + p.stderr
    b = load_bundle(tmp_path / "coop.bundle")
    assert b.kernel.knobs["tile_m"] == 256 and b.kernel.knobs["pingpong"] is False
    ptx = b.read_text("ptx")
    assert {m[0] for m in WGMMA.findall(ptx)} == {"m64n128k16"}  # quack's cooperative 256 x 128: 2 x m64n128
    assert ".reqntid 384, 1, 1" in ptx and "multicast::cluster" in ptx
    # max_active_clusters bounds the persistent grid only: the device code is the same for any value, so the
    # ahead-of-time lowering's stand-in (1, no device here) lowers the kernel the GPU runs
    assert lower(cwd=tmp_path, out="one.bundle").returncode == 0
    p = lower("--knob", "max_active_clusters=66", cwd=tmp_path, out="many.bundle")
    assert p.returncode == 0, p.stdout + p.stderr
    one, many = load_bundle(tmp_path / "one.bundle"), load_bundle(tmp_path / "many.bundle")
    assert one.read_text("ptx") == many.read_text("ptx") and one.read_text("sass") == many.read_text("sass")
    assert one.read_text("ptx") != ptx


def test_values_quack_refuses_are_one_line(tmp_path):
    cases = [(["--knob", "tile_m=100"], r"cute\.compile failed: ValueError: CTA tile shape M must be "
                                        r"64/128/192 if pingpong"),
             (["--knob", "persistent=false"], r"cute\.compile failed: AssertionError: Pingpong gemm requires "
                                              r"persistent scheduler"),
             (["--knob", "cluster_m=3"], r"knob class Knobs refused .*cluster_m=3, cluster_n=1: each one of 1, 2, 4"),
             (["--knob", "cluster_m=4", "--knob", "cluster_n=2"], r"at most 4 CTAs per cluster"),
             (["--knob", "swap_ab=true"], r"unknown knob\(s\) swap_ab .*known: tile_m, tile_n, tile_k, cluster_m")]
    for knobs, pattern in cases:
        p = lower(*knobs, cwd=tmp_path, out="bad.bundle")
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), (knobs, lines)
        assert re.search(pattern, lines[0]) and "Traceback" not in p.stderr, lines[0]


@pytest.mark.gpu
@pytest.mark.slow
def test_quack_gemm_passes_the_oracle_on_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bound = adapter_module().MAX_ACTIVE_CLUSTERS  # quack's own query at import, on this device
    assert not [w for w in caught if "get_max_active_clusters" in str(w.message)], caught
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert set(bound) == {1, 2, 4} and all(0 < bound[c] <= sms // c for c in bound), bound
    print(f"quack's max_active_clusters on {torch.cuda.get_device_name()} ({sms} SMs): {bound}")
    runs = [("default", [], "normal"), ("default-int", [], "int"),
            ("coop-256x128-1x2", ["--knob", "tile_m=256", "--knob", "tile_n=128", "--knob", "pingpong=false",
                                  "--knob", "cluster_m=1", "--knob", "cluster_n=2"], "normal")]
    for name, knobs, values in runs:
        p = mosaic("capture", "--file", str(ADAPTER), "--lang", "cute", "--family", "gemm", "--shape", SHAPE,
                   "--dtype", "bf16", *knobs, "--values", values, "--blocks", "10", "--runs", "20",
                   "-o", f"{name}.bundle", cwd=tmp_path, timeout=1800)
        assert p.returncode == 0, (name, p.stdout + p.stderr)
        s = load_bundle(tmp_path / f"{name}.bundle").manifest["capture"]["summary"]
        assert s["numerics_pass"] and s["deterministic"] and s["time_ns"] > 0, (name, s)
        tflops = 2 * 4096 ** 3 / s["time_ns"] / 1e3
        print(f"quack gemm {SHAPE} bf16 {name} ({values}): {s['time_ns'] / 1e3:.1f} us = {tflops:.0f} TFLOP/s, "
              f"noise {s.get('noise_ns')}")
