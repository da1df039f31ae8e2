"""Cubin -> SASS text and cubin attributes, through NVIDIA's disassemblers.

The tools come from PyPI (``nvidia-cuda-nvdisasm`` / ``nvidia-cuda-cuobjdump``, installed with the project's
development requirements) or from a CUDA toolkit on PATH. They are looked up under the installed
``nvidia`` namespace package first (``nvidia/cu13/bin``, ``nvidia/cuda_nvdisasm/bin``, ...), then on PATH.
The cubin is never executed; the tools only read it.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import attrs

from mosaic.errors import BadInput

ELF_MAGIC = b"\x7fELF"
_TIMEOUT_S = 120


@functools.cache
def find_tool(name: str) -> str | None:
    """Path of ``nvdisasm`` or ``cuobjdump``: the pip package's copy first, then PATH."""
    try:
        import nvidia  # namespace package of the pip CUDA components
        roots = [Path(p) for p in getattr(nvidia, "__path__", [])]
    except ImportError:
        roots = []
    for root in roots:
        for sub in ("cu13/bin", "cu12/bin", f"cuda_{name}/bin", "cuda_nvdisasm/bin", "cuda_cuobjdump/bin"):
            candidate = root / sub / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which(name)


def _run(tool: str, args: list[str], path: Path) -> str:
    exe = find_tool(tool)
    if exe is None:
        raise BadInput(f"{tool} not found: pip install nvidia-cuda-{tool} (or put a CUDA toolkit on PATH)", str(path))
    try:
        done = subprocess.run([exe, *args, str(path)], capture_output=True, text=True, timeout=_TIMEOUT_S,
                              check=False, errors="replace")
    except subprocess.TimeoutExpired:
        raise BadInput(f"{tool} did not finish within {_TIMEOUT_S} s", str(path)) from None
    if done.returncode != 0:
        msg = (done.stderr or done.stdout).strip().splitlines()
        raise BadInput(f"{tool} could not read the cubin: {msg[-1] if msg else f'exit {done.returncode}'}",
                       str(path))
    return done.stdout


def check_cubin(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != ELF_MAGIC:
        raise BadInput("not a cubin (no ELF header)", str(path))


def disassemble_cubin(path: str | os.PathLike) -> str:
    """SASS text of every kernel in a cubin (``nvdisasm -c -hex``: labels plus encodings)."""
    path = Path(path)
    check_cubin(path)
    return _run("nvdisasm", ["-c", "-hex"], path)


@attrs.frozen
class CubinAttributes:
    """What a cubin records about one kernel (from its ``.nv.info`` attributes and section table)."""

    kernel: str
    registers: int | None = None
    max_threads: tuple | None = None  # EIATTR_MAX_THREADS (.maxntid / __launch_bounds__)
    req_threads: tuple | None = None  # EIATTR_REQNTID (.reqntid)
    cluster: tuple | None = None  # EIATTR_CTA_PER_CLUSTER (.reqnctapercluster / __cluster_dims__)
    explicit_cluster: bool = False
    max_registers: int | None = None  # EIATTR_MAXREG_COUNT
    min_blocks_per_sm: int | None = None
    static_smem: int = 0  # size of .nv.shared.<kernel>
    local_bytes: int = 0  # size of .nv.local.<kernel> (stack/spill frame)
    frame_size: int | None = None

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs.asdict(self).items()}


_SECTION_RE = re.compile(r"^\s*[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)\s+[0-9a-f]+\s+[0-9a-f]+\s+\w+\s+[0-9a-f]+\s+"
                         r"[0-9a-f]+\s+[0-9a-f]+\s+(\S+)\s*$")


def _ints(text: str) -> list[int]:
    return [int(tok, 16) if tok.lower().startswith("0x") else int(tok) for tok in re.findall(r"0x[0-9a-fA-F]+|\d+", text)]


def parse_elf_listing(text: str) -> dict[str, CubinAttributes]:
    """Kernel attributes from ``cuobjdump -elf`` output (section sizes and EIATTR records)."""
    sizes: dict[str, int] = {}
    per_kernel: dict[str, dict] = {}
    global_regs: dict[str, int] = {}
    section = ""
    attr = ""
    for line in text.splitlines():
        m = _SECTION_RE.match(line)
        if m:
            sizes[m.group(2)] = int(m.group(1), 16)
            continue
        stripped = line.strip()
        if stripped.startswith(".nv.info"):
            section = stripped
            continue
        if stripped.startswith(".") and not stripped.startswith(".nv.info"):
            section = ""
            continue
        if stripped.startswith("Attribute:"):
            attr = stripped.split(":", 1)[1].strip()
            if section.startswith(".nv.info.") and attr == "EIATTR_EXPLICIT_CLUSTER":
                per_kernel.setdefault(section[len(".nv.info."):], {})["explicit_cluster"] = True
            continue
        if not stripped.startswith("Value:") or not section:
            continue
        value = stripped.split(":", 1)[1]
        if section == ".nv.info":
            m = re.search(r"function:\s*(\S+)\(0x[0-9a-f]+\)\s*register count:\s*(\d+)", value)
            if m and attr == "EIATTR_REGCOUNT":
                global_regs[m.group(1)] = int(m.group(2))
            m = re.search(r"function:\s*(\S+)\(0x[0-9a-f]+\)\s*frame size:\s*(0x[0-9a-f]+|\d+)", value)
            if m and attr == "EIATTR_FRAME_SIZE":
                per_kernel.setdefault(m.group(1), {})["frame_size"] = _ints(m.group(2))[0]
            continue
        kernel = section[len(".nv.info."):]
        entry = per_kernel.setdefault(kernel, {})
        nums = _ints(value)
        if attr == "EIATTR_MAX_THREADS" and len(nums) >= 3:
            entry["max_threads"] = tuple(nums[:3])
        elif attr == "EIATTR_REQNTID" and len(nums) >= 3:
            entry["req_threads"] = tuple(nums[:3])
        elif attr == "EIATTR_CTA_PER_CLUSTER" and len(nums) >= 3:
            entry["cluster"] = tuple(nums[:3])
        elif attr == "EIATTR_MAXREG_COUNT" and nums:
            entry["max_registers"] = nums[0]
        elif attr == "EIATTR_MIN_CTA_PER_SM" and nums:
            entry["min_blocks_per_sm"] = nums[0]
    kernels = {s[len(".text."):] for s in sizes if s.startswith(".text.")}
    out = {}
    for k in sorted(kernels):
        extra = per_kernel.get(k, {})
        out[k] = CubinAttributes(kernel=k, registers=global_regs.get(k), static_smem=sizes.get(f".nv.shared.{k}", 0),
                                 local_bytes=sizes.get(f".nv.local.{k}", 0), **extra)
    return out


def cubin_attributes(path: str | os.PathLike) -> dict[str, CubinAttributes]:
    path = Path(path)
    check_cubin(path)
    return parse_elf_listing(_run("cuobjdump", ["-elf"], path))
