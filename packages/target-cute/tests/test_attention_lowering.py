"""The CuTe attention forward lowered for sm_90a on the CPU (no GPU), checked against the H200 record.

Each configuration of :data:`CONFIGS` is lowered once per module (cute.compile with fake tensors, ptxas -v,
nvdisasm) and its figures are held to what this file records: ptxas's registers (the launch's count: setmaxnreg
kernels get the most their launch bounds allow), shared memory (equal to the budget's estimate), and the key
loop of the SASS -- the loop that holds the HGMMAs -- carrying both matrix products (S = Q K^T from shared
memory, O += P V with P from registers or shared memory and V transposed) in the proportion one key block asks,
and one MUFU.EX2 per score plus one per row rescale. Numerics are not checked here: CuTe DSL has no CPU
interpreter (tests/test_attention_schedule.py checks the kernel's block schedule against the oracle in numpy).
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.plugins import PluginHost
from mosaic.records import KernelSpec
from mosaic.toolchain.tools import find_tool
from mosaic_target_cute import budget
from mosaic_target_cute.backend import CuteBackend
from mosaic_target_cute.knobs import AttentionKnobs, AttentionShape

pytest.importorskip("cutlass.cute",
                    reason="needs nvidia-cutlass-dsl (Python >= 3.12): run in .venv312 (make test does)")

BASE = {"batch": 4, "seq": 4096, "heads": 32, "head_dim": 128}
#: name -> (shape, knobs, dtype, ptxas registers, shared memory bytes (static + dynamic)) as lowered on 2026-12-07
#: with nvidia-cutlass-dsl 4.8.1 and ptxas 13.0 for the h200 record
CONFIGS = {
    "mha-128x128-s2": (BASE, {}, "bf16", 168, 165888),
    "causal-128x176-s2": ({**BASE, "causal": 1}, {"block_n": 176}, "bf16", 168, 215040),
    "gqa8-p-smem": ({**BASE, "kv_heads": 8}, {"p_in": "smem"}, "bf16", 168, 198656),
    "causal-pingpong": ({**BASE, "causal": 1}, {"pingpong": True}, "bf16", 168, 165888),
    "one-wg-64x64-s4-tail-f16": ({**BASE, "seq": 4000}, {"block_m": 64, "block_n": 64, "stages": 4,
                                                        "consumer_warpgroups": 1, "producer_regs": 56,
                                                        "consumer_regs": 256}, "f16", 255, 149504),
    "d64-three-wg-causal-gqa": ({**BASE, "head_dim": 64, "causal": 1, "kv_heads": 8},
                                {"block_m": 192, "consumer_warpgroups": 3, "producer_regs": 32,
                                 "consumer_regs": 160}, "bf16", 128, 92160),
    "d64-256x64-128rows-per-wg": ({**BASE, "head_dim": 64, "seq": 2048}, {"block_m": 256, "block_n": 64},
                                  "bf16", 168, 67584),
    "persistent-causal-gqa-s3": ({**BASE, "causal": 1, "kv_heads": 8}, {"persistent": True, "stages": 3},
                                 "bf16", 168, 231424),
}
#: SS form ``HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], ...``, RS form ``... R88, R24, gdesc[UR8].tnspB, R88`` (f16: no
#: ``.F16`` suffix)
HGMMA_RE = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)\.F32(?:\.BF16)? R\d+, (R\d+, )?gdesc\[[^\]]*\](\.tnspB)?")


@pytest.fixture(scope="module")
def h200():
    return PluginHost(allow="hopper").load().get("gpus", "h200")


def _spec(shape, knobs, dtype="bf16"):
    return KernelSpec(family="attention", shape=shape, dtype=dtype, language="cute", knobs=knobs, name="attn")


@pytest.fixture(scope="module")
def lowered(h200, tmp_path_factory):
    """Every configuration lowered once: name -> (Lowered, notes dict)."""
    out = {}
    for name, (shape, knobs, dtype, _, _) in CONFIGS.items():
        low = CuteBackend().lower(_spec(shape, knobs, dtype), h200, tmp_path_factory.mktemp(name))
        out[name] = (low, dict(n.split("=", 1) for n in low.notes if re.match(r"^\w+=", n)))
    return out


def key_loop(sass: str) -> str:
    """The text of the key-block loop: the shortest SASS region from a label to a branch back to it that holds
    HGMMAs of two forms (both matrix products). Out-of-line mbarrier retry paths also branch backwards, from the
    end of the kernel into its middle: those regions are long, hence the shortest."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
    best = None
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)]:i + 1]
            if len(hgmma_forms("\n".join(body))) >= 2 and (best is None or len(body) < len(best)):
                best = body
    return "\n".join(best or [])


def hgmma_forms(text: str) -> dict:
    """(m, n, k, A operand: 'smem' | 'registers', B transposed) -> count."""
    forms: dict = {}
    for m in HGMMA_RE.finditer(text):
        key = (int(m.group(1)), int(m.group(2)), int(m.group(3)),
               "registers" if m.group(4) else "smem", bool(m.group(5)))
        forms[key] = forms.get(key, 0) + 1
    return forms


@pytest.mark.parametrize("name", list(CONFIGS))
def test_lowered_figures_are_the_recorded_ones(name, lowered, h200):
    shape, knobs, dtype, registers, smem = CONFIGS[name]
    low, notes = lowered[name]
    k, s = AttentionKnobs(**knobs), AttentionShape.from_shape(shape)
    assert ".target sm_90a" in low.ptx.read_text()
    assert low.resources.registers == registers
    assert low.resources.static_smem + int(notes["dynamic_smem"]) == smem == budget.attention_smem_bytes(k, s)
    assert int(notes["threads"]) == k.threads
    tiles = -(-s.seq // k.block_m) * s.batch * s.heads
    assert int(notes["grid_ctas"]) == (min(h200.sm_count, tiles) if k.persistent else tiles)
    assert notes["spill_stores"].startswith("0 ")  # "0 spill_loads=0": nothing spills
    if find_tool("ptxas"):
        assert f"Used {registers} registers" in low.ptxas_log.read_text()
    assert low.source.name == "hopper_attention.py"


@pytest.mark.skipif(not find_tool("nvdisasm"), reason="needs nvdisasm (pip nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("name", list(CONFIGS))
def test_key_loop_holds_both_products_and_the_exp2s(name, lowered):
    shape, knobs, _, _, _ = CONFIGS[name]
    k, s = AttentionKnobs(**knobs), AttentionShape.from_shape(shape)
    sass = lowered[name][0].sass.read_text()
    for op in ("UTMALDG", "UTMASTG", "USETMAXREG", "SYNCS.PHASECHK", "STSM", "SHFL.BFLY"):
        assert op in sass, op
    loop = key_loop(sass)
    forms = hgmma_forms(loop)
    qk = (64, k.block_n, 16, "smem", False)  # S = Q K^T: both operands K-major in shared memory
    pv = (64, s.head_dim, 16, "registers" if k.p_in == "registers" else "smem", True)  # O += P V, V MN-major
    assert set(forms) == {qk, pv}, forms
    if k.block_n != s.head_dim:
        assert qk[:3] != pv[:3]  # two HGMMA shapes
    rows = k.rows_per_warpgroup
    m_tiles = rows // 64  # 64-row wgmma tiles per warpgroup
    # per key block and warpgroup: head_dim/16 HGMMAs of S and block_n/16 of PV per 64-row tile (times the loop's
    # unrolling)
    unroll = forms[qk] // (m_tiles * s.head_dim // 16)
    assert unroll >= 1 and forms[qk] == unroll * m_tiles * s.head_dim // 16
    assert forms[pv] == unroll * m_tiles * k.block_n // 16
    # one exp2 per score the thread holds, one per row for the O rescale (a thread holds 2 rows of a 64-row tile)
    scores, own_rows = rows * k.block_n // 128, 2 * m_tiles
    assert loop.count("MUFU.EX2") == unroll * (scores + own_rows)


def test_causal_masks_where_the_plain_kernel_does_not(lowered):
    """A causal kernel has a masked key loop besides the plain one: twice the HGMMAs of the same problem."""
    plain = hgmma_forms(lowered["mha-128x128-s2"][0].sass.read_text())
    causal = hgmma_forms(lowered["causal-pingpong"][0].sass.read_text())
    assert set(plain) == set(causal) and all(causal[f] == 2 * plain[f] for f in plain)


def test_pingpong_takes_turns_on_named_barriers(lowered):
    ptx = lowered["causal-pingpong"][0].ptx.read_text()
    plain = lowered["mha-128x128-s2"][0].ptx.read_text()
    # the second consumer warpgroup hands the first turn over; each turn is a bar.sync / bar.arrive over 256 threads
    assert re.search(r"bar\.arrive\s+5, 256;", ptx)
    assert len(re.findall(r"bar\.sync\s+%r\d+, 256;", ptx)) >= 2
    assert len(re.findall(r"bar\.arrive\s+%r\d+, 256;", ptx)) >= 2
    assert not re.search(r"bar\.(sync|arrive)\s+%r\d+, 256;", plain)


def test_p_staged_in_smem_fences_and_syncs_its_warpgroup(lowered):
    ptx = lowered["gqa8-p-smem"][0].ptx.read_text()
    assert re.search(r"bar\.sync\s+%r\d+, 128;", ptx)  # BAR_P + warpgroup, 128 threads
    assert "fence.proxy.async.shared::cta" in ptx
    assert "stmatrix.sync.aligned" in ptx


def test_naive_attention_has_no_tma_no_wgmma_no_smem(h200, tmp_path):
    shape = {"batch": 1, "seq": 1000, "heads": 4, "head_dim": 64, "kv_heads": 2, "causal": 1}
    low = CuteBackend().lower(_spec(shape, {"kernel": "naive"}), h200, tmp_path)
    ptx = low.ptx.read_text()
    assert low.source.name == "naive_attention.py"
    assert re.search(r"ld\.global", ptx) and re.search(r"ex2\.approx", ptx) and re.search(r"fma\.rn\.f32", ptx)
    for absent in ("wgmma", "cp.async", "mbarrier", ".shared", "setmaxnreg"):
        assert absent not in ptx, absent
    assert low.resources.static_smem == 0
    notes = dict(n.split("=", 1) for n in low.notes if re.match(r"^\w+=", n))
    assert notes["threads"] == "128" and notes["grid_ctas"] == str(8 * 4)  # ceil(1000 / 128) x heads


def test_capture_lower_only_writes_an_attention_bundle(tmp_path):
    """The command line of the issue, with no GPU: PTX, SASS, cubin and the ptxas log in the bundle."""
    mosaic = Path(sys.executable).with_name("mosaic")
    out = tmp_path / "attn.bundle"
    run = subprocess.run([str(mosaic), "capture", "--lang", "cute", "--family", "attention", "--shape",
                          "batch=4,seq=4096,heads=32,head_dim=128", "--dtype", "bf16", "--lower-only", "-o", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    names = {p.name for p in out.iterdir()}
    assert {"kernel.ptx.xz", "kernel.sass.xz", "kernel.cubin.xz", "ptxas.log", "lowering.json"} <= names
    assert "Used 168 registers" in (out / "ptxas.log").read_text()
