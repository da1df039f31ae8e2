"""The hand-off microbenchmark (bench/handoff.cu, bench/handoff.py): it builds for sm_90a without spills; the SASS shows
each protocol's synchronisation (the counter's MEMBAR + REDG, the flag-in-data protocol's 64-bit strong loads and
stores with no MEMBAR and no RED); on the H200 every protocol's stages read exactly the previous stage's data."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from mosaic.toolchain.tools import find_tool
from mosaic_amk.bench import handoff as H

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


@pytest.fixture(scope="module")
def hb(private_cache):
    return H.build()


def _functions(sass: str) -> dict[str, str]:
    """cuobjdump --dump-sass text split by kernel."""
    parts = re.split(r"\n\s*Function : (\w+)\n", sass)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@needs_nvcc
def test_builds_without_spills(hb):
    for k in H.KERNELS:
        r = hb.resources[k]
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack_bytes"] == 0, (k, r)
        assert 0 < r["registers"] <= 128, (k, r)


@needs_nvcc
def test_sass_shows_each_protocols_synchronisation(hb):
    tool = find_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not found")
    sass = subprocess.run([tool, "--dump-sass", str(hb.cubin)], capture_output=True, text=True, timeout=120).stdout
    fns = _functions(sass)
    assert set(H.KERNELS) <= set(fns), sorted(fns)
    counter, ll = fns["handoff_counter"], fns["handoff_ll"]
    assert "MEMBAR" in counter and re.search(r"REDG\.E\.ADD\S*STRONG\.GPU", counter)
    assert "MEMBAR" not in ll and "REDG" not in ll
    assert re.search(r"LDG\.E\.64\.STRONG\.GPU", ll) and re.search(r"STG\.E\.64\.STRONG\.GPU", ll)


def test_bad_arguments_are_refused():
    with pytest.raises(H.DeviceError, match="unknown hand-off protocol"):
        H.measure(protocols=("nope",))
    with pytest.raises(H.DeviceError, match="stages"):
        H.measure(stages=1)
    with pytest.raises(H.DeviceError, match="below 2"):
        H.measure(ns=(8192,), stages=4096)


@pytest.mark.gpu
def test_every_protocol_reads_the_previous_stage(cuda_device):
    results = H.measure(ns=(576, 2048), stages=64, launches=3)
    assert {(r.protocol, r.n) for r in results} == {(p, n) for p in H.PROTOCOLS for n in (576, 2048)}
    for r in results:
        assert r.blocks > 0 and len(r.samples_us) == 3 and 0 < r.us_per_stage < 100, r


def test_stage_depth_counts_the_longest_counter_chain():
    """CUDA_DEFAULT on a tiny Llama: the embedding, 5 dependent stages per layer (q/k/v, attention, o-proj, gate/up,
    down), the LM head and the split argmax's two stages."""
    import attrs
    from mosaic.plugins import host
    from mosaic_amk.config import CUDA_DEFAULT
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.lowering import lower
    from mosaic_amk.tiny_models import tiny_model

    m = tiny_model("llama")
    s = lower(m, attrs.evolve(CUDA_DEFAULT, kv_max_tokens=64), host().get("gpus", "h200"), 0)
    layers = m.num_layers
    assert layers >= 2
    assert H.stage_depth(E.encode(s)) == 1 + 5 * layers + 3
    # a cycle is an error, not a recursion overflow
    enc = E.encode(s)
    tasks = enc.tasks.copy()
    first = int(tasks[0, E.W_SIGNAL])
    last = [i for i in range(len(tasks)) if int(tasks[i, E.W_NWAIT]) > 0][-1]
    tasks[0, E.W_NWAIT], tasks[0, E.W_WAIT], tasks[0, E.W_WAIT + 1] = 1, int(tasks[last, E.W_SIGNAL]), 1
    assert first != int(tasks[last, E.W_SIGNAL])
    with pytest.raises(H.DeviceError, match="cycle"):
        H.stage_depth(attrs.evolve(enc, tasks=tasks))
