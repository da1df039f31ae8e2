"""The Pallas rmsnorm and softmax kernels on the GPU (marked ``gpu``; skipped without jax >= 0.11.2 with a CUDA
backend): every value of the knob table passes the family's float64 oracle; every input distribution does,
bf16 subnormals (which the CPU interpreter cannot check), ``approx_math``, in place and direct loads included; every distinct table
configuration lowers at the issue's shape to PTX and SASS (TMA loads and bulk stores in it, TMA loads and
plain global stores for copy='tma_in', plain global loads and stores for copy='direct'); and a full capture
at 16384 x 8192 bf16 passes the oracle, is timed, and lifts.

    python3 -m pytest -q -m gpu -s packages/target-pallas/tests/test_rmsnorm_gpu.py
"""

import json
import re
import subprocess
import sys

import attrs
import pytest
from mosaic import families, oracle
from mosaic.records import KernelSpec
from mosaic_target_pallas.rowwise_knobs import ROWWISE_KNOBS, table_configs

pytestmark = pytest.mark.gpu
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
COLS = (8192, 2048, 512)
DISTRIBUTIONS = ("normal", "int", "large", "equal-rows", "denormal")
OTHER = {"block_rows": 8, "tma_cols": 64, "vector": 2, "max_concurrent_steps": 3, "blocks_per_cta": 4,
         "out_slots": 2, "approx_math": True}


def _gpu():
    from mosaic.plugins import PluginHost

    return PluginHost(allow="hopper").load().get("gpus", "h200")


@pytest.fixture(scope="module")
def h200():
    return _gpu()


@pytest.fixture(autouse=True)
def cuda(monkeypatch):
    pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12)")
    from mosaic_target_pallas.backend import jax_has_gpu

    if not jax_has_gpu():
        pytest.skip("needs jax with a CUDA backend (jax[cuda]) and a GPU")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _opcodes(sass):
    """The distinct opcodes (with their modifiers) of an nvdisasm listing, predicates dropped."""
    return {m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", sass)}


def _spec(family, rows, cols, knobs, dtype="bf16"):
    return KernelSpec(family=family, shape={"rows": rows, "cols": cols}, dtype=dtype, language="pallas",
                      knobs=knobs, name=f"{family}_gpu")


def _table():
    """(family, knobs, cols) for each table value at the widest shape it fits."""
    gpu, seen, out = _gpu(), set(), []
    for family in ("rmsnorm", "softmax"):
        for cols in COLS:
            for knob, value, knobs in table_configs(family, _spec(family, 16384, cols, {}), gpu):
                if knobs is not None and (family, knob, value) not in seen:
                    seen.add((family, knob, value))
                    out.append(pytest.param(family, knobs, cols, id=f"{family}-{knob}={value}"))
    return out


def _distinct():
    """The table's distinct (family, knobs, cols): each compiles once (jax caches a compiled kernel, and a cached
    compile writes no MOSAIC_GPU_DUMP_TO dump)."""
    seen, out = set(), []
    for p in _table():
        family, knobs, cols = p.values
        key = (family, cols, tuple(sorted(knobs.items())))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def run_on_gpu(spec, h200, tmp_path, values="normal", seed=0):
    from mosaic_target_pallas.backend import PallasBackend

    inputs = families.make_inputs(spec, seed, values)
    r = PallasBackend().prepare(spec, h200, tmp_path, inputs)
    try:
        r.poison()
        r.launch()
        out = r.output()
        assert r.poison_effective is True, "the output buffer was not the poisoned one"
    finally:
        r.close()
    return oracle.check(spec.family, inputs, out, spec.dtype)


@pytest.mark.parametrize("family,knobs,cols", _table())
def test_every_table_value_passes_the_oracle(family, knobs, cols, h200, tmp_path):
    per_cta = knobs["block_rows"] * knobs["blocks_per_cta"]
    rows = per_cta * max(2, 2048 // per_cta)
    verdict = run_on_gpu(_spec(family, rows, cols, knobs), h200, tmp_path)
    assert verdict.passed, verdict.reason


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("values", DISTRIBUTIONS)
@pytest.mark.parametrize("config", ["default", "other", "in-place", "direct", "tma_in"])
@pytest.mark.parametrize("family", ["rmsnorm", "softmax"])
def test_distributions_pass_the_oracle(family, config, values, dtype, h200, tmp_path):
    if config == "default":
        knobs, cols = attrs.asdict(ROWWISE_KNOBS[family]()), 8192
    elif config == "direct":
        knobs, cols = {"copy": "direct", "block_rows": 8}, 8192
    elif config == "tma_in":
        knobs, cols = {"copy": "tma_in", "block_rows": 2, "vector": 4}, 8192
    elif config == "in-place":
        knobs, cols = {"out_slots": 0, "max_concurrent_steps": 3}, 8192
    else:
        knobs, cols = {**OTHER, **({"online": False} if family == "softmax" else {})}, 2048
    verdict = run_on_gpu(_spec(family, 4096, cols, knobs, dtype), h200, tmp_path, values, seed=1)
    assert verdict.passed, verdict.reason


@pytest.mark.parametrize("family,knobs,cols", _distinct())
def test_lowering_gives_ptx_and_sass(family, knobs, cols, h200, tmp_path):
    from mosaic_target_pallas.backend import PallasBackend

    low = PallasBackend().lower(_spec(family, 16384, cols, knobs), h200, tmp_path)
    assert low.ptx is not None and low.ptx.read_text().count(".entry") >= 1, low.notes
    assert low.sass is not None, low.notes  # jax's SASS, or ptxas + nvdisasm on the captured PTX (the notes say)
    sass = low.sass.read_text()
    ops = _opcodes(sass)
    copy = knobs.get("copy", "tma")
    if copy == "tma":  # TMA load, bulk store, the warp-local row reduction
        # Mosaic GPU stores a whole contiguous block with the non-tensor bulk copy (cp.async.bulk.global.shared::cta
        # -> UBLKCP), not a TMA tensor store (UTMASTG): read off the H200's SASS in session 12
        expected, absent = ("UTMALDG", "UBLKCP", "SHFL.BFLY"), ("UTMASTG",)
    elif copy == "tma_in":  # TMA loads, the result stored from registers
        # Mosaic GPU's register stores to a global ref are generic (PTX st.v2.b32 -> ST.E.64), not STG: read off
        # the H200's SASS in session 13 (32 ST.E.64 at 16384x8192)
        expected, absent = ("UTMALDG", "ST.E", "SHFL.BFLY"), ("UBLKCP", "UTMASTG")
    else:  # no TMA: loads and stores from registers, global or generic
        expected, absent = (("LDG.E", "LD.E"), ("STG.E", "ST.E"), "SHFL.BFLY"), ("UTMALDG", "UTMASTG", "UBLKCP")
    memory = sorted(op for op in ops if op.split(".")[0] in {"LD", "LDG", "LDS", "ST", "STG", "STS", "UTMALDG",
                                                             "UTMASTG", "UBLKCP", "LDGSTS"})
    print(f"\n{family} {cols} {knobs}: memory opcodes {memory}")
    for op in expected:
        alternatives = op if isinstance(op, tuple) else (op,)
        assert any(o == a or o.startswith(a + ".") for o in ops for a in alternatives), (alternatives, memory)
    for op in absent:
        assert not any(o == op or o.startswith(op + ".") for o in ops), (op, memory)
    regs = low.resources.registers if low.resources else None
    spills = (low.resources.spill_stores, low.resources.spill_loads) if low.resources else None
    print(f"\n{family} {cols} {knobs}: registers {regs}, spills {spills}")


@pytest.mark.parametrize("family", ["rmsnorm", "softmax"])
def test_capture_at_the_issue_shape_passes_times_and_lifts(family, tmp_path):
    bundle = tmp_path / f"{family}.bundle"
    p = subprocess.run([*MOSAIC, "capture", "--lang", "pallas", "--family", family, "--shape", "16384x8192",
                        "--dtype", "bf16", "--runs", "10", "--blocks", "3", "--json", "-o", str(bundle)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    r = json.loads(p.stdout)
    assert r["status"] == "ok", r
    assert r["summary"]["numerics_pass"] is True and r["summary"]["time_ns"] > 0, r["summary"]
    print(f"\n{family} 16384x8192 bf16 default knobs: {r['summary']['time_ns'] / 1e3:.2f} us")
    lift = subprocess.run([*MOSAIC, "lift", str(bundle)], capture_output=True, text=True, timeout=600)
    assert lift.returncode == 0, lift.stderr[-2000:]
    assert lift.stdout.strip()


@pytest.mark.parametrize("family", ["rmsnorm", "softmax"])
def test_without_auto_barriers_the_sass_keeps_only_the_kernels_own(family, h200, tmp_path):
    """auto_barriers=False (the default) leaves the pipeline's own warpgroup barriers only: the session-9 naive
    rmsnorm SASS (jax's automatic barriers on) held 72 BAR.SYNC for its 32 boxes, two around every store."""
    from mosaic_target_pallas.backend import PallasBackend

    counts = {}
    for on in (False, True):
        low = PallasBackend().lower(_spec(family, 16384, 8192, {"auto_barriers": on}), h200, tmp_path / str(on))
        counts[on] = low.sass.read_text().count("BAR.SYNC")
    print(f"\n{family}: BAR.SYNC without / with auto barriers: {counts[False]} / {counts[True]}")
    assert counts[False] <= 8 < 2 * 32 <= counts[True], counts
