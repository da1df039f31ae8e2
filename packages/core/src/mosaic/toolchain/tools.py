"""Finding and running the CUDA command-line tools.

A tool is looked up on ``PATH``, under ``$CUDA_HOME/bin`` (or ``$CUDA_PATH/bin``), under
``/usr/local/cuda/bin`` and in the pip wheels of the installed ``nvidia`` namespace package
(``nvidia/cu13/bin``, ``nvidia/cuda_nvdisasm/bin``, ...). The disassemblers ``nvdisasm`` and ``cuobjdump``
are looked up in the wheels first: the project pins them (``nvidia-cuda-nvdisasm``/``-cuobjdump`` in the
development requirements) so that SASS text is the same on every machine.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from mosaic.errors import BadInput, ToolMissing

TIMEOUT_S = 120
WHEEL_FIRST = frozenset({"nvdisasm", "cuobjdump"})
_VERSION_RE = re.compile(r"V(\d+\.\d+\.\d+)")


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _wheel_dirs(name: str) -> list[Path]:
    try:
        import nvidia  # namespace package of the pip CUDA components
    except ImportError:
        return []
    subs = ("cu13/bin", "cu12/bin", f"cuda_{name}/bin", "cuda_nvdisasm/bin", "cuda_cuobjdump/bin", "cuda_nvcc/bin")
    return [Path(root) / sub for root in getattr(nvidia, "__path__", []) for sub in subs]


@functools.cache
def find_tool(name: str) -> str | None:
    """Path of the CUDA tool ``name`` (``nvcc``, ``ptxas``, ``nvdisasm``, ``cuobjdump``), or None.

    The search order is the module docstring's; the answer is cached for the process.
    """
    wheels = [d / name for d in _wheel_dirs(name)]
    toolkit = [Path(p) for p in (shutil.which(name),) if p]
    toolkit += [Path(home) / "bin" / name for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                                                        "/usr/local/cuda") if home]
    for candidate in (wheels + toolkit if name in WHEEL_FIRST else toolkit + wheels):
        if _executable(candidate):
            return str(candidate)
    return None


def require_tool(name: str, hint: str | None = None) -> str:
    """:func:`find_tool`, or :class:`~mosaic.errors.ToolMissing` saying how to install the tool."""
    exe = find_tool(name)
    if exe is None:
        raise ToolMissing(f"{name} not found: {hint or f'pip install nvidia-cuda-{name} (or put a CUDA toolkit on PATH)'}")
    return exe


def run_tool(name: str, args: list[str], path: str | os.PathLike, *, timeout: float = TIMEOUT_S) -> str:
    """stdout of ``<name> <args> <path>``; the tool only reads ``path``.

    Raises :class:`~mosaic.errors.ToolMissing` without the tool and :class:`~mosaic.errors.BadInput`
    (naming ``path``) when it times out or exits non-zero, with the tool's last message line.
    """
    exe = find_tool(name)
    if exe is None:
        raise ToolMissing(f"{name} not found: pip install nvidia-cuda-{name} (or put a CUDA toolkit on PATH)", str(path))
    try:
        done = subprocess.run([exe, *args, str(path)], capture_output=True, text=True, timeout=timeout,
                              check=False, errors="replace")
    except subprocess.TimeoutExpired:
        raise BadInput(f"{name} did not finish within {timeout:g} s", str(path)) from None
    if done.returncode != 0:
        msg = (done.stderr or done.stdout).strip().splitlines()
        raise BadInput(f"{name} could not read the cubin: {msg[-1] if msg else f'exit {done.returncode}'}", str(path))
    return done.stdout


@functools.cache
def version_output(exe: str) -> str:
    """The text ``<exe> --version`` prints, cached per executable; BadInput when it cannot run."""
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BadInput(f"could not run {Path(exe).name} --version: {exc}", exe) from None


def version_number(exe: str) -> str | None:
    """The tool's version as ``13.0.88`` (from the ``V13.0.88`` of ``--version``), or None."""
    found = _VERSION_RE.search(version_output(exe))
    return found.group(1) if found else None


def version_line(exe: str) -> str:
    """The last line of ``--version`` (``Build cuda_13.0.r13.0/compiler...``), or ``?``."""
    lines = version_output(exe).strip().splitlines()
    return lines[-1] if lines else "?"
