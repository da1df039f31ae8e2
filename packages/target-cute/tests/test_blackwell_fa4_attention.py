"""flash-attn-4's Blackwell forward as a lowered-only attention reference for sm_100a (issue 37). The installed
package (flash-attn-4 4.0.0b36, requirements/dev.txt: .venv) is the test data; nothing of it is copied here.
flash-attn's own entry (``interface._flash_attn_fwd`` under torch's FakeTensorMode, FLASH_ATTENTION_ARCH=sm_100,
CUTE_DSL_ARCH=sm_100a) compiles ``FlashAttentionForwardSm100`` for sm_100a on a machine with no GPU: its PTX
re-assembled by ptxas for sm_100a gives the resource figures (pytest -s prints them), its cubin lifts into the
tcgen05-era rows (tcgen05 MMA into TMEM, TMEM ld/st, TMA). The causal forward lowers here; the dense non-causal one
does not: its persistent tile scheduler asks the CUDA driver for the SM count at trace time (cutlass.utils.
HardwareInfo -> cuDeviceGetCount), and that reason is checked word for word so a release that lifts it is noticed.
Skips, naming the package, where flash-attn-4 is not installed (.venv312: it would pull CUDA torch, see
results/2026-12-08/blackwell/README.md)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest


def _has_fa4() -> bool:
    try:
        return importlib.util.find_spec("flash_attn.cute.flash_fwd_sm100") is not None and \
            importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


pytestmark = pytest.mark.skipif(not _has_fa4(), reason="needs flash-attn-4 and torch (pip install "
                                "flash-attn-4==4.0.0b36; requirements/dev.txt puts it in .venv)")

FA4_SM100 = """
import os, sys
os.environ.update(FLASH_ATTENTION_ARCH="sm_100", FLASH_ATTENTION_NUM_SMS="148", CUTE_DSL_ARCH="sm_100a",
                  CUTE_DSL_KEEP_PTX="1", CUTE_DSL_KEEP_CUBIN="1", CUTE_DSL_DUMP_DIR=sys.argv[1])
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flash_attn.cute.interface import _flash_attn_fwd
b, s, h, kv, d, causal = map(int, sys.argv[2:])
with FakeTensorMode():
    q = torch.empty(b, s, h, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.empty(b, s, kv, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    _flash_attn_fwd(q, k, v, causal=bool(causal))
"""


def _compile(tmp_path, causal: int):
    dump = tmp_path / f"dump{causal}"
    dump.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTE_DSL", "FLASH_ATTENTION"))}
    r = subprocess.run([sys.executable, "-c", FA4_SM100, str(dump), "2", "2048", "32", "32", "128", str(causal)],
                       capture_output=True, text=True, timeout=600, env=env)
    return r, dump


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    r, dump = _compile(tmp_path_factory.mktemp("fa4sm100"), 1)
    assert r.returncode == 0, r.stderr[-3000:]
    ptx, cubin = list(dump.glob("*.sm_100a.ptx")), list(dump.glob("*.sm_100a.cubin"))
    assert len(ptx) == 1 and len(cubin) == 1, list(dump.iterdir())
    return ptx[0], cubin[0]


def _driver_present() -> bool:
    import ctypes.util

    return ctypes.util.find_library("cuda") is not None


def test_causal_forward_lowers_for_sm100a_with_ptxas_resources(causal, tmp_path):
    from mosaic.toolchain.tools import find_tool

    ptx, _ = causal
    text = ptx.read_text()
    assert ".target sm_100a" in text and "FlashAttentionForwardSm100" in re.search(r"\.entry\s+(\w+)", text).group(1)
    assert "tcgen05.mma" in text and "tcgen05.alloc" in text and "wgmma" not in text
    ptxas = find_tool("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not found")
    r = subprocess.run([ptxas, "-arch=sm_100a", "-v", "-o", str(tmp_path / "k.cubin"), str(ptx)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    log = r.stdout + r.stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    barriers = re.search(r"used (\d+) barriers", log)
    print(f"\nflash-attn-4 FlashAttentionForwardSm100 causal hdim128 bf16, sm_100a: ptxas {regs} registers, "
          f"spill stores {spills.group(1)} B / loads {spills.group(2)} B, {barriers.group(1) if barriers else '?'} "
          "named barriers")
    assert "for 'sm_100a'" in log and 0 < regs <= 255 and spills.groups() == ("0", "0")


def test_the_lift_gives_tcgen05_era_rows(causal):
    from mosaic.lift.inputs import lift_path
    from mosaic.plugins import PluginHost

    b200 = PluginHost(allow="blackwell").load().get("gpus", "b200")
    fp = lift_path(causal[1], gpu=b200)
    value = {f.key: f.value for f in fp.layer("instruction") if not f.where.startswith("role")}
    assert value["mma.form"] == ["tcgen05"] and value["mma.accumulator"] == ["tmem"]
    assert value["mma.types"] == ["kind::f16"] and value["mma.cta_group"] == [1]
    assert {"alloc", "ld", "st", "commit"} <= set(value["tmem.ops"])  # S and P through TMEM: st as well as ld
    assert value["transfer.form"] == ["tma"] and "tcgen05.commit" in value["barrier.ops"]
    launch = {f.key: f.value for f in fp.layer("launch")}
    assert list(launch["block"]) == [512, 1, 1]  # softmax, correction, MMA, load and epilogue warps
    assert {f.key: f.value for f in fp.layer("numerics")}["exp.form"] == ["approx"]


def test_the_dense_forward_needs_the_driver_at_trace_time(tmp_path):
    if _driver_present():
        pytest.skip("a CUDA driver is present here")
    r, _ = _compile(tmp_path, 0)
    assert r.returncode != 0
    assert "tile_scheduler.py" in r.stderr and "HardwareInfo()" in r.stderr and "cuDeviceGetCount" in r.stderr
    assert '"cuda" is an NVIDIA driver library' in r.stderr, r.stderr[-2000:]
