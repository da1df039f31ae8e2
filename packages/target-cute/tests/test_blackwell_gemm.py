"""The project's Blackwell CuTe GEMM lowers for sm_100a on a machine with no GPU (issue 37).

Each configuration is compiled by cute.compile for sm_100a (PTX + cubin), its PTX re-assembled by ptxas
-v for sm_100a (registers, shared memory), its cubin disassembled: the SASS must issue tcgen05 MMAs
(UTCHMMA, .2CTA with a CTA pair), read tensor memory (LDTM), allocate it (UTCATOMSWS) and commit to
mbarriers (UTCBAR); the cubin's ELF must name sm_100a. Configurations the budget rules refuse are checked
to come back with their rule code. Runs in the py3.12 env with the CuTe DSL; skips elsewhere.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("cutlass")
pytest.importorskip("mosaic_gpu_blackwell")

from mosaic_gpu_blackwell.targets import B200  # noqa: E402
from mosaic_target_cute import blackwell_budget  # noqa: E402
from mosaic_target_cute.knobs import GemmKnobs  # noqa: E402

MNK = (1024, 1024, 512)


def _bw(**kw) -> GemmKnobs:
    kw.setdefault("epi_tile", (128, 32))
    return GemmKnobs(kernel="blackwell", **kw)


#: name -> knobs of every configuration that must lower for sm_100a
CONFIGS = {
    "128x128-cg1-c1x1-s4": _bw(tile_mn=(128, 128), stages=4),
    "128x256-cg1-c1x1-s3": _bw(tile_mn=(128, 256), stages=3),
    "128x128-cg1-c2x1-s4-mcast": _bw(tile_mn=(128, 128), cluster_mn=(2, 1), stages=4),
    "128x128-cg2-c2x1-s4": _bw(tile_mn=(128, 128), cluster_mn=(2, 1), cta_group=2, stages=4),
    "128x256-cg2-c2x1-s4": _bw(tile_mn=(128, 256), cluster_mn=(2, 1), cta_group=2, stages=4, epi_tile=(128, 64)),
    "128x128-cg2-c2x2-s6": _bw(tile_mn=(128, 128), cluster_mn=(2, 2), cta_group=2, stages=6),
    "128x128-cg1-c2x2-s5": _bw(tile_mn=(128, 128), cluster_mn=(2, 2), stages=5),
    "128x256-cg2-c2x1-s4-persistent-acc2": _bw(tile_mn=(128, 256), cluster_mn=(2, 1), cta_group=2, stages=4,
                                               persistent=True, acc_stages=2),
}

#: name -> (knobs, the rule codes that must refuse it on the B200)
REFUSED = {
    "128x256-cg1-s8": (_bw(tile_mn=(128, 256), stages=8), {"smem-per-block"}),
    "128x256-acc3": (_bw(tile_mn=(128, 256), persistent=True, acc_stages=3), {"tmem-columns"}),
    "128x256-s7-acc4": (_bw(tile_mn=(128, 256), stages=7, persistent=True, acc_stages=4),
                        {"smem-per-block", "tmem-columns"}),
}

_RES = re.compile(r"Used (\d+) registers.*?(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def _tools():
    from mosaic.toolchain.tools import find_tool

    return find_tool("ptxas"), find_tool("nvdisasm")


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    from mosaic_target_cute.lowering import compile_gemm, disassemble, ptxas_log

    ptxas, nvdisasm = _tools()
    if ptxas is None:
        pytest.skip("ptxas not found")
    out = {}
    root = tmp_path_factory.mktemp("bw")
    for name, knobs in CONFIGS.items():
        assert not blackwell_budget.refusals(knobs, B200), name
        _, build = compile_gemm(knobs, *MNK, "bf16", B200.arch, B200.sm_count, root / name)
        log = ptxas_log(build.ptx, B200.arch, root / f"{name}.ptxas.log")
        sass = disassemble(build.cubin, root / f"{name}.sass") if nvdisasm else None
        out[name] = (build, log.read_text(), sass.read_text() if sass else None)
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_lowers_for_sm_100a(lowered, name):
    from mosaic.toolchain.cubin import read_cubin

    build, log, sass = lowered[name]
    knobs = CONFIGS[name]
    assert "for 'sm_100a'" in log
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    # ptxas -v of the kept PTX and the DSL's own cubin may differ by a few registers (its ptxas options)
    assert 0 < regs <= 255 and 0 < build.registers <= 255
    smem = build.static_smem + build.dynamic_smem
    assert smem <= B200.smem_per_block
    assert smem >= blackwell_budget.smem_bytes(knobs) - blackwell_budget.SMEM_OVERHEAD  # the slots are there
    elf = Path(build.cubin).read_bytes()
    assert b"sm_100a" in elf or read_cubin(elf)  # the ELF's arch
    print(f"{name}: ptxas registers={regs} cubin registers={build.registers} smem={smem} (static {build.static_smem} + dynamic {build.dynamic_smem})")
    if sass is None:
        pytest.skip("nvdisasm not found: SASS not checked")
    mma = "UTCHMMA.2CTA" if knobs.cta_group == 2 else "UTCHMMA "
    assert mma in sass
    for op in ("LDTM", "UTCATOMSWS", "UTCBAR", "UTMALDG"):
        assert op in sass, op
    assert "HGMMA" not in sass and "WARPGROUP" not in sass  # no Hopper wgmma left
    if knobs.cluster_mn != (1, 1):
        assert "MULTICAST" in sass


def test_cubin_arch_is_sm_100a(lowered):
    """The cubin's ELF header flags carry the SM number (100) for every configuration."""
    import struct

    for build, _, _ in lowered.values():
        elf = Path(build.cubin).read_bytes()
        assert elf[:4] == b"\x7fELF"
        flags = struct.unpack_from("<I", elf, 0x30)[0]
        assert flags & 0xFF == 100 or (flags >> 8) & 0xFF == 100, hex(flags)


@pytest.mark.parametrize("name", list(REFUSED))
def test_budget_refusals_name_the_rule(name):
    knobs, codes = REFUSED[name]
    got = {d.code for d in blackwell_budget.refusals(knobs, B200)}
    assert got == codes


def test_blackwell_refused_on_hopper_and_hopper_knobs_pick_blackwell():
    from mosaic_gpu_hopper.targets import H200

    assert {d.code for d in blackwell_budget.refusals(CONFIGS["128x128-cg1-c1x1-s4"], H200)} == {"CUTE-ARCH"}
    picked, note = blackwell_budget.for_gpu(GemmKnobs(tile_mn=(128, 256), stages=3), B200)
    assert picked.kernel == "blackwell" and picked.tile_mn == (128, 256) and "sm_100a" in note
    assert blackwell_budget.for_gpu(GemmKnobs(), H200) == (GemmKnobs(), None)


def test_knob_rules():
    from mosaic.errors import RecordError

    with pytest.raises(RecordError):
        _bw(tile_mn=(128, 128), cluster_mn=(1, 2), cta_group=2)  # a CTA pair needs cluster M of 2
    with pytest.raises(RecordError):
        _bw(tile_mn=(128, 128), acc_stages=2)  # a second accumulator stage needs a next tile
    with pytest.raises(RecordError):
        GemmKnobs(cta_group=2)  # hopper has no CTA pairs


def test_capture_lower_only_b200(tmp_path):
    """``mosaic capture --lang cute --gpu b200 --lower-only`` lowers the Blackwell kernel, not the Hopper one."""
    import lzma
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("mosaic")
    if not exe.exists() or shutil.which("ptxas") is None:
        pytest.skip("mosaic CLI or ptxas missing")
    out = tmp_path / "b.bundle"
    run = subprocess.run([str(exe), "capture", "--lang", "cute", "--family", "gemm", "--shape", "1024x1024x512",
                          "--dtype", "bf16", "--gpu", "b200", "--lower-only", "-o", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    ptx = lzma.decompress((out / "kernel.ptx.xz").read_bytes()).decode()
    assert ".target sm_100a" in ptx and "tcgen05.mma" in ptx and "wgmma" not in ptx


def test_hopper_attention_is_refused_for_b200_by_rule(tmp_path):
    """The project's CuTe attention is a wgmma kernel (sm_90a): for the B200 it is refused by rule CUTE-ARCH before
    anything compiles (it was the DSL's 'expects arch to be sm_90a'), the line naming kernel=naive (which lowers
    for sm_100a) and flash-attn-4's FlashAttentionForwardSm100 as the tcgen05 attention; naive still lowers."""
    from mosaic.backend import Unbuildable
    from mosaic.records import KernelSpec
    from mosaic_target_cute.backend import CuteBackend

    shape = {"batch": 1, "seq": 256, "heads": 2, "head_dim": 64}
    with pytest.raises(Unbuildable) as got:
        CuteBackend().lower(KernelSpec("attention", shape, "bf16", "cute", {}), B200, tmp_path / "h")
    line = got.value.line()
    assert line.startswith("[CUTE-ARCH]") and "sm_100a" in line and "kernel=naive" in line, line
    assert "FlashAttentionForwardSm100" in line and "\n" not in line
    assert not (tmp_path / "h" / "cute_dump").exists()  # refused before cute.compile
    low = CuteBackend().lower(KernelSpec("attention", shape, "bf16", "cute", {"kernel": "naive"}), B200, tmp_path / "n")
    assert low.cubin is not None
