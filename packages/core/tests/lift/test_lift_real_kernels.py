"""Lifter rules that real kernels written by others needed (corpus/truth/artifacts, compiled here for sm_90a):
Triton's stage wrap and its one mbarrier ring per group of loads, flash-attn-4's K and V pipelines, and
ptxas's integer division, which is no floating-point divide."""

from __future__ import annotations

import lzma
import subprocess

import pytest
from mosaic.lift.inputs import lift_path
from mosaic.toolchain.tools import find_tool

from ._corpus import CORPUS

ART = CORPUS / "truth" / "artifacts"


def _unpacked(tmp_path, rel: str):
    out = tmp_path / rel.rsplit("/", 1)[-1].removesuffix(".xz")
    out.write_bytes(lzma.decompress((ART / rel).read_bytes()))
    return out


def _feature(fp, key, role=""):
    feat = fp.get(key, role)
    return None if feat is None else feat.value


@pytest.mark.parametrize("stages", [2, 3])
def test_triton_swiglu_ptx_reads_its_num_stages_and_no_unroll(tmp_path, stages):
    fp = lift_path(_unpacked(tmp_path, f"triton/triton-liger-swiglu-64x128x64-w4-s{stages}.ptx.xz"))
    feat = fp.get("pipeline.stages", "all")
    assert feat.value == stages and "S1" in feat.where  # setp.gt.s32 p, next, N-1; selp.b32 idx, 0, next, p
    assert _feature(fp, "loop.unroll", "all") == 1  # two rings (input+gate, up), one wait on each per trip
    assert _feature(fp, "mma.form") == ["wgmma"] and _feature(fp, "transfer.form") == ["tma"]


@pytest.mark.skipif(find_tool("nvdisasm") is None, reason="no nvdisasm for the cubin")
def test_flash_attention_consumer_steps_one_k_and_one_v_stage_per_trip(tmp_path):
    fp = lift_path(_unpacked(tmp_path, "flash/flash4-fwd-sm90-hdim128-128x128-causal.cubin.xz"))
    assert _feature(fp, "roles.registers") == {"producer": 24, "consumer": 240}
    assert _feature(fp, "loop.unroll", "consumer") == 1 and _feature(fp, "loop.unroll", "producer") == 1
    assert _feature(fp, "pipeline.stages", "consumer") == 2


@pytest.mark.skipif(find_tool("nvcc") is None, reason="no nvcc")
def test_integer_division_is_no_floating_point_divide(tmp_path):
    src = CORPUS / "truth" / "cuda" / "intdiv.cu"
    out = tmp_path / "intdiv.cubin"
    subprocess.run([find_tool("nvcc"), "-cubin", "-arch=sm_90a", "-O3", "-o", str(out), str(src)], check=True, timeout=300)
    fp = lift_path(out)
    assert _feature(fp, "div.form") == []  # I2F.U32.RP + MUFU.RCP is ptxas's integer divide
    fdiv = tmp_path / "fdiv.cu"
    fdiv.write_text(src.read_text().replace("int v = idx[i];", "float v = __int_as_float(idx[i]);")
                    .replace("row[i] = v / width;", "row[i] = __float_as_int(__fdividef(v, (float)width));")
                    .replace("col[i] = v % width;", "col[i] = 0;"))
    subprocess.run([find_tool("nvcc"), "-cubin", "-arch=sm_90a", "-O3", "-o", str(tmp_path / "f.cubin"), str(fdiv)], check=True,
                   timeout=300)
    assert _feature(lift_path(tmp_path / "f.cubin"), "div.form") == ["approx"]  # the fast float divide still is one


@pytest.mark.skipif(find_tool("nvdisasm") is None, reason="no nvdisasm for the cubin")
def test_blackwell_flash_attention_role_switch_is_followed_through_its_jump_table(tmp_path):
    """flash-attn-4's sm_100a forward dispatches its warp roles with a switch ptxas compiles to ``BRX R4 -0x980
    (*"BRANCH_TARGETS .L_x_315,.L_x_316,.L_x_6"*)``; without the annotation's targets the tcgen05 MMA warp and
    the epilogue were unreachable (mma.form [])."""
    cubin = _unpacked(tmp_path, "flash/flash4-fwd-sm100-hdim128-causal.cubin.xz")
    fp = lift_path(cubin)
    assert _feature(fp, "mma.form") == ["tcgen05"]
    assert _feature(fp, "transfer.store_form") == ["tma"]
    from mosaic.lift.sass import parse_sass
    from mosaic.toolchain.nvdisasm import disassemble

    prog = max(parse_sass(disassemble(cubin)).values(), key=lambda p: len(p.instructions))
    brx = [i for i in prog.instructions if i.opcode == "BRX"]
    assert brx and all(len(i.targets) == 3 and all(t in prog.labels for t in i.targets) for i in brx)
