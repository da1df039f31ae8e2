"""mosaic.toolchain against the real CUDA tools: nvcc builds a tiny kernel, ptxas assembles its PTX, nvdisasm and
cuobjdump read the cubin, and every reader agrees on its registers and shared memory. The log parser and the build
cache are also checked on synthetic input (no tool needed)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from mosaic.errors import BadInput, ToolMissing
from mosaic.records import ResourceUsage
from mosaic.toolchain import cubin as C
from mosaic.toolchain import nvcc as N
from mosaic.toolchain import nvdisasm as D
from mosaic.toolchain import ptxas as P
from mosaic.toolchain import tools as T

KERNEL = r"""
extern "C" __global__ void __launch_bounds__(128) scale_rows(const float* x, float* y, float a, int n) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.f;
    tile[threadIdx.x + 128] = tile[threadIdx.x] * a;
    __syncthreads();
    if (i < n) y[i] = tile[(threadIdx.x + 1) % 128 + 128];
}
"""

LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'first' for 'sm_90a'
ptxas info    : Function properties for first
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 384 bytes cmem[0]
ptxas info    : Function properties for helper
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'second' for 'sm_90a'
ptxas info    : Function properties for second
    24 bytes stack frame, 20 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 24 bytes cumulative stack size, 400 bytes cmem[0]
ptxas info    : Compile time = 3.1 ms
"""

needs_cuda = pytest.mark.skipif(T.find_tool("nvcc") is None or T.find_tool("ptxas") is None,
                                reason="needs nvcc and ptxas (a CUDA toolkit on PATH)")
needs_disasm = pytest.mark.skipif(T.find_tool("nvdisasm") is None or T.find_tool("cuobjdump") is None,
                                  reason="needs nvdisasm and cuobjdump (pip nvidia-cuda-nvdisasm/-cuobjdump)")


# -- the ptxas -v log parser ------------------------------------------------------------------------------------
def test_parse_log_gives_one_block_per_function_in_order():
    fns = P.parse_log(LOG)
    assert [(f.name, f.entry) for f in fns] == [("first", True), ("helper", False), ("second", True)]
    first, helper, second = fns
    assert (first.arch, first.registers, first.static_smem, first.constant_bytes) == ("sm_90a", 40, 1024, 384)
    assert (first.stack_frame, first.spill_stores, first.spill_loads) == (0, 0, 0)
    assert (helper.registers, helper.stack_frame, helper.spill_stores, helper.spill_loads) == (None, 16, 8, 4)
    assert (second.registers, second.static_smem, second.constant_bytes) == (255, None, 400)
    assert (second.stack_frame, second.spill_stores, second.spill_loads) == (24, 20, 12)


def test_kernel_resources_picks_the_named_or_the_last_entry():
    assert P.kernel_resources(LOG, "first").registers == 40
    assert P.kernel_resources(LOG).name == "second"  # the last entry function, not the helper
    assert P.kernel_resources(LOG, "helper") is None  # not an entry function
    assert P.kernel_resources(LOG, "absent") is None
    assert P.kernel_resources("nothing here") is None
    # a log without any function marker is one unnamed block
    bare = P.kernel_resources("ptxas info    : Used 12 registers, 8 bytes smem\n")
    assert (bare.name, bare.registers, bare.static_smem) == ("", 12, 8)


def test_usage_fills_unstated_figures_with_zero():
    assert P.kernel_resources(LOG).usage() == ResourceUsage(registers=255, static_smem=0, spill_stores=20,
                                                           spill_loads=12, stack_frame=24, constant_bytes=400)
    with pytest.raises(ValueError, match="no register count for 'helper'"):
        P.parse_log(LOG)[1].usage()


def test_a_warning_that_names_a_function_starts_no_block():
    log = ("ptxas info    : (C7519) warpgroup.arrive is injected in around line 788 by compiler in function 'k'\n"
           "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas info    : Used 168 registers, used 16 barriers, 1 bytes smem\n")
    assert [(f.name, f.registers, f.static_smem) for f in P.parse_log(log)] == [("k", 168, 1)]


# -- finding tools, cache keys, the build cache ------------------------------------------------------------------
def test_find_and_require_tool():
    assert T.find_tool("no-such-cuda-tool") is None
    with pytest.raises(ToolMissing, match="no-such-cuda-tool not found: install it") as err:
        T.require_tool("no-such-cuda-tool", "install it")
    assert isinstance(err.value, BadInput) and err.value.exit_code == 2


@pytest.fixture
def fresh_lookup():
    T.find_tool.cache_clear()
    yield
    T.find_tool.cache_clear()


def test_the_toolkit_comes_first_but_the_pinned_disassembler_wheels_win(tmp_path, monkeypatch, fresh_lookup):
    for name in ("ptxas", "nvdisasm"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert T.find_tool("ptxas") == str(tmp_path / "ptxas")  # PATH before any wheel
    wheel = [d / "nvdisasm" for d in T._wheel_dirs("nvdisasm") if (d / "nvdisasm").is_file()]
    assert T.find_tool("nvdisasm") == (str(wheel[0]) if wheel else str(tmp_path / "nvdisasm"))
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "ptxas").write_text("#!/bin/sh\n")
    (home / "bin" / "ptxas").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "cuda"))  # no ptxas on PATH itself
    monkeypatch.setenv("CUDA_HOME", str(home))
    T.find_tool.cache_clear()
    assert T.find_tool("ptxas") == str(home / "bin" / "ptxas")  # then $CUDA_HOME/bin


def test_cache_key_is_the_sha256_of_the_concatenated_parts():
    assert N.cache_key("ab", b"c") == N.cache_key("abc") == hashlib.sha256(b"abc").hexdigest()
    assert N.cache_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert N.cache_key("a", "\0", "bc") != N.cache_key("abc")


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(tmp_path))
    assert N.cache_root() == tmp_path
    monkeypatch.delenv("MOSAIC_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert N.cache_root() == Path.home() / ".cache" / "mosaic"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert N.cache_root() == tmp_path / "xdg" / "mosaic"


def test_build_cached_fills_a_directory_atomically(tmp_path):
    out = tmp_path / "cache" / "key123"
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        assert tmp.parent == out.parent and tmp != out
        (tmp / "a.txt").write_text(str(len(calls)))

    def complete(d: Path) -> bool:
        return (d / "a.txt").is_file()

    assert N.build_cached(out, build, complete=complete) is False
    assert (out / "a.txt").read_text() == "1" and not calls[0].exists()
    assert N.build_cached(out, build, complete=complete) is True and len(calls) == 1
    assert N.build_cached(out, build, complete=complete, force=True) is False
    assert (out / "a.txt").read_text() == "2"

    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise BadInput("compile failed")

    with pytest.raises(BadInput, match="compile failed"):
        N.build_cached(tmp_path / "cache" / "other", broken, complete=complete)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["key123"]  # nothing half-written kept


def test_disassemblers_refuse_a_file_that_is_not_a_cubin(tmp_path):
    bogus = tmp_path / "k.cubin"
    bogus.write_bytes(b"not an elf")
    with pytest.raises(BadInput, match="not a cubin"):
        D.disassemble(bogus)
    with pytest.raises(BadInput, match="not a cubin"):
        C.cubin_attributes(bogus)
    with pytest.raises(BadInput, match="not a 64-bit ELF cubin"):
        C.read_cubin(b"not an elf")


# -- the real tools on a tiny kernel ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("toolchain")
    (d / "k.cu").write_text(KERNEL)
    exe = N.require_nvcc()
    cu = N.run_nvcc(exe, ["-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o", str(d / "k.cubin"), str(d / "k.cu")])
    assert cu.ok, cu.log
    px = N.run_nvcc(exe, ["-arch=sm_90a", "-ptx", "-o", str(d / "k.ptx"), str(d / "k.cu")])
    assert px.ok, px.log
    return d, cu


@needs_cuda
def test_nvcc_build_and_its_ptxas_report(built):
    d, run = built
    assert run.cmd[0] == N.find_nvcc() and run.seconds > 0
    k = P.kernel_resources(run.log, "scale_rows")
    assert k.entry and k.arch == "sm_90a"
    assert k.static_smem == 1024  # 256 floats of __shared__
    assert (k.stack_frame, k.spill_stores, k.spill_loads) == (0, 0, 0)
    assert 8 <= k.registers <= 64
    version = N.nvcc_version(N.find_nvcc())
    assert version[0].isdigit() and version.count(".") == 2
    assert "release" in N.nvcc_release(N.find_nvcc())


@needs_cuda
def test_nvcc_failure_is_a_result_with_its_errors(tmp_path):
    (tmp_path / "bad.cu").write_text("__global__ void k() { undefined_call(); }\n")
    run = N.run_nvcc(N.require_nvcc(), ["-arch=sm_90a", "-cubin", "-o", str(tmp_path / "bad.cubin"),
                                        str(tmp_path / "bad.cu")])
    assert not run.ok and run.returncode != 0
    assert "undefined_call" in run.errors() and "error" in run.errors()


@needs_cuda
def test_ptxas_assembles_the_ptx_to_the_same_resources(built, tmp_path):
    d, run = built
    asm = P.assemble(d / "k.ptx", "sm_90a", tmp_path / "again.cubin")
    assert asm.ok and asm.cubin == tmp_path / "again.cubin"
    assert asm.cubin.read_bytes()[:4] == C.ELF_MAGIC
    assert asm.cmd[1:4] == ("-arch=sm_90a", "-v", "-o") and asm.version and asm.version[0].isdigit()
    mine, nvccs = P.kernel_resources(asm.log, "scale_rows"), P.kernel_resources(run.log, "scale_rows")
    assert (mine.registers, mine.static_smem) == (nvccs.registers, nvccs.static_smem)
    assert asm.functions() == P.parse_log(asm.log)
    log_only = P.assemble(d / "k.ptx", "sm_90a", None)
    assert log_only.ok and log_only.cubin is None and "Used 10 registers" not in log_only.stdout  # -v goes to stderr
    assert P.kernel_resources(log_only.log, "scale_rows") == mine


@needs_cuda
def test_ptxas_on_broken_ptx_reports_not_raises(tmp_path):
    bad = tmp_path / "bad.ptx"
    bad.write_text(".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry k() { bogus.op; }\n")
    asm = P.assemble(bad, "sm_90a", tmp_path / "bad.cubin")
    assert not asm.ok and asm.cubin is None and asm.returncode not in (0, None)
    assert "error" in asm.stderr.lower() and asm.message() == asm.log.strip().splitlines()[-1]


@needs_cuda
@needs_disasm
def test_every_cubin_reader_agrees_with_ptxas(built):
    d, run = built
    regs = P.kernel_resources(run.log, "scale_rows").registers
    # the ELF's .nv.shared.<kernel> holds ptxas's 1024 B plus the 1 KB that sm_90 reserves per block
    (kernel,) = C.read_cubin((d / "k.cubin").read_bytes())
    assert (kernel.name, kernel.registers, kernel.static_smem) == ("scale_rows", regs, 2048)
    assert kernel.code_bytes > 0 and kernel.code_bytes % 16 == 0
    attrs = C.cubin_attributes(d / "k.cubin")["scale_rows"]
    assert (attrs.registers, attrs.static_smem, attrs.max_threads, attrs.local_bytes) == (regs, 2048, (128, 1, 1), 0)
    sass = D.disassemble(d / "k.cubin")
    assert "scale_rows" in sass and "BAR.SYNC" in sass and "EXIT" in sass and "/* 0x" in sass  # -hex encodings
    text, how = D.dump_sass(d / "k.cubin")
    assert how == "cuobjdump -sass" and "scale_rows" in text and "EXIT" in text
