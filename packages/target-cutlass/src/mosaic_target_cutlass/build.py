"""nvcc builds of CUTLASS translation units, cached by a hash of source and flags.

A build is one nvcc call that produces the host shim (a shared library, cudart linked statically, so
it loads on a machine with no GPU) and keeps the PTX and the sm_90a cubin; ``-Xptxas -v`` writes the
resource log. Compiles are slow (about a minute and 3.5 GB of memory each on a 2-core machine), so
results live in ``$MOSAIC_CACHE_DIR`` (default ``~/.cache/mosaic``) under ``cutlass/<hash>/``; the hash
covers the source, the flags (without the include path), the CUTLASS version and the nvcc version. A
failed build is cached too (``failed.json``), so an unbuildable configuration is not compiled again.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs
from mosaic.backend import Unbuildable
from mosaic.errors import MosaicError
from mosaic.records import ResourceUsage

CACHE_ENV = "MOSAIC_CACHE_DIR"
INCLUDE_ENV = "MOSAIC_CUTLASS_INCLUDE"
TIMEOUT_ENV = "MOSAIC_NVCC_TIMEOUT"
FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-shared", "-Xcompiler", "-fPIC",
         "-Xptxas", "-v", "-lineinfo")


class ToolMissing(MosaicError):
    """nvcc or the CUTLASS headers are not available."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mosaic")


def cutlass_include() -> tuple[Path, Path]:
    """(include/, tools/util/include/) of CUTLASS: $MOSAIC_CUTLASS_INCLUDE, $CUTLASS_INCLUDE, or the
    headers PyPI's nvidia-cutlass ships under cutlass_library/source."""
    for env in (INCLUDE_ENV, "CUTLASS_INCLUDE"):
        if os.environ.get(env):
            inc = Path(os.environ[env])
            break
    else:
        try:
            import cutlass_library  # type: ignore[import-not-found]
        except ImportError:
            raise ToolMissing("CUTLASS headers not found: pip install nvidia-cutlass==4.2.0.0 or set "
                              f"{INCLUDE_ENV}") from None
        inc = Path(cutlass_library.__file__).parent / "source" / "include"
    util = inc.parent / "tools" / "util" / "include"
    if not (inc / "cutlass" / "cutlass.h").is_file():
        raise ToolMissing(f"no cutlass/cutlass.h under {inc}", INCLUDE_ENV)
    if not (util / "cutlass" / "util" / "packed_stride.hpp").is_file():
        raise ToolMissing(f"no cutlass/util/packed_stride.hpp under {util}", INCLUDE_ENV)
    return inc, util


def cutlass_version(inc: Path) -> str:
    text = (inc / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{p} (\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


def nvcc() -> str:
    exe = shutil.which("nvcc")
    if not exe:
        raise ToolMissing("nvcc is not on PATH (CUDA toolkit 12.3+ needed for sm_90a)")
    return exe


def nvcc_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def disassembler() -> list[str] | None:
    """cuobjdump -sass (PATH, or the pip package nvidia-cuda-cuobjdump), else nvdisasm."""
    here = Path(sys.prefix) / "lib"
    for name, args in (("cuobjdump", ["-sass"]), ("nvdisasm", ["-c"])):
        exe = shutil.which(name) or next(iter(glob.glob(str(here / "python3*/site-packages/nvidia/cu*/bin" / name))), None)
        if exe:
            return [exe, *args]
    return None


@attrs.frozen
class Build:
    key: str
    dir: Path
    library: Path
    ptx: Path
    cubin: Path
    sass: Path | None
    ptxas_log: Path
    source: Path
    resources: ResourceUsage
    kernel_name: str
    toolchain: dict
    seconds: float
    cached: bool


_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_ptxas(log: str) -> ResourceUsage:
    """Figures of the (last, i.e. the GEMM's) entry function in a ``ptxas -v`` log."""
    entries = log.split("Compiling entry function")
    last = entries[-1] if len(entries) > 1 else log
    regs = _REGS.search(last)
    if not regs:
        raise Unbuildable("ptxas log has no 'Used N registers' line for the kernel")
    smem, stack, cmem = _SMEM.search(last), _STACK.search(last), _CMEM.search(last)
    return ResourceUsage(registers=int(regs.group(1)), static_smem=int(smem.group(1)) if smem else 0,
                         stack_frame=int(stack.group(1)) if stack else 0,
                         spill_stores=int(stack.group(2)) if stack else 0,
                         spill_loads=int(stack.group(3)) if stack else 0,
                         constant_bytes=int(cmem.group(1)) if cmem else 0)


def kernel_name(ptx: str) -> str:
    names = re.findall(r"\.entry\s+([\w$]+)", ptx)
    if not names:
        raise Unbuildable("the PTX has no .entry (no kernel was instantiated)")
    return names[-1]


def build(source: str, arch: str = "sm_90a", name: str = "kernel") -> Build:
    """Compile (or fetch from the cache) one translation unit. Raises Unbuildable on a compile error."""
    exe = nvcc()
    inc, util = cutlass_include()
    gencode = f"-gencode=arch=compute_{arch[3:]},code={arch}"
    flags = (*FLAGS, gencode)
    toolchain = {"nvcc": nvcc_version(exe), "cutlass": cutlass_version(inc)}
    key = hashlib.sha256(json.dumps([source, flags, toolchain], sort_keys=True).encode()).hexdigest()[:24]
    out = cache_root() / "cutlass" / key
    failed = out / "failed.json"
    if failed.is_file():
        info = json.loads(failed.read_text())
        raise Unbuildable(f"nvcc failed (cached): {info['error']}", str(out))
    if (out / "done.json").is_file():
        return _load(out, key, toolchain, cached=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=out.parent))
    try:
        src = tmp / f"{name}.cu"
        src.write_text(source)
        cmd = [exe, *flags, f"-I{inc}", f"-I{util}", "--keep", f"--keep-dir={tmp / 'keep'}",
               "-o", str(tmp / f"lib{name}.so"), str(src)]
        (tmp / "keep").mkdir()
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=float(os.environ.get(TIMEOUT_ENV, "1200")), cwd=tmp)
        except subprocess.TimeoutExpired:
            raise Unbuildable(f"nvcc timed out after {os.environ.get(TIMEOUT_ENV, '1200')} s", str(src)) from None
        seconds = time.monotonic() - start
        log = proc.stdout + proc.stderr
        (tmp / "ptxas.log").write_text(log)
        if proc.returncode != 0:
            errors = [ln for ln in log.splitlines() if "error" in ln.lower()][:3]
            summary = " | ".join(e.strip()[:300] for e in errors) or log.strip()[-300:]
            out.mkdir(parents=True, exist_ok=True)
            (out / "failed.json").write_text(json.dumps({"error": summary, "returncode": proc.returncode,
                                                         "cmd": cmd, "seconds": seconds}, indent=1))
            (out / "build.log").write_text(log)
            raise Unbuildable(f"nvcc failed: {summary}", str(out))
        keep = tmp / "keep"
        ptx = next(iter(sorted(keep.glob(f"{name}*.ptx"))), None)
        cubins = [p for p in sorted(keep.glob(f"{name}*.cubin")) if "dlink" not in p.name]
        if ptx is None or not cubins:
            raise Unbuildable("nvcc kept no PTX or cubin", str(keep))
        shutil.copyfile(ptx, tmp / "kernel.ptx")
        shutil.copyfile(cubins[0], tmp / "kernel.cubin")
        shutil.rmtree(keep)
        dis = disassembler()
        sass_note = "none"
        if dis:
            sp = subprocess.run([*dis, str(tmp / "kernel.cubin")], capture_output=True, text=True, timeout=300)
            if sp.returncode == 0:
                (tmp / "kernel.sass").write_text(sp.stdout)
                sass_note = " ".join([Path(dis[0]).name, *dis[1:]])
        meta = {"key": key, "seconds": round(seconds, 1), "cmd": cmd, "toolchain": toolchain, "sass": sass_note}
        (tmp / "done.json").write_text(json.dumps(meta, indent=1))
        if not (out / "done.json").is_file():  # another process may have finished the same build first
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _load(out, key, toolchain, cached=False)


def _load(out: Path, key: str, toolchain: dict, cached: bool) -> Build:
    meta = json.loads((out / "done.json").read_text())
    lib = next(iter(sorted(out.glob("lib*.so"))))
    src = next(iter(sorted(out.glob("*.cu"))))
    log = (out / "ptxas.log").read_text()
    sass = out / "kernel.sass"
    tc = {**toolchain, "sass": meta.get("sass", "none")}
    return Build(key=key, dir=out, library=lib, ptx=out / "kernel.ptx", cubin=out / "kernel.cubin",
                 sass=sass if sass.is_file() else None, ptxas_log=out / "ptxas.log", source=src,
                 resources=parse_ptxas(log), kernel_name=kernel_name((out / "kernel.ptx").read_text()),
                 toolchain=tc, seconds=float(meta.get("seconds", 0.0)), cached=cached)
