"""Compile once: the lowering's compiled CuTe function kept on disk, loaded by the GPU process instead of
compiling again.

``lower()`` (CPU, no GPU) compiles a candidate with ``cute.compile`` for its PTX and cubin; the GPU worker's
``prepare()`` used to call ``cute.compile`` again. CuTe DSL's own file cache does not help: its key includes
the compile options, and ours name a per-lowering ``--dump-dir``. So the lowering also writes the compiled
function as a host object file (``JitCompiledFunction.dump_to_object``: the host launch code with the cubin
embedded; ``export_to_c``'s header is not needed, and it cannot describe a stream argument that has no
annotation) and ``prepare()`` loads it (``cutlass.runtime.load_module``: links the object in memory; no GPU
needed to load, the CUDA module is loaded at the first launch).

Layout: ``ROOT/<key>/`` holds ``kernel.o``, ``kernel.cubin`` (the cubin the lowering read its figures from)
and ``manifest.json`` (the key's inputs, the CuTe DSL version, the host machine, the DSL runtime library's
build (cu12 / cu13), and the lowering's
:class:`~mosaic_target_cute.lowering.CuteBuild` figures: the kernel object learns its shared memory while
``cute.compile`` traces it, so a kernel object that was not compiled cannot give them). ``ROOT`` is
``$MOSAIC_CUTE_ARTIFACTS``, else ``$MOSAIC_CACHE_DIR/cute-artifacts`` (``~/.cache/mosaic/cute-artifacts``);
``MOSAIC_CUTE_ARTIFACTS=off`` turns the store off (every ``prepare()`` compiles, as before).

An entry is sealed when it is written (:mod:`mosaic.cache_integrity`: the SHA-256 of ``kernel.o``,
``kernel.cubin`` and ``manifest.json``, for the key) and its object is linked in only after it verifies: a
changed file, an entry others could write or one without that seal is discarded with one warning line, and the
caller compiles. ``ROOT`` is made with mode 0700; one that is a link, another user's or writable by group or
others is refused (nothing is loaded from it or saved to it).

The key (:func:`artifact_key` of :func:`key_inputs`) is the SHA-256 of everything that decides what
``cute.compile`` builds: the knobs (defaults filled), m, n, k, dtype, arch, SM count, the line-info option and
the bytes of the kernel sources; the DSL version, the host machine and the runtime build are checked from the
manifest instead, so a mismatch is reported as such (:func:`load` returns the reason; the caller compiles and
records it).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import attrs
from mosaic import cache_integrity
from mosaic.errors import BadInput

ENV = "MOSAIC_CUTE_ARTIFACTS"
PREFIX = "mosaic_cute_"  # + the key's first 16 hex digits: the object file's symbols, unique per artifact
FORMAT = "mosaic-cute-artifact/1"
#: the package files whose code is traced by cute.compile for a template gemm (their bytes are in the key)
KERNEL_SOURCES = ("kernels/hopper_gemm.py", "kernels/blackwell_gemm.py", "kernels/naive_gemm.py", "knobs.py", "lowering.py",
                  "blackwell_budget.py")


def root() -> Path | None:
    """The store's directory, or None when ``$MOSAIC_CUTE_ARTIFACTS`` is ``off``."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("off", "0", "none", "no"):
        return None
    if value:
        return Path(value)
    from mosaic.toolchain.nvcc import cache_root

    return cache_root() / "cute-artifacts"


def dsl_version() -> str:
    from importlib.metadata import version

    return version("nvidia-cutlass-dsl")


def runtime_variant() -> str:
    """Which build of the DSL's runtime library the host code links against (``cu12`` / ``cu13``: the directory
    of ``libcute_dsl_runtime.so`` in the wheel), or ``unknown``."""
    from cutlass.runtime import find_runtime_libraries

    libs = find_runtime_libraries(enable_tvm_ffi=False)
    return Path(libs[0]).parent.parent.name if libs else "unknown"


def _sources_digest() -> str:
    here = Path(__file__).parent
    h = hashlib.sha256()
    for rel in KERNEL_SOURCES:
        h.update(rel.encode() + b"\0" + (here / rel).read_bytes() + b"\0")
    return h.hexdigest()


def key_inputs(knobs, m: int, n: int, k: int, dtype: str, arch: str, sm_count: int, line_info: bool) -> dict:
    return {"knobs": attrs.asdict(knobs), "m": m, "n": n, "k": k, "dtype": dtype,
            "arch": arch, "sm_count": sm_count, "line_info": bool(line_info), "sources": _sources_digest()}


def artifact_key(inputs: dict) -> str:
    """The candidate's content hash (of :func:`key_inputs`): what the compiled function is kept under."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=list).encode()).hexdigest()


@attrs.frozen
class Loaded:
    """A compiled function read back from the store: callable like ``cute.compile``'s result."""

    key: str
    function: object
    module: object  # the ExternalBinaryModule: keeps the in-memory linked object alive
    build: object  # the lowering's CuteBuild (ptx None, cubin the entry's copy)
    manifest: dict
    seconds: float


BUILD_FIELDS = ("kernel_name", "registers", "static_smem", "dynamic_smem", "threads", "cluster", "grid_ctas",
                "compile_seconds")


def save(compiled, build, key: str, inputs: dict) -> Path | None:
    """Write ``compiled`` (with its CuteBuild ``build``) under ``key`` (atomically: a temporary directory renamed
    into place; an existing entry is kept). Returns the entry's directory, or None when the store is off.
    Raises what the DSL raises (the lowering notes it and goes on: the worker then compiles)."""
    base = root()
    if base is None:
        return None
    refused = cache_integrity.private_dir(base)
    if refused:
        cache_integrity.warn(f"CuTe artifact store refused: {refused}; nothing is kept there")
        raise BadInput(f"artifact store refused: {refused}", str(base))
    final = base / key
    if os.path.lexists(final):
        why = cache_integrity.verify(final, key)
        if not why:
            return final
        cache_integrity.warn(f"CuTe artifact not believed: {why}; discarded, writing it again")
        cache_integrity.discard(final)
    _load_runtime_libraries()
    start = time.perf_counter()
    prefix = PREFIX + key[:16]
    obj = compiled.dump_to_object(prefix)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=base))
    try:  # mkdtemp's 0700: a store is one user's (another's entries are refused)
        (tmp / "kernel.o").write_bytes(obj)
        shutil.copyfile(build.cubin, tmp / "kernel.cubin")
        manifest = {"format": FORMAT, "key": key, "inputs": inputs, "nvidia-cutlass-dsl": dsl_version(),
                    "build": {f: getattr(build, f) for f in BUILD_FIELDS},
                    "machine": platform.machine(), "runtime": runtime_variant(), "prefix": prefix,
                    "export_seconds": round(time.perf_counter() - start, 4)}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True, default=list))
        cache_integrity.seal(tmp, key)
        try:
            os.rename(tmp, final)
        except OSError:  # another process wrote the same key first: theirs is the same build
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load(key: str) -> Loaded | str:
    """The compiled function kept under ``key``, or the reason it cannot be used (the caller compiles)."""
    try:
        base = root()
    except RuntimeError as exc:  # Path.home() with no home directory
        return f"no artifact store: {exc}"
    if base is None:
        return f"artifact store off (${ENV}=off)"
    entry = base / key
    refused = cache_integrity.unsafe(base) if os.path.lexists(base) else ""
    if refused:
        cache_integrity.warn(f"CuTe artifact store refused: {refused}; nothing is loaded from it")
        return f"artifact store refused: {refused}"
    if not os.path.lexists(entry):
        return f"no artifact {key[:12]} under {base}"
    why = cache_integrity.unsafe(entry) or cache_integrity.unsafe(entry / "manifest.json")
    if why:
        return _discarded(entry, key, why)
    try:
        manifest = json.loads((entry / "manifest.json").read_text())
    except FileNotFoundError:
        return f"no artifact {key[:12]} under {base}"
    except (OSError, ValueError) as exc:
        return f"artifact {key[:12]} unreadable: {type(exc).__name__}: {exc}"
    if manifest.get("format") != FORMAT or manifest.get("key") != key:
        return f"artifact {key[:12]} has format {manifest.get('format')!r}, not {FORMAT!r}"
    built, here = manifest.get("nvidia-cutlass-dsl"), dsl_version()
    if built != here:
        return f"artifact {key[:12]} was built by CuTe DSL {built}, this is {here}"
    if manifest.get("machine") != platform.machine():
        return f"artifact {key[:12]} was built on {manifest.get('machine')}, this host is {platform.machine()}"
    if manifest.get("runtime") != runtime_variant():
        return (f"artifact {key[:12]} links CuTe DSL's {manifest.get('runtime')} runtime, this process has "
                f"{runtime_variant()}")
    from mosaic_target_cute.lowering import CuteBuild

    try:
        fields = dict(manifest["build"])
        build = CuteBuild(ptx=None, cubin=entry / "kernel.cubin", **{**fields, "cluster": tuple(fields["cluster"])})
    except (KeyError, TypeError) as exc:
        return f"artifact {key[:12]} has no usable build record: {type(exc).__name__}: {exc}"
    why = cache_integrity.verify(entry, key)  # before anything of it is linked in
    if why:
        return _discarded(entry, key, why)
    start = time.perf_counter()
    try:
        from cutlass.runtime import load_module

        module = load_module(str(entry / "kernel.o"))
        function = module[manifest["prefix"]]
    except Exception as exc:  # noqa: BLE001 - the DSL raises many types; the caller compiles instead
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        return f"artifact {key[:12]} did not load: {type(exc).__name__}: {first[:300]}"
    return Loaded(key=key, function=function, module=module, build=build, manifest=manifest,
                  seconds=time.perf_counter() - start)


def _discarded(entry: Path, key: str, why: str) -> str:
    cache_integrity.warn(f"CuTe artifact not believed: {why}; discarded, compiling instead")
    cache_integrity.discard(entry)
    return f"artifact {key[:12]} discarded: {why}"


def _load_runtime_libraries() -> None:
    """``dump_to_object`` links against the DSL's runtime library (cudaLaunchKernelEx etc.): load it globally
    first, as ``load_module`` does for loading (else: 'Symbols not found: _cudaLaunchKernelEx ...')."""
    import ctypes

    from cutlass.runtime import find_runtime_libraries

    for path in find_runtime_libraries(enable_tvm_ffi=False):
        if path not in _RUNTIME_LIBS and Path(path).exists():
            _RUNTIME_LIBS[path] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


_RUNTIME_LIBS: dict = {}
