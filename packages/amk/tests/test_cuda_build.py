"""The AMK CUDA VM builds for sm_90a with nvcc (no GPU needed): one compile per test session, cached by
source hash; ptxas must report no spills and no stack frame (no local memory), at most 128 registers
(one 512-thread block per SM), and the SASS must hold the 16-byte weight loads and the L2 bulk prefetch."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from mosaic.toolchain.tools import find_tool
from mosaic_amk.cuda import build as B

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (the VM build needs it)")


@pytest.fixture(scope="module")
def vm_build(private_cache):
    return B.build(512), B.build(512)


def test_ptxas_resources(vm_build):
    b, _ = vm_build
    assert b.cubin.is_file() and b.cubin.read_bytes()[:4] == b"\x7fELF"
    assert "Compiling entry function 'amk_vm' for 'sm_90a'" in b.ptxas_log
    assert b.spill_stores == 0 and b.spill_loads == 0, b.ptxas_log
    assert b.stack_bytes == 0, "a stack frame means local memory: " + b.ptxas_log
    assert 32 <= b.registers <= 65536 // 512, b.registers


def test_cached_by_source_hash(vm_build):
    first, again = vm_build
    assert not first.cached and again.cached
    assert again.key == first.key and again.cubin == first.cubin and again.registers == first.registers


def test_key_follows_sources(tmp_path, monkeypatch):
    for name in B.SOURCES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(B.SOURCE_DIR / name, tmp_path / name)
    monkeypatch.setattr(B, "SOURCE_DIR", tmp_path)
    k0 = B.source_key(512, "release 13.0")
    assert B.source_key(256, "release 13.0") != k0
    assert B.source_key(512, "release 13.1") != k0
    seen = {k0}
    for name in B.SOURCES:  # an edit of any one source (every kernel family's header included) rebuilds
        (tmp_path / name).write_text((tmp_path / name).read_text() + "\n// edit\n")
        k = B.source_key(512, "release 13.0")
        assert k not in seen, name
        seen.add(k)


def test_sources_are_every_kernel_header_vm_cu_includes():
    """The cache key's SOURCES list every header of cuda/kernels/, and vm.cu includes exactly those, in order."""
    import re

    on_disk = sorted(p.name for p in (B.SOURCE_DIR / "kernels").glob("*.cuh"))
    assert sorted(f"{k}.cuh" for k in B.KERNELS) == on_disk
    assert set(B.SOURCES) == {"vm.cu", "abi.h", *(f"kernels/{k}.cuh" for k in B.KERNELS)}
    included = re.findall(r'^#include "kernels/(\w+)\.cuh"', (B.SOURCE_DIR / "vm.cu").read_text(), re.M)
    assert included == list(B.KERNELS)




def test_sass_has_vector_loads_prefetch_and_no_local_memory(vm_build):
    tool = find_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not found (pip nvidia-cuda-cuobjdump or the CUDA toolkit)")
    sass = subprocess.run([tool, "--dump-sass", str(vm_build[0].cubin)], capture_output=True, text=True,
                          timeout=120).stdout
    ops = re.findall(r"\b(LDG[A-Z0-9._]*|LDL[A-Z0-9._]*|STL[A-Z0-9._]*|UBLKPF[A-Z0-9._]*|ATOMG[A-Z0-9._]*|REDG[A-Z0-9._]*)", sass)
    assert any(o.startswith("LDG") and ".128" in o and "CONSTANT" in o for o in ops), "no 16-byte weight loads"
    assert any(o.startswith("UBLKPF") for o in ops), "no cp.async.bulk.prefetch.L2"
    assert not [o for o in ops if o.startswith(("LDL", "STL"))], "local memory traffic"
    assert any(o.startswith("REDG.E.ADD") for o in ops), "no release add (the task signal)"


def test_parse_ptxas_errors():
    log = ("ptxas info    : Compiling entry function 'amk_vm' for 'sm_90a'\n"
           "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 130 registers, used 1 barriers, 8 bytes cumulative stack size, 656 bytes smem\n")
    assert B.parse_ptxas(log) == {"registers": 130, "stack_bytes": 8, "spill_stores": 4, "spill_loads": 4,
                                  "smem_bytes": 656}
    with pytest.raises(B.BuildError):
        B.parse_ptxas(log.replace("amk_vm", "other"))
    with pytest.raises(B.BuildError):
        B.build(500)
