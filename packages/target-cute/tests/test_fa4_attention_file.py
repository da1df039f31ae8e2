"""flash-attn-4's Hopper forward as a kernel file (issue 34): examples/kernels/cute/fa4_attention.py is our adapter whose
entry builds flash-attn-4's own ``FlashAttentionForwardSm90`` (the installed package, 4.0.0b36 in .venv) with the knobs
as flash-attn's sm_90 tuning parameters. Without a GPU: its contract reads without importing it; it lowers for sm_90a
through `mosaic capture --file --lower-only` into SASS with both HGMMA forms of the key loop (S = Q K^T from shared
memory, O += P V with P from registers) and the softmax's MUFU.EX2; its kernel is the one flash-attn's own entry
(``interface._flash_attn_fwd`` under torch's FakeTensorMode, cross-compiling for sm_90a) compiles for the same problem,
PTX for PTX; `mosaic diff` ranks it against the project's own CuTe attention; the preview of `mosaic run --reference`
lowers it; and a value or a combination it does not build is one error line, exit 2. The tests that import flash-attn
skip with the reason where it is not installed (.venv312)."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.bundle import load_bundle

pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl")

ROOT = Path(__file__).resolve().parents[3]
ADAPTER = ROOT / "examples" / "kernels" / "cute" / "fa4_attention.py"
SHAPE = "batch=2,seq=2048,heads=32,head_dim=128"


def has_fa4() -> bool:
    try:
        return importlib.util.find_spec("flash_attn.cute.flash_fwd_sm90") is not None
    except (ImportError, ValueError):
        return False


needs_fa4 = pytest.mark.skipif(not has_fa4(), reason="needs flash-attn-4 (pip install flash-attn-4==4.0.0b36; "
                               "requirements/dev.txt puts it in .venv)")


def mosaic(*args, cwd, timeout=900, env=None):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)


def lower(tmp_path, out, *knobs, shape=SHAPE):
    args = [a for k in knobs for a in ("--knob", k)]
    return mosaic("capture", "--file", str(ADAPTER), "--lang", "cute", "--family", "attention", "--shape", shape,
                  "--dtype", "bf16", *args, "--lower-only", "--gpu", "h200", "-o", out, "--force", cwd=tmp_path)


def one_line(p):
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), lines
    assert "Traceback" not in p.stderr
    return lines[0]


def no_gpu():
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: mosaic run would run the live campaign, not the preview")


def test_the_contract_reads_without_importing_the_file():
    from mosaic.kernel_files import read_kernel_file
    from mosaic.records import KernelSpec
    from mosaic_target_cute.kernel_file import full_shape, shape_knobs

    kf = read_kernel_file(ADAPTER)
    assert kf.syntax == "python" and kf.entry == "attention" and kf.knob_class == "Knobs"
    assert [o.text() for o in kf.inputs] == ["q[batch,heads,seq,head_dim]", "k[batch,kv_heads,seq,head_dim]",
                                             "v[batch,kv_heads,seq,head_dim]"]
    assert [o.text() for o in kf.outputs] == ["o[batch,heads,seq,head_dim]"]
    assert kf.knob_values({}) == {"tile_m": 0, "tile_n": 0, "mma_pv_is_rs": "auto", "intra_wg_overlap": "auto",
                                  "num_stages": 2, "pack_gqa": "auto", "causal": False}
    assert dict(kf.multiple_of) == {"head_dim": 8}
    kf.check_family(("batch", "seq", "heads", "head_dim"), {"kv_heads": "", "causal": ""})
    # the family's canonical shape drops kv_heads == heads and causal == 0: the operands still get their sizes
    plain = KernelSpec("attention", {"batch": 2, "seq": 64, "heads": 4, "head_dim": 64}, "bf16", "cute", {})
    assert full_shape(plain) == {"batch": 2, "seq": 64, "heads": 4, "head_dim": 64, "kv_heads": 4, "causal": 0}
    assert kf.inputs[1].shape(full_shape(plain)) == (2, 4, 64, 64)
    gqa = KernelSpec("attention", {"batch": 2, "seq": 64, "heads": 4, "head_dim": 64, "kv_heads": 2, "causal": 1},
                     "bf16", "cute", {"causal": False})  # a full knob set carries the default: the shape decides
    assert shape_knobs(kf, gqa)["causal"] is True and shape_knobs(kf, plain)["causal"] is False


@needs_fa4
def test_the_defaults_are_flash_attns_sm90_choices():
    from flash_attn.cute.interface import _tile_size_fwd_sm90

    spec = importlib.util.spec_from_file_location("fa4_attention_adapter", ADAPTER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for head_dim, causal in ((64, False), (96, False), (96, True), (128, False), (256, True)):
        want = _tile_size_fwd_sm90(head_dim, head_dim, causal, False)
        got = mod.fa4_config(mod.Knobs(causal=causal), head_dim, 1)
        assert (got["tile_m"], got["tile_n"], got["mma_pv_is_rs"], got["intra_wg_overlap"]) == \
            (want.m_block_size, want.n_block_size, want.mma_pv_is_rs, want.intra_wg_overlap)
        assert got["pack_gqa"] is False and mod.fa4_config(mod.Knobs(), head_dim, 4)["pack_gqa"] is True
    got = mod.fa4_config(mod.Knobs(tile_n=64, mma_pv_is_rs="false"), 128, 1)
    assert (got["tile_m"], got["tile_n"], got["mma_pv_is_rs"]) == (128, 64, False)  # a knob replaces one choice


@pytest.fixture(scope="module")
def fa4_bundle(tmp_path_factory):
    if not has_fa4():
        pytest.skip("needs flash-attn-4")
    tmp = tmp_path_factory.mktemp("fa4")
    p = lower(tmp, "fa4.bundle")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return tmp / "fa4.bundle"


HGMMA = re.compile(r"HGMMA\.(64x\d+x16)\.F32\.BF16 R\d+, (gdesc\[UR\d+\]|R\d+)")


@needs_fa4
def test_it_lowers_for_sm90a_with_both_hgmma_forms_and_mufu_ex2(fa4_bundle):
    b = load_bundle(fa4_bundle)
    assert b.manifest["capture"]["status"] == "lowered" and b.kernel.family == "attention"
    assert b.one("source").read_bytes() == ADAPTER.read_bytes()
    ptx = b.read_text("ptx")
    assert ".target sm_90a" in ptx and "FlashAttentionForwardSm90" in re.search(r"\.entry\s+(\w+)", ptx).group(1)
    sass = b.read_text("sass")
    forms = {(shape, "smem" if a.startswith("gdesc") else "registers") for shape, a in HGMMA.findall(sass)}
    # S = Q K^T (64 x tile_n 128, A = Q from shared memory) and O += P V (64 x head_dim 128, A = P in registers)
    assert forms == {("64x128x16", "smem"), ("64x128x16", "registers")}, forms
    assert sass.count("MUFU.EX2") >= 128  # one per score of the 64 x 128 tile per thread pair, twice (overlap)
    launch = json.loads(b.one("launch").read_text())  # read from the host code's cudaLaunchConfig_t
    assert launch["grid"] == [2048 // 128, 32, 2] and launch["block"] == [384, 1, 1] and launch["cluster"] == [1, 1, 1]
    # flash-attn's shared storage: Q 128x128, K and V 2 stages of 128x128 (bf16), its mbarriers, 1 KiB alignment
    assert 2 * 128 * 128 * 5 <= launch["dynamic_smem"] <= 2 * 128 * 128 * 5 + 2048, launch


@needs_fa4
def test_the_lift_reads_an_attention_kernel(fa4_bundle):
    p = mosaic("lift", "--json", str(fa4_bundle), cwd=fa4_bundle.parent)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    roles = {r["name"]: r for r in doc["roles"]}
    assert set(roles) == {"producer", "consumer"} and roles["consumer"]["warpgroups"] == 2
    f = {(x["key"], x["role"]): x["value"] for layer in doc["layers"].values() for x in layer}
    assert f[("mma.operands", "")] == ["registers", "smem"] and f[("mma.shape", "")] == ["m64n128k16"]
    assert f[("exp.form", "")] == ["approx"] and "F2FP.BF16.F32.PACK_AB" in f[("conversion.modes", "")]
    mix = f[("hot_loop.mix", "consumer")]
    assert mix["mma"] == 16 and mix["mufu"] >= 64, mix  # 8 k16 steps each for S and P V; an exp2 per score
    assert f[("grid", "")] == [16, 32, 2] and f[("smem.dynamic", "")] > 0  # the launch record, no GPU


@needs_fa4
def test_a_knob_reaches_the_compiled_kernel(tmp_path):
    p = lower(tmp_path, "t.bundle", "tile_n=64", "mma_pv_is_rs=false")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    sass = load_bundle(tmp_path / "t.bundle").read_text("sass")
    forms = {(shape, "smem" if a.startswith("gdesc") else "registers") for shape, a in HGMMA.findall(sass)}
    assert forms == {("64x64x16", "smem"), ("64x128x16", "smem")}, forms  # S is 64 x 64; P staged for P V


FA4_OWN = """
import os, sys
os.environ.update(FLASH_ATTENTION_ARCH="sm_90a", FLASH_ATTENTION_NUM_SMS="132", CUTE_DSL_ARCH="sm_90a",
                  CUTE_DSL_KEEP_PTX="1", CUTE_DSL_DUMP_DIR=sys.argv[1])
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flash_attn.cute.interface import _flash_attn_fwd
b, s, h, kv, d, causal = map(int, sys.argv[2:])
with FakeTensorMode():
    q = torch.empty(b, s, h, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.empty(b, s, kv, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    _flash_attn_fwd(q, k, v, causal=bool(causal))
"""


def kernel_body(ptx: str) -> str:
    body = ptx[ptx.index(".entry"):]
    body = re.sub(r"\.entry\s+\w+", ".entry K", body)
    return re.sub(r"\w+_param_(\d+)", r"P\1", body)


@needs_fa4
@pytest.mark.parametrize("shape", ["batch=2,seq=2048,heads=32,head_dim=128",
                                   "batch=2,seq=1000,heads=16,head_dim=64,kv_heads=4,causal=1"])
def test_the_kernel_is_the_one_flash_attn_func_compiles(tmp_path, shape):
    dims = dict(kv.split("=") for kv in shape.split(","))
    p = lower(tmp_path, "a.bundle", shape=shape)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ours = load_bundle(tmp_path / "a.bundle").read_text("ptx")
    dump = tmp_path / "fa4-own"
    dump.mkdir()
    args = [dims["batch"], dims["seq"], dims["heads"], dims.get("kv_heads", dims["heads"]), dims["head_dim"],
            dims.get("causal", "0")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTE_DSL", "FLASH_ATTENTION"))}
    r = subprocess.run([sys.executable, "-c", FA4_OWN, str(dump), *args], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = [f for f in dump.glob("*.ptx")]
    assert len(theirs) == 1, theirs
    assert kernel_body(ours) == kernel_body(theirs[0].read_text())  # the same device code, line for line


@needs_fa4
def test_refusals_are_one_line(tmp_path):
    cases = [
        (["tile_m=256"], r"knob class Knobs refused .*tile_m=256: one of 64, 128, 192"),
        # flash-attn builds this combination, but its shared storage is 336 KiB: the H200 record refuses it
        (["tile_m=192", "tile_n=192", "num_stages=3"], r"does not fit h200: \[smem-per-block\] fa4_attention\.py: "
                                                       r"346112 B of shared memory exceed h200's 232448 B"),
        (["causal=true"], r"knob causal=True of fa4_attention\.py contradicts the problem's causal=0"),
    ]
    for knobs, pattern in cases:
        line = one_line(lower(tmp_path, "r.bundle", *knobs))
        assert re.search(pattern, line), (knobs, line)
    line = one_line(lower(tmp_path, "r.bundle", shape="batch=1,seq=256,heads=2,head_dim=100"))
    assert re.search(r"cute\.compile failed: AssertionError: \(head_dim, head_dim_v\)=\(100, 100\) is not "
                     r"supported on SM90", line), line  # flash-attn's own _validate_head_dims


@needs_fa4
def test_the_diff_against_the_projects_cute_attention_ranks_rows(fa4_bundle, tmp_path):
    p = mosaic("capture", "--lang", "cute", "--family", "attention", "--shape", SHAPE, "--dtype", "bf16",
               "--lower-only", "--gpu", "h200", "-o", "own.bundle", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    p = mosaic("diff", "--json", str(fa4_bundle), "own.bundle", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(p.stdout)["rows"]
    assert rows and [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    keys = {r["key"] for r in rows}
    assert "warp_role_branches" in keys  # flash-attn: one role branch; ours: three
    assert not keys & {"mma.operands", "mma.shape", "exp.form"}  # the same wgmma forms and exp2 on both sides


@needs_fa4
def test_the_preview_lowers_the_reference_file(tmp_path):
    no_gpu()
    p = mosaic("run", "--reference", str(ADAPTER), "--source", "cute", "--target", "pallas", "--family", "attention",
               "--shape", SHAPE, "--dtype", "bf16", "--quiet", "--out", "camp", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    prev = json.loads((tmp_path / "camp" / "preview.json").read_text())
    c = prev["campaign"]
    assert (c["source"], c["target"], c["family"], c["reference"]) == ("cute", "pallas", "attention", str(ADAPTER))
    ref = prev["reference"]
    assert ref["file"] == "fa4_attention.py" and ref["recorded_time_ns"] is None
    rb = load_bundle(tmp_path / "camp" / "bundles" / "reference.bundle")
    assert "FlashAttentionForwardSm90" in rb.read_text("ptx") and rb.one("launch") is not None
    skipped = {s["step"]: s["why"] for s in prev["skipped"]}
    if importlib.util.find_spec("jax") is None:  # .venv: the Pallas start kernel needs jax (.venv312)
        assert prev["naive"]["status"] == "failed" and "No module named 'jax'" in prev["naive"]["message"]
        assert "diff and proposals" in skipped
    assert not (tmp_path / "camp" / "journal.jsonl").exists()
    # to the project's CuTe attention (the cute template as the start) every step without a GPU runs here
    p = mosaic("run", "--reference", str(ADAPTER), "--target", "cute", "--family", "attention", "--shape", SHAPE,
               "--dtype", "bf16", "--quiet", "--out", "cute", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    prev = json.loads((tmp_path / "cute" / "preview.json").read_text())
    assert prev["naive"]["status"] == "lowered" and prev["rows"], prev.get("skipped")
    keys = [r["key"] for r in prev["rows"]]
    # both kernels run a 2-stage K/V ring: no pipeline.stages row (lift once read the key loop's trip count, 32, as
    # the stage count); what differs is the producer's unrolled loop and the consumer's hot loop
    assert "pipeline.stages" not in keys and keys[0] == "loop.unroll", keys
