"""nvcc and the hash-keyed build cache its outputs live in.

Builds are slow, so their outputs are kept in the user cache (:mod:`mosaic.user_cache`: ``$MOSAIC_CACHE_DIR``,
default ``~/.cache/mosaic``), one directory per build named by :func:`cache_key` of everything that decides the
output (sources, flags, the toolchain's versions). :func:`build_cached` fills such a directory atomically: the
build writes into a temporary sibling that is renamed into place once complete, so a crashed or concurrent
build never leaves a half-written entry. A hit marks the entry used; a new entry trims the cache to its cap
(``MOSAIC_CACHE_MAX``), least recently used first.

An entry is sealed before it is renamed into place (:func:`mosaic.cache_integrity.seal`: the SHA-256 of each
file, with the entry's key) and is a hit only while it verifies (:func:`~mosaic.cache_integrity.verify`): a
changed, extra or missing file, a file or entry others could write, an entry that is a link or has no manifest
is discarded with one warning line naming it, and built again. Nothing of an entry (a ``libkernel.so`` to
dlopen, a cubin to load) is used before that check. The root is :func:`mosaic.user_cache.usable_root`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from mosaic import cache_integrity, user_cache
from mosaic.errors import BadInput
from mosaic.toolchain.tools import find_tool, require_tool, version_output

CACHE_ENV = user_cache.ROOT_ENV
_RELEASE_RE = re.compile(r"release ([\d.]+), V([\d.]+)")


def cache_root() -> Path:
    """The user cache's root (:func:`mosaic.user_cache.cache_root`: ``$MOSAIC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/mosaic``, else ``~/.cache/mosaic``): every build cache lives under it. A root others could
    write is refused: then a private stand-in of this process (:func:`mosaic.user_cache.usable_root`)."""
    return user_cache.usable_root()


def cache_key(*parts: str | bytes) -> str:
    """SHA-256 hex digest of the parts concatenated (``str`` parts UTF-8 encoded).

    Callers that need separators between parts include them, so a key is stable across releases.
    """
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
    return h.hexdigest()


def find_nvcc() -> str | None:
    """Path of nvcc (see :func:`mosaic.toolchain.tools.find_tool`), or None."""
    return find_tool("nvcc")


def require_nvcc(hint: str = "install a CUDA toolkit 12.3+ (sm_90a) on PATH or set CUDA_HOME") -> str:
    """Path of nvcc, or :class:`~mosaic.errors.ToolMissing`."""
    return require_tool("nvcc", hint)


def nvcc_release(exe: str) -> str:
    """nvcc's release line (``Cuda compilation tools, release 13.0, V13.0.88``); BadInput when it cannot run."""
    text = version_output(exe)
    return next((ln for ln in text.splitlines() if "release" in ln), text.strip()[-80:])


def nvcc_version(exe: str) -> str:
    """nvcc's version number (``13.0.88``), or the last line of ``--version`` when it has none."""
    text = version_output(exe)
    m = _RELEASE_RE.search(text)
    return m.group(2) if m else text.strip().splitlines()[-1]


@attrs.frozen
class NvccRun:
    """One nvcc call: its command, exit status, output (stdout + stderr, with ptxas -v's report) and time."""

    cmd: tuple[str, ...]
    returncode: int
    log: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def errors(self, n: int = 3) -> str:
        """The first ``n`` lines that mention an error, joined by `` | `` (else the log's last 300 characters)."""
        found = [ln for ln in self.log.splitlines() if "error" in ln.lower()][:n]
        return " | ".join(e.strip()[:300] for e in found) or self.log.strip()[-300:]


def run_nvcc(exe: str, args: list[str], *, timeout: float = 600, cwd: str | os.PathLike | None = None) -> NvccRun:
    """Run ``nvcc <args>``. Raises BadInput (naming the command) when it cannot start or times out;
    a failed compile is an :class:`NvccRun` with ``ok`` False."""
    cmd = (exe, *map(str, args))
    start = time.monotonic()
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise BadInput(f"nvcc timed out after {timeout:g} s", " ".join(cmd)) from None
    except OSError as exc:
        raise BadInput(f"nvcc failed to run: {exc}", " ".join(cmd)) from None
    return NvccRun(cmd, proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)


def build_cached(out: str | os.PathLike, build: Callable[[Path], None], *,
                 complete: Callable[[Path], bool], force: bool = False, key: str | None = None) -> bool:
    """Make cache entry ``out`` unless it verifies and ``complete(out)``; return True when it was already there.

    ``build(tmp)`` writes the entry's files into a fresh temporary directory beside ``out``; when it
    returns, the directory is sealed for ``key`` (default: ``out``'s name, the build's hash) and replaces
    ``out`` (unless another process completed ``out`` first). When it raises, nothing is kept. ``force``
    rebuilds a complete entry. An entry that does not verify is discarded, with one warning line, and built
    again. A hit marks ``out`` used; a new entry trims the user cache to its cap, ``out`` kept
    (:func:`mosaic.user_cache.after_write`). BadInput when ``out``'s directory is refused (others could
    write it).
    """
    out = Path(out)
    key = out.name if key is None else key
    if not force and os.path.lexists(out):
        why = cache_integrity.verify(out, key)
        if not why and complete(out):
            user_cache.touch(out)
            return True
        if why:
            cache_integrity.warn(f"cache entry not believed: {why}; discarded, building it again")
            cache_integrity.discard(out)
    refused = cache_integrity.private_dir(out.parent)
    if refused:
        raise BadInput(f"build cache directory refused: {refused}", str(out.parent))
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build(tmp)
        cache_integrity.seal(tmp, key)
        if force or cache_integrity.verify(out, key) or not complete(out):
            cache_integrity.discard(out)
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    user_cache.after_write(out)
    return False
