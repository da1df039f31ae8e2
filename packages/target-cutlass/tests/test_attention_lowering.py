"""The CUTLASS (CuTe C++) attention forward for sm_90a, lowered on the CPU: a small table of knob configurations,
each built by nvcc through the plugin's normal path (PTX, cubin, SASS, ptxas figures), and the configurations the
rules refuse, each by its named rule before anything is compiled.

For every lowered configuration: ptxas reports no spills; the SASS holds the hot loop's two HGMMA forms (S = Q K^T
with both operands from shared memory, 64 x block_n; O += P V with V transposed from shared memory and P from
registers or shared memory, 64 x head_dim) and MUFU.EX2; the shim's shared memory is the rules' estimate; and the
build's host-side checks pass (the fragment maps, and the key-block rule the kernel runs equals the Python mirror).
Builds are cached by source hash under $MOSAIC_CACHE_DIR like the GEMM's (first run: about 40 s each on 2 cores).
On a GPU: tools/attention_selfcheck.sh (the template in a stand-alone program; passed on an H100 on 2026-12-07) and
tests/test_attention_gpu.py (the plugin's device runner, through `mosaic capture`); the runner's refusals on the CPU:
tests/test_attention_runner.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import attrs
import pytest
from mosaic.backend import Unbuildable
from mosaic.errors import RecordError
from mosaic.records import KernelSpec
from mosaic_target_cutlass import attention
from mosaic_target_cutlass.attention import AttentionKnobs
from mosaic_target_cutlass.backend import CutlassBackend

SHAPE = {"batch": 2, "seq": 1000, "heads": 8}
#: (dtype, head_dim, causal, kv_heads, knobs): each one nvcc build
LOWERED = (
    ("bf16", 128, 0, 8, {}),  # the default: 128x128, 2 stages, 2 consumer warpgroups, P in registers
    ("bf16", 128, 1, 2, {}),  # causal with block skipping, GQA
    ("bf16", 128, 1, 8, {"block_n": 64, "stages": 3, "p_in": "smem"}),  # P staged in smem, two warpgroups
    ("bf16", 64, 0, 1, {"block_m": 128, "block_n": 64, "consumer_warpgroups": 1}),  # two M atoms per warpgroup
    ("f16", 64, 1, 1, {"block_m": 64, "block_n": 64, "stages": 3, "consumer_warpgroups": 1, "causal_skip": False,
                       "p_in": "smem"}),
)
#: (dtype, head_dim, knobs, extra shape, gpu, the rule that refuses it)
REFUSED = (
    ("bf16", 128, {"block_m": 64}, {}, "h200", "CUTLASS-ATT-ROWS"),
    ("bf16", 128, {"p_in": "smem", "block_n": 96}, {}, "h200", "CUTLASS-ATT-P-SMEM"),
    ("bf16", 128, {"stages": 4}, {}, "h200", "CUTLASS-SMEM"),
    ("bf16", 128, {"block_m": 128, "consumer_warpgroups": 1}, {}, "h200", "CUTLASS-ATT-ACC-REGS"),
    ("bf16", 96, {}, {}, "h200", "CUTLASS-ATT-HEAD-DIM"),
    ("f32", 128, {}, {}, "h200", "CUTLASS-DTYPE"),
    ("bf16", 128, {}, {"kv_heads": 3}, "h200", "CUTLASS-ATT-SHAPE"),
    ("bf16", 128, {}, {"heads": 70000, "kv_heads": 70000}, "h200", "CUTLASS-ATT-GRID"),
    ("bf16", 128, {}, {}, "b200", "CUTLASS-ATT-ARCH"),
)


def _spec(dtype, head_dim, knobs, **shape):
    full = {**SHAPE, "head_dim": head_dim, **shape}
    if not full.get("causal", 1):
        del full["causal"]  # the family's canonical form (a shape holds positive integers)
    return KernelSpec(family="attention", shape=full, dtype=dtype, language="cutlass", knobs=knobs, name="attn")


@pytest.fixture(scope="module")
def gpus():
    from mosaic.plugins import PluginHost

    h = PluginHost(allow="blackwell,hopper").load()
    return {name: h.get("gpus", name) for name in ("h200", "b200")}


def test_knobs_validate_at_construction():
    k = AttentionKnobs(block_m="64", block_n="96", stages="3", consumer_warpgroups="1", causal_skip="false")
    assert (k.block_m, k.block_n, k.stages, k.consumer_warpgroups, k.causal_skip) == (64, 96, 3, 1, False)
    assert k.threads == 256 and k.rows_per_warpgroup == 64
    for bad, field in ((dict(block_m=96), "block_m"), (dict(block_n=100), "block_n"), (dict(block_n=512), "block_n"),
                       (dict(stages=0), "stages"), (dict(consumer_warpgroups=3), "consumer_warpgroups"),
                       (dict(p_in="tmem"), "p_in"), (dict(causal_skip="maybe"), "causal_skip")):
        with pytest.raises(RecordError, match=f"AttentionKnobs.{field}="):
            AttentionKnobs(**bad)
    with pytest.raises(RecordError, match="known knobs"):
        CutlassBackend()._knobs(_spec("bf16", 128, {"tile_m": 128}))


@pytest.mark.parametrize("dtype,head_dim,knobs,shape,gpu,code", REFUSED, ids=[r[-1] for r in REFUSED])
def test_refused_by_its_rule_without_compiling(dtype, head_dim, knobs, shape, gpu, code, gpus):
    spec = _spec(dtype, head_dim, knobs, **shape)
    assert code in {d.code for d in attention.problems(AttentionKnobs(**knobs), spec, gpus[gpu])}
    with pytest.raises(Unbuildable, match=code):
        CutlassBackend().source(spec, gpus[gpu])


def test_rules_are_data_and_every_rule_is_exercised():
    codes = [r.code for r in attention.RULES]
    assert len(codes) == len(set(codes)) and all(r.reason and r.fields for r in attention.RULES)
    assert {r[-1] for r in REFUSED} | {"CUTLASS-ATT-REG-SPLIT"} == set(codes)


def test_render_substitutes_every_knob(gpus):
    src = CutlassBackend().source(_spec("f16", 64, {"block_m": 64, "block_n": 64, "consumer_warpgroups": 1,
                                                    "p_in": "smem", "causal_skip": False}, causal=1), gpus["h200"])
    assert not re.search(r"\{\{[A-Z_]+\}\}", src)
    assert "Config<cutlass::half_t, 64, 64, 64, 2, 1,\n                                     true, false, false>" in src
    assert "#pragma once" not in src and "namespace mosaic_attention" in src


def test_budget_estimates():
    k = AttentionKnobs()
    assert attention.smem_bytes(k, 128) == (128 * 128 + 2 * 2 * 128 * 128) * 2 + 2048
    assert attention.consumer_registers(k, 128) == {"S": 64, "O": 64, "P": 32, "other": 24, "total": 184, "limit": 240}
    one = AttentionKnobs(block_m=128, consumer_warpgroups=1)
    assert attention.consumer_registers(one, 128)["total"] == 128 + 128 + 64 + 24


# -- lowered configurations (nvcc; cached) -------------------------------------------------------------------------

def _id(cfg):
    dtype, d, causal, kv, knobs = cfg
    return f"{dtype}-d{d}-{'causal' if causal else 'full'}-" + AttentionKnobs(**knobs).label


@pytest.fixture(scope="module", params=LOWERED, ids=[_id(c) for c in LOWERED])
def lowered(request, gpus, tmp_path_factory):
    dtype, d, causal, kv, knobs = request.param
    spec = _spec(dtype, d, knobs, kv_heads=kv, causal=causal)
    low = CutlassBackend().lower(spec, gpus["h200"], tmp_path_factory.mktemp("attn"))
    return request.param, low, CutlassBackend().build(spec, gpus["h200"]).library  # (the build is cached)


@pytest.mark.slow
@pytest.mark.usefixtures("cutlass_build")
def test_lowers_with_no_spills_and_the_hot_loop_instructions(lowered):
    (dtype, d, causal, kv, kn), low, _ = lowered
    k = AttentionKnobs(**kn)
    r = low.resources
    notes = dict(n.split(" ", 1) for n in low.notes if " " in n)
    print(f"\nCUTLASS attention {_id(lowered[0])}: {r.registers} registers, spills {r.spill_stores}/{r.spill_loads} B, "
          f"smem {notes['smem_bytes']} B, {notes['threads_per_block']} threads")
    assert 0 < r.registers <= 255 and r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0
    assert int(notes["smem_bytes"]) == attention.smem_bytes(k, d)  # the rules' estimate is the template's figure
    assert int(notes["threads_per_block"]) == k.threads and notes["fragment_maps"] == "ok"
    grid = attention.grid(k, SHAPE["batch"], SHAPE["seq"], SHAPE["heads"])  # the runner's launch, from the shim
    assert notes["launch"] == f"grid={grid} block={k.threads} dynamic_smem={attention.smem_bytes(k, d)}"

    ptx = low.ptx.read_text()
    assert ".target sm_90a" in ptx and "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert ("setmaxnreg" in ptx) == (k.consumer_warpgroups == 2)
    log = low.ptxas_log.read_text()
    assert "'sm_90a'" in log and "C7508" not in log  # no setmaxnreg ignored

    sass = low.sass.read_text()
    ty = r"\.F32" + (r"\.BF16" if dtype == "bf16" else "")
    qk = re.findall(rf"HGMMA\.64x{k.block_n}x16{ty} R\d+, gdesc\[UR\d+\](?!\.tnspB)", sass)  # S = Q K^T: SS
    if k.p_in == "registers":
        pv = re.findall(rf"HGMMA\.64x{d}x16{ty} R\d+, R\d+, gdesc\[UR\d+\]\.tnspB", sass)  # RS: P from registers
    else:
        pv = re.findall(rf"HGMMA\.64x{d}x16{ty} R\d+, gdesc\[UR\d+\]\.tnspB", sass)  # SS: P from smem
    atoms = k.rows_per_warpgroup // 64
    assert len(qk) >= atoms * d // 16 and len(pv) >= atoms * k.block_n // 16, (len(qk), len(pv))
    assert sass.count("MUFU.EX2") >= k.rows_per_warpgroup * k.block_n // 128  # one per score a thread holds
    assert "UTMALDG" in sass and bool(re.search(r"\bSTS\b", sass)) == (k.p_in == "smem")
    assert not re.search(r"\b(LDL|STL)\b", sass)


@pytest.mark.slow
@pytest.mark.usefixtures("cutlass_build")
def test_the_builds_host_checks_agree_with_the_rules(lowered):
    """The template's fragment maps hold, and its key-block rule and GQA map (run from the build's shim in a child)
    equal attention.key_blocks and attention.kv_index (which the schedule test runs against the oracle)."""
    (dtype, d, causal, kv, kn), low, lib = lowered
    k = AttentionKnobs(**kn)
    cases = [(m, s) for s in (1, 63, 64, 65, 127, 128, 129, 200, 333, 1000) for m in range(-(-s // k.block_m))]
    heads = [(b, h, hq, hkv) for hq, hkv in ((8, 8), (8, 2), (8, 1), (6, 3)) for b in (0, 3) for h in range(hq)]
    got = attention.fragment_check(lib, cases, heads)
    assert got["fragment_violations"] == 0
    assert [tuple(x) for x in got["key_blocks"]] == [attention.key_blocks(k, m, s, bool(causal)) for m, s in cases]
    assert got["kv_index"] == [attention.kv_index(*h) for h in heads]


@pytest.mark.slow
@pytest.mark.usefixtures("cutlass_build")
def test_lower_only_capture_through_the_cli(tmp_path):
    """`mosaic capture --lang cutlass --family attention --lower-only` (the default configuration: cached by the
    table above)."""
    from mosaic.bundle import load_bundle

    out = tmp_path / "attn.bundle"
    env = {**os.environ, "MOSAIC_LOAD_PLUGINS": "hopper,cutlass"}
    p = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "capture", "--lang", "cutlass",
                        "--family", "attention", "--shape", "batch=2,seq=1000,heads=8,head_dim=128", "--dtype", "bf16",
                        "--lower-only", "-o", str(out)], capture_output=True, text=True, env=env, timeout=1600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("lowered: ")
    b = load_bundle(out)
    assert b.manifest["capture"]["status"] == "lowered"
    assert "HGMMA" in b.read_text("sass") and "MUFU.EX2" in b.read_text("sass")
    assert "Config<cutlass::bfloat16_t, 128, 128, 128, 2, 2" in b.read_text("source")
    low = b.read_json("metrics")
    assert low["resources"]["spill_stores"] == 0 and "fragment_maps ok" in low["notes"]


def test_knob_dependencies_mend_refused_edits(gpus):
    from mosaic.proposers.dependencies import dependencies_of, violations

    deps = dependencies_of(AttentionKnobs)
    spec = _spec("bf16", 128, {})
    assert violations(deps, AttentionKnobs, attrs.asdict(AttentionKnobs()), spec, gpus["h200"]) == []
    assert violations(deps, AttentionKnobs, {"block_m": 64}, spec, gpus["h200"]) == ["CUTLASS-ATT-ROWS"]
