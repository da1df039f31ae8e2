"""The AMK VM's one source builds for sm_80, sm_90a and sm_100a (the arch from a GpuTarget record: B200 ->
sm_100a; sm_80 has no record, it is named by arch) with nvcc on the CPU; ptxas's resource figures per arch are
printed (pytest -s) and checked; the SASS of each arch holds its own L2 prefetch (UBLKPF on sm_90+, the per-line
CCTL fallback on sm_80); the weight stream (TMA + mbarrier) is refused for sm_80 by rule, before nvcc runs."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from mosaic.toolchain.tools import find_tool
from mosaic_amk.cuda import build as B

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (the VM build needs it)")


def _b200():
    blackwell = pytest.importorskip("mosaic_gpu_blackwell.targets")
    return blackwell.B200


@pytest.fixture(scope="module")
def builds(private_cache):
    got = {"sm_80": B.build(512, arch="sm_80"), "sm_90a": B.build(512), "sm_100a": B.build(512, gpu=_b200())}
    for arch, b in got.items():
        print(f"\nAMK VM {arch}: {b.registers} registers, {b.smem_bytes} B static smem, spill stores "
              f"{b.spill_stores} B / loads {b.spill_loads} B, stack {b.stack_bytes} B")
    return got


def _sass(cubin) -> str:
    tool = find_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not found (pip nvidia-cuda-cuobjdump or the CUDA toolkit)")
    return subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True, timeout=120).stdout


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
def test_builds_with_resources(builds, arch):
    b = builds[arch]
    assert b.arch == arch and b.cubin.read_bytes()[:4] == b"\x7fELF"
    assert f"Compiling entry function 'amk_vm' for '{arch}'" in b.ptxas_log
    assert 32 <= b.registers <= 65536 // 512, b.registers  # one 512-thread block per SM on every arch
    if arch != "sm_80":  # sm_80's 128-register cap spills a few words (recorded, not hidden)
        assert b.spill_stores == b.spill_loads == b.stack_bytes == 0, b.ptxas_log
    assert b.to_json()["arch"] == arch


@needs_nvcc
def test_keys_differ_per_arch(builds):
    assert len({b.key for b in builds.values()}) == 3
    assert len({str(b.cubin) for b in builds.values()}) == 3


@needs_nvcc
def test_sass_per_arch(builds):
    for arch, b in builds.items():
        sass = _sass(b.cubin)
        assert re.search(rf"\.target\s+{arch}\b", sass), (arch, sass[:400])
        ops = set(re.findall(r"\b((?:UBLKPF|CCTL|LDGSTS|REDG?)[A-Z0-9._]*)", sass))
        assert any(o.startswith("LDGSTS") for o in ops), (arch, ops)  # attention's cp.async staging
        assert any(o.startswith(("RED.E.ADD.S32", "REDG.E.ADD.S32")) for o in ops), (arch, ops)  # the task signal
        if arch == "sm_80":  # prefetch.global.L2 per line (CCTL.E.PF2), no bulk prefetch
            assert "CCTL.E.PF2" in ops and not any(o.startswith("UBLKPF") for o in ops), ops
        else:
            assert any(o.startswith("UBLKPF") for o in ops), ops  # cp.async.bulk.prefetch.L2


def test_sm80_refuses_weight_stream_by_rule():
    with pytest.raises(B.BuildError, match=r"AMK_WSTREAM cannot build for sm_80: .*cp.async.bulk"):
        B.build(512, arch="sm_80", defines=("AMK_WSTREAM=2",))
    assert B.refusal(B.ARCHES["sm_80"], ("AMK_WSTREAM=0",)) is None
    assert B.refusal(B.ARCHES["sm_100a"], ("AMK_WSTREAM=2",)) is None


def test_arch_from_record_and_bad_arch():
    assert B.vm_arch(gpu=_b200()).arch == "sm_100a"
    assert B.vm_arch().arch == "sm_90a"
    assert "-gencode=arch=compute_100a,code=sm_100a" in B.flags(512, (), "sm_100a")
    with pytest.raises(B.BuildError, match="does not build for sm_70"):
        B.vm_arch("sm_70")
    with pytest.raises(B.BuildError, match="contradicts"):
        B.vm_arch("sm_80", gpu=_b200())
