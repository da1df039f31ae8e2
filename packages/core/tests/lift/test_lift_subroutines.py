"""SASS with called subroutines, convergence barriers and uniform-datapath branches lifts.

ptxas emits the slow paths of IEEE division, ``sqrtf`` and reciprocals as subroutines: ``CALL.REL.NOINC
`($__internal_0_$__cuda_sm3x_div_rn_noftz_f32_slowpath)`` in the kernel, ``RET.REL.NODEC R12 `(kernel)`` at the
end of the subroutine (the label names the function it returns into, not a jump target). The kernels here are
compiled by nvcc at test time; the listing below is written by hand for machines without it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from mosaic.lift.cfg import build_cfg
from mosaic.lift.fingerprint import lift_program
from mosaic.lift.inputs import lift_path
from mosaic.lift.sass import parse_sass

DIVIDE = """
extern "C" __global__ void divsum(const float* x, const float* y, float* out, int n) {
  float acc = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) acc += x[j] / y[j];
  out[threadIdx.x] = acc;
}
"""
RSQRT = """
extern "C" __global__ void rsq(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 1.0f / sqrtf(x[i]);
}
"""

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def compile_cubin(tmp_path: Path, name: str, source: str) -> Path:
    src = tmp_path / f"{name}.cu"
    src.write_text(source)
    out = tmp_path / f"{name}.cubin"
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-o", str(out), str(src)], check=True,
                   capture_output=True, timeout=300)
    return out


@needs_nvcc
def test_ieee_divide_with_its_slow_path_subroutine_lifts(tmp_path):
    fp = lift_path(compile_cubin(tmp_path, "divsum", DIVIDE))
    assert fp.kernel == "divsum"
    assert fp.get("div.form").value == ["ieee"]
    # the j-loop is the kernel's one work loop; the subroutine's code is no loop of the kernel
    assert fp.get("loops.depth").value == 1
    mix = fp.get("hot_loop.mix", "all").value
    assert mix.get("ld.global") == 2.0


@needs_nvcc
def test_rsqrt_with_two_slow_path_subroutines_lifts(tmp_path):
    fp = lift_path(compile_cubin(tmp_path, "rsq", RSQRT))
    assert fp.kernel == "rsq"
    assert fp.get("loops.depth").value == 0
    assert fp.get("div.form").value == ["ieee"]  # 1.0f / x rounds to nearest: the rcp_rn slow path


LISTING = """
        .section .text.k,"ax",@progbits
k:
.text.k:
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   WARPSYNC.ALL ;
        /*0020*/                   BSSY B0, `(.L_x_0) ;
        /*0030*/                   ISETP.GT.AND P0, PT, R0, 0x3, PT ;
        /*0040*/               @P0 BRA `(.L_x_1) ;
        /*0050*/                   MOV R12, 0x70 ;
        /*0060*/                   CALL.REL.NOINC `($__internal_0_slowpath) ;
.L_x_1:
        /*0070*/                   BSYNC B0 ;
.L_x_0:
        /*0080*/                   UISETP.NE.AND UP0, UPT, UR4, 0x1, UPT ;
        /*0090*/               @UP0 BRA.U `(.L_x_2) ;
        /*00a0*/                   NOP ;
.L_x_2:
        /*00b0*/                   CALL.ABS.NOINC `(vprintf) ;
        /*00c0*/                   EXIT ;
$__internal_0_slowpath:
        /*00d0*/                   FADD R0, R0, 1 ;
        /*00e0*/                   RET.REL.NODEC R12 `(k) ;
.L_x_3:
        /*00f0*/                   BRA `(.L_x_3);
"""


def test_call_ret_bssy_warpsync_and_uniform_branches_parse():
    prog = parse_sass(LISTING)["k"]
    ops = [i.full for i in prog.instructions]
    assert "RET.REL.NODEC" in ops and "WARPSYNC.ALL" in ops
    ret = next(i for i in prog.instructions if i.opcode == "RET")
    assert ret.targets == () and ret.opclass == "return"
    ext = next(i for i in prog.instructions if i.full == "CALL.ABS.NOINC")
    assert ext.targets == ()  # an external function, not a label of the listing
    cfg = build_cfg(prog)
    call = next(i for i in prog.instructions if i.full == "CALL.REL.NOINC")
    entry = cfg.block_of[prog.labels["$__internal_0_slowpath"]]
    assert cfg.subroutines == {"$__internal_0_slowpath": entry}
    blk = cfg.blocks[cfg.block_of[call.index]]
    assert set(blk.succs) == {entry, cfg.block_of[call.index + 1]}  # into the subroutine, and back after it
    assert cfg.blocks[cfg.block_of[ret.index]].succs == []  # RET returns; it jumps to no label
    assert entry in cfg.reachable
    assert not cfg.loops or all(entry not in lp.blocks for lp in cfg.loops if lp.header in cfg.reachable)
    fp = lift_program(prog)
    assert fp.get("loops.depth").value == 0


TMEM = (Path(__file__).resolve().parent / "corpus" / "truth" / "cuda" / "tmem.cu").read_text()


@needs_nvcc
def test_blackwell_tmem_kernel_with_uniform_branches_lifts(tmp_path):
    # sm_100's uniform branches carry their condition as an operand (``BRA.U !UP0, `(.L_x_4)``): read as
    # unconditional, the k-loop was unreachable and the kernel had no loop
    src = tmp_path / "tmem.cu"
    src.write_text(TMEM)
    out = tmp_path / "tmem.cubin"
    subprocess.run(["nvcc", "-cubin", "-arch=sm_100a", "-O3", "-o", str(out), str(src)], check=True,
                   capture_output=True, timeout=300)
    fp = lift_path(out)
    assert fp.unknown_opcodes == {}
    assert fp.get("loops.depth").value == 1
    assert "tmem" in fp.get("hot_loop.mix", "all").value
    assert [r["name"] for r in fp.roles] == ["all"]  # warp 0's tcgen05.alloc retry is setup, not a role
    assert fp.get("persistent").value is False
    assert fp.get("transfer.store_form").value == ["st.global"]  # the allocator's ATOMS is no result store


def test_predicate_operand_makes_a_branch_conditional():
    prog = parse_sass("""
        .section .text.k,"ax",@progbits
.text.k:
        /*0000*/                   UISETP.NE.AND UP0, UPT, UR4, 0x1, UPT ;
        /*0010*/                   BRA.U !UP0, `(.L_x_1) ;
        /*0020*/                   NOP ;
.L_x_1:
        /*0030*/                   EXIT ;
""")["k"]
    bra = prog.instructions[1]
    assert bra.pred == "!UP0" and bra.predicated
    cfg = build_cfg(prog)
    assert len(cfg.blocks[cfg.block_of[1]].succs) == 2
