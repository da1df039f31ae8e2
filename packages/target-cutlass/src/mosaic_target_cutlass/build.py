"""nvcc builds of CUTLASS translation units, cached by a hash of source and flags.

A build is one nvcc call that produces the host shim (a shared library, cudart linked statically, so
it loads on a machine with no GPU) and keeps the PTX and the sm_90a cubin; ``-Xptxas -v`` writes the
resource log. Compiles are slow (about a minute and 3.5 GB of memory each on a 2-core machine), so
results live in ``$MOSAIC_CACHE_DIR`` (default ``~/.cache/mosaic``) under ``cutlass/<hash>/``; the hash
covers the source, the flags (without the include path), the CUTLASS version and the nvcc version. A
failed build is cached too (``failed.json``), so an unbuildable configuration is not compiled again.

Every entry (a build, a failure) is sealed with the SHA-256 of its files (:mod:`mosaic.cache_integrity`) and
is used only while it verifies: a changed ``lib<name>.so``, ``done.json`` or ``failed.json`` is discarded with
one warning line and built again, never loaded. The shim's compile-time facts (shared memory, threads per
block, stages) are read once, when the library is built, by a child process (:func:`run_shim`), and recorded
in ``done.json``: lowering (``capture --lower-only``, no GPU) checks its budgets from them and never loads the
library into its process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs
from mosaic import cache_integrity
from mosaic.backend import Unbuildable
from mosaic.errors import BadInput, ToolMissing
from mosaic.records import ResourceUsage
from mosaic.toolchain import nvcc as _nvcc
from mosaic.toolchain.nvdisasm import dump_sass
from mosaic.toolchain.ptxas import kernel_resources

CACHE_ENV = _nvcc.CACHE_ENV
INCLUDE_ENV = "MOSAIC_CUTLASS_INCLUDE"
TIMEOUT_ENV = "MOSAIC_NVCC_TIMEOUT"
FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-shared", "-Xcompiler", "-fPIC",
         "-Xptxas", "-v", "-lineinfo")


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
    facts: dict | None = None  # the shim's smem_bytes, threads_per_block, stages (run_shim at build time)


#: a child's script: the shim's compile-time facts, as JSON (argv[1]: the library)
FACTS_SCRIPT = ("import ctypes, json, sys\n"
                "lib = ctypes.CDLL(sys.argv[1])\n"
                "print(json.dumps({'smem_bytes': lib.mosaic_smem_bytes(), "
                "'threads_per_block': lib.mosaic_block_threads(), 'stages': lib.mosaic_stages()}))\n")


def run_shim(library: Path, script: str, *args: str, timeout: float = 120):
    """Run ``script`` in a fresh Python process that loads the shim ``library`` (its path is ``argv[1]``,
    ``args`` follow) and prints one JSON value: its last line, parsed. The shim's host functions run on the
    CPU (cudart is linked statically) without the library ever being loaded into this process. Unbuildable
    when the child fails."""
    try:
        p = subprocess.run([sys.executable, "-I", "-c", script, str(library), *args], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Unbuildable(f"the shim's host functions did not return in {timeout:g} s", str(library)) from None
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        raise Unbuildable(f"the shim's host functions failed: {last[:300]}", str(library))
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise Unbuildable(f"the shim's host functions printed {lines[-1][:200]!r}", str(library)) from None


def parse_ptxas(log: str) -> ResourceUsage:
    """Figures of the (last, i.e. the GEMM's) entry function in a ``ptxas -v`` log."""
    found = kernel_resources(log)
    if found is None or found.registers is None:
        raise Unbuildable("ptxas log has no 'Used N registers' line for the kernel")
    return found.usage()


def kernel_name(ptx: str) -> str:
    names = re.findall(r"\.entry\s+([\w$]+)", ptx)
    if not names:
        raise Unbuildable("the PTX has no .entry (no kernel was instantiated)")
    return names[-1]


def build(source: str, arch: str = "sm_90a", name: str = "kernel") -> Build:
    """Compile (or fetch from the cache) one translation unit. Raises Unbuildable on a compile error."""
    exe = _nvcc.find_nvcc()
    if exe is None:
        raise ToolMissing("nvcc is not on PATH (CUDA toolkit 12.3+ needed for sm_90a)")
    inc, util = cutlass_include()
    gencode = f"-gencode=arch=compute_{arch[3:]},code={arch}"
    flags = (*FLAGS, gencode)
    toolchain = {"nvcc": _nvcc.nvcc_version(exe), "cutlass": cutlass_version(inc)}
    key = _nvcc.cache_key(json.dumps([source, flags, toolchain], sort_keys=True))[:24]
    out = _nvcc.cache_root() / "cutlass" / key
    failed = out / "failed.json"
    if failed.is_file():
        why = cache_integrity.verify(out, key)
        if not why:
            info = json.loads(failed.read_text())
            raise Unbuildable(f"nvcc failed (cached): {info['error']}", str(out))
        cache_integrity.warn(f"cache entry not believed: {why}; discarded, building it again")
        cache_integrity.discard(out)

    def compile_into(tmp: Path) -> None:
        src = tmp / f"{name}.cu"
        src.write_text(source)
        cmd = [exe, *flags, f"-I{inc}", f"-I{util}", "--keep", f"--keep-dir={tmp / 'keep'}",
               "-o", str(tmp / f"lib{name}.so"), str(src)]
        (tmp / "keep").mkdir()
        try:
            run = _nvcc.run_nvcc(exe, cmd[1:], timeout=float(os.environ.get(TIMEOUT_ENV, "1200")), cwd=tmp)
        except BadInput as exc:
            raise Unbuildable(exc.what, str(src)) from None
        (tmp / "ptxas.log").write_text(run.log)
        if not run.ok:
            summary = run.errors()
            _keep_failure(out, key, {"error": summary, "returncode": run.returncode, "cmd": cmd,
                                     "seconds": run.seconds}, run.log)
            raise Unbuildable(f"nvcc failed: {summary}", str(out))
        keep = tmp / "keep"
        ptx = next(iter(sorted(keep.glob(f"{name}*.ptx"))), None)
        cubins = [p for p in sorted(keep.glob(f"{name}*.cubin")) if "dlink" not in p.name]
        if ptx is None or not cubins:
            raise Unbuildable("nvcc kept no PTX or cubin", str(keep))
        shutil.copyfile(ptx, tmp / "kernel.ptx")
        shutil.copyfile(cubins[0], tmp / "kernel.cubin")
        shutil.rmtree(keep)
        sass_note = "none"
        try:
            text, sass_note = dump_sass(tmp / "kernel.cubin")
            (tmp / "kernel.sass").write_text(text)
        except BadInput:  # no disassembler, or it could not read the cubin: a build without SASS
            sass_note = "none"
        facts = run_shim(tmp / f"lib{name}.so", FACTS_SCRIPT)  # our own fresh build, in a child process
        meta = {"key": key, "seconds": round(run.seconds, 1), "cmd": cmd, "toolchain": toolchain, "sass": sass_note,
                "facts": facts}
        (tmp / "done.json").write_text(json.dumps(meta, indent=1))

    cached = _nvcc.build_cached(out, compile_into, complete=lambda d: (d / "done.json").is_file())
    return _load(out, key, toolchain, cached=cached)


def _keep_failure(out: Path, key: str, info: dict, log: str) -> None:
    """Cache a failed build: ``failed.json`` and ``build.log``, sealed, renamed into place as ``out``."""
    try:
        if cache_integrity.private_dir(out.parent):
            return  # a refused directory keeps nothing
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.failed.", dir=out.parent))
    except OSError:
        return
    try:
        (tmp / "failed.json").write_text(json.dumps(info, indent=1))
        (tmp / "build.log").write_text(log)
        cache_integrity.seal(tmp, key)
        cache_integrity.discard(out)
        os.replace(tmp, out)
    except OSError:
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
                 toolchain=tc, seconds=float(meta.get("seconds", 0.0)), cached=cached, facts=meta.get("facts"))
