"""Build the AMK VM (vm.cu + kernels/*.cuh + abi.h) with nvcc, cached by source hash: for sm_90a by default, or
for the architecture of a GpuTarget record (``build(gpu=B200)``: sm_100a) or an architecture named directly
(``build(arch="sm_80")``: there is no Ampere GpuTarget record, see ARCHES) -- the same source for every arch.

``build(threads=512)`` returns a :class:`VmBuild`: the cubin path and what ptxas reported (registers,
spill stores/loads, stack frame, static shared memory). The cache key is the SHA-256 of the source
files, the nvcc version line and the flags, so an edited source or another toolchain rebuilds; the cache
lives in ``$MOSAIC_CACHE_DIR/amk-cuda`` (``MOSAIC_CACHE_DIR`` defaults to ``~/.cache/mosaic``; the CUTLASS plugin shares it). No GPU is needed to build.
nvcc, the cache and the ptxas-log parser are :mod:`mosaic.toolchain`'s; this module holds what is the VM's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import attrs
from mosaic.errors import BadInput, MosaicError
from mosaic.toolchain import nvcc as _nvcc
from mosaic.toolchain.ptxas import kernel_resources

SOURCE_DIR = Path(__file__).parent
# every source of the VM (the cache key hashes them): vm.cu, the ABI and the micro-kernels, one family per header
KERNELS = ("common", "gemv_rows", "gemv_quant", "embed", "rmsnorm", "gemv", "elementwise", "rope", "attention", "argmax")
SOURCES = ("vm.cu", *(f"kernels/{k}.cuh" for k in KERNELS), "abi.h")
ARCH = "sm_90a"
KERNEL = "amk_vm"


@attrs.frozen
class ArchRule:
    """What one architecture can build: a build define (its name, e.g. AMK_WSTREAM) that this arch cannot
    assemble, and why (the PTX feature ptxas refuses)."""

    define: str
    reason: str


@attrs.frozen
class VmArch:
    """An architecture the VM source builds for: its nvcc -gencode pair and the defines it refuses (by rule)."""

    arch: str
    compute: str
    refuses: tuple = ()
    note: str = ""

    def gencode(self) -> str:
        return f"-gencode=arch={self.compute},code={self.arch}"


_NO_TMA = ArchRule("AMK_WSTREAM", "the weight stream needs sm_90+: cp.async.bulk with mbarrier::complete_tx, "
                   "mbarrier.try_wait.parity and fence.mbarrier_init (ptxas: 'requires .target sm_90 or higher')")
# every arch the VM source builds for (rules as data): sm_80 has no bulk L2 prefetch (vm.cu falls back to one
# prefetch.global.L2 per 128-byte line) and no TMA/mbarrier tx-count (the weight stream is refused); sm_80 has no
# GpuTarget record -- GpuTarget.peak_fp8_tflops must be positive and A100 has no FP8 tensor cores -- so it is named
# by arch; sm_90a (Hopper records), sm_100a (B200) and sm_120a (RTX 5090) build every variant
ARCHES = {
    "sm_80": VmArch("sm_80", "compute_80", refuses=(_NO_TMA,),
                    note="L2 prefetch: prefetch.global.L2 per 128-byte line (no cp.async.bulk.prefetch)"),
    "sm_90a": VmArch("sm_90a", "compute_90a"),
    "sm_100a": VmArch("sm_100a", "compute_100a"),
    "sm_120a": VmArch("sm_120a", "compute_120a"),
}


def vm_arch(arch: str | None = None, gpu=None) -> VmArch:
    """The VmArch of ``gpu`` (a GpuTarget: its ``arch`` field) or of ``arch`` (default sm_90a); BuildError for an
    arch the VM source is not built for."""
    if gpu is not None:
        if arch is not None and arch != gpu.arch:
            raise BuildError(f"arch {arch} contradicts GPU {gpu.name} ({gpu.arch}): pass one of them")
        arch = gpu.arch
    arch = arch or ARCH
    if arch not in ARCHES:
        raise BuildError(f"the AMK VM does not build for {arch}: known arches {', '.join(ARCHES)}")
    return ARCHES[arch]


def refusal(arch: VmArch, defines: tuple[str, ...]) -> ArchRule | None:
    """The rule of ``arch`` that refuses one of ``defines`` (a define set to a non-zero value), or None."""
    for rule in arch.refuses:
        for d in defines:
            name, _, value = str(d).partition("=")
            if name == rule.define and value not in ("", "0"):
                return rule
    return None


class BuildError(MosaicError):
    """nvcc is missing or failed."""


@attrs.frozen
class VmBuild:
    cubin: Path
    ptxas_log: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    smem_bytes: int
    threads: int
    key: str
    cached: bool
    arch: str = ARCH

    def to_json(self) -> dict:
        return {"cubin": str(self.cubin), "arch": self.arch, "registers": self.registers, "spill_stores": self.spill_stores,
                "spill_loads": self.spill_loads, "stack_bytes": self.stack_bytes, "smem_bytes": self.smem_bytes,
                "threads": self.threads, "key": self.key[:16], "cached": self.cached}


def cache_dir() -> Path:
    return _nvcc.cache_root() / "amk-cuda"


def nvcc_path() -> str:
    nvcc = _nvcc.find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found on PATH (needed to build the AMK CUDA VM)")
    return nvcc


# build-time variants of the micro-kernels (``defines``): the GEMV body (kernels/gemv_rows.cuh: AMK_GEMV_IMPL 1 = the
# first body, the default, 2 = the streaming ring), its loads in flight per lane (AMK_GEMV_DEPTH, 2..16) and the
# weight preload before a GEMV task's wait (AMK_WEIGHT_PRELOAD, config.WEIGHT_PRELOADS; body 1 only)
_DEFINE = re.compile(r"^AMK_(GEMV_IMPL|GEMV_DEPTH|WEIGHT_PRELOAD|WSTREAM|WS_PIECE_KB|WS_FENCE|GEMV_PP|ATT_STAGE|ATT_NB1|TRACE|SHORT_ROWS|QUANT)=\d{1,2}$")


def preload_defines(weight_preload: int) -> tuple[str, ...]:
    """The build defines of ``ScheduleConfig.weight_preload`` (none when 0: the default build)."""
    return (f"AMK_WEIGHT_PRELOAD={int(weight_preload)}",) if weight_preload else ()


def ring_bytes(threads: int, defines: tuple[str, ...]) -> int:
    """The weight stream's ring of a build (AMK_WSTREAM=N: N slots of WS_PIECE bytes per warp; 0 without it): the
    shared memory a Launcher adds after its smem_bytes area."""
    from mosaic_amk.config import WS_PIECE

    def value(name: str, default: int) -> int:
        got = [int(d.split("=", 1)[1]) for d in defines if str(d).startswith(name + "=")]
        return got[-1] if got else default

    return threads // 32 * value("AMK_WSTREAM", 0) * value("AMK_WS_PIECE_KB", WS_PIECE // 1024) * 1024


def config_defines(config) -> tuple[str, ...]:
    """The build defines of a ScheduleConfig's build variants: weight_preload, weight_stream, gemv_pingpong and
    attention_stage (none: the default build)."""
    stream = (f"AMK_WSTREAM={int(config.weight_stream)}",) if config.weight_stream else ()
    pingpong = ("AMK_GEMV_PP=1",) if config.gemv_pingpong else ()
    stage = ("AMK_ATT_STAGE=1",) if config.attention_stage else ()
    return preload_defines(config.weight_preload) + stream + pingpong + stage


def flags(threads: int, defines: tuple[str, ...] = (), arch: str = ARCH) -> list[str]:
    return [vm_arch(arch).gencode(), "-cubin", "-O3", "-lineinfo", "-Xptxas", "-v",
            f"-DAMK_THREADS={threads}", *(f"-D{d}" for d in defines), "-std=c++17"]


def source_key(threads: int, nvcc_version: str, defines: tuple[str, ...] = (), arch: str = ARCH) -> str:
    parts: list[str | bytes] = []
    for name in SOURCES:
        parts += [name, b"\0", (SOURCE_DIR / name).read_bytes(), b"\0"]
    return _nvcc.cache_key(*parts, nvcc_version, b"\0", " ".join(flags(threads, defines, arch)))


def parse_ptxas(log: str, kernel: str = KERNEL) -> dict[str, int]:
    """The resource figures ptxas -v reported for ``kernel`` (its 'Compiling entry function' block)."""
    found = kernel_resources(log, kernel)
    if found is None:
        raise BuildError(f"ptxas output has no entry for {kernel}")
    if found.registers is None:
        raise BuildError(f"ptxas output for {kernel} has no register count")
    return {"registers": found.registers, "stack_bytes": found.stack_frame or 0,
            "spill_stores": found.spill_stores or 0, "spill_loads": found.spill_loads or 0,
            "smem_bytes": found.static_smem or 0}


def nvcc_version(nvcc: str) -> str:
    """nvcc's release line (part of every cache key)."""
    try:
        return _nvcc.nvcc_release(nvcc)
    except BadInput as exc:
        raise BuildError(exc.what) from None


def nvcc_cubin(nvcc: str, source: Path, cubin: Path, log_path: Path, flag_list: list[str]) -> None:
    """Compile ``source`` to ``cubin`` (written under a temporary name, then renamed) and keep nvcc's output
    (ptxas -v) in ``log_path``; raises BuildError with nvcc's last error line."""
    cubin.parent.mkdir(parents=True, exist_ok=True)
    tmp = cubin.with_name(f"{cubin.stem}.{os.getpid()}.cubin")
    args = [*flag_list, "-I", str(SOURCE_DIR), "-o", str(tmp), str(source)]
    try:
        run = _nvcc.run_nvcc(nvcc, args, timeout=600)
    except BadInput as exc:
        raise BuildError(f"nvcc failed to run: {exc.what}") from None
    if not run.ok:
        raise BuildError("nvcc failed: " + (run.log.strip().splitlines() or ["?"])[-1][:400], " ".join(run.cmd))
    log_path.write_text(run.log)
    tmp.replace(cubin)


def build(threads: int = 512, *, force: bool = False, defines: tuple[str, ...] = (), arch: str | None = None,
          gpu=None) -> VmBuild:
    """Compile (or reuse the cached) cubin of the VM for ``threads`` threads per block; ``defines`` picks a
    micro-kernel variant (``("AMK_GEMV_IMPL=1",)``: the first GEMV body, for A/B timing); ``gpu`` (a GpuTarget)
    or ``arch`` picks the architecture (default sm_90a)."""
    target = vm_arch(arch, gpu)
    if threads % 32 or not 32 <= threads <= 1024:
        raise BuildError(f"threads per block must be a multiple of 32 in 32..1024, got {threads}")
    defines = tuple(defines)
    bad = [d for d in defines if not _DEFINE.match(str(d))]
    if bad:
        raise BuildError(f"unknown build define(s) {bad}: expected AMK_GEMV_IMPL=<n>, AMK_GEMV_DEPTH=<n>, "
                         "AMK_WEIGHT_PRELOAD=<n> or AMK_WSTREAM=<n>")
    preload = any(d.startswith("AMK_WEIGHT_PRELOAD=") and d != "AMK_WEIGHT_PRELOAD=0" for d in defines)
    stream = any(d.startswith("AMK_WSTREAM=") and d != "AMK_WSTREAM=0" for d in defines)
    body2 = any(d.startswith("AMK_GEMV_IMPL=") and d != "AMK_GEMV_IMPL=1" for d in defines)
    if preload and body2:
        raise BuildError("AMK_WEIGHT_PRELOAD needs GEMV body 1 (AMK_GEMV_IMPL=1; body 2 issues its own first loads)")
    if stream and (body2 or preload):
        raise BuildError("AMK_WSTREAM replaces GEMV body 1's loads: it excludes AMK_GEMV_IMPL=2 and AMK_WEIGHT_PRELOAD")
    rule = refusal(target, defines)
    if rule is not None:
        raise BuildError(f"{rule.define} cannot build for {target.arch}: {rule.reason}")
    nvcc = nvcc_path()
    key = source_key(threads, nvcc_version(nvcc), defines, target.arch)
    out_dir = cache_dir() / key[:24]
    cubin, log_path = out_dir / "amk_vm.cubin", out_dir / "ptxas.log"
    cached = _nvcc.build_cached(
        out_dir, lambda tmp: nvcc_cubin(nvcc, SOURCE_DIR / "vm.cu", tmp / cubin.name, tmp / log_path.name,
                                        flags(threads, defines, target.arch)),
        complete=lambda d: (d / cubin.name).is_file() and (d / log_path.name).is_file(), force=force)
    log = log_path.read_text()
    res = parse_ptxas(log)
    return VmBuild(cubin=cubin, ptxas_log=log, threads=threads, key=key, cached=cached, arch=target.arch, **res)
