"""What a cubin records about its kernels: registers, shared and local memory, launch bounds, cluster.

Two readers: :func:`read_cubin` parses the ELF itself (no CUDA tools needed) for registers, static shared
memory and code size; :func:`cubin_attributes` reads the full ``.nv.info`` attribute set from
``cuobjdump -elf``. Registers come from ``EIATTR_REGCOUNT`` (0x2f) in ``.nv.info``, keyed by the kernel's
symbol index; static shared memory is the size of ``.nv.shared.<kernel>``, code size that of
``.text.<kernel>``.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import attrs

from mosaic.errors import BadInput
from mosaic.toolchain.tools import run_tool

ELF_MAGIC = b"\x7fELF"
EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 0x04


def check_cubin(path: str | os.PathLike) -> None:
    """BadInput unless the file starts with an ELF header."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != ELF_MAGIC:
        raise BadInput("not a cubin (no ELF header)", str(path))


# -- the ELF itself -------------------------------------------------------------------------------------------
@attrs.frozen
class CubinKernel:
    """One kernel's figures read from the ELF sections (registers 0 when the cubin does not say)."""

    name: str
    registers: int
    static_smem: int
    code_bytes: int


def _sections(data: bytes):
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    str_off = raw[shstrndx][4]

    def cstr(base: int, idx: int) -> str:
        return data[base + idx:data.index(b"\0", base + idx)].decode(errors="replace")

    return [(cstr(str_off, s[0]), s) for s in raw]


def read_cubin(data: bytes) -> list[CubinKernel]:
    """Every ``.text.<kernel>`` of a 64-bit ELF cubin's bytes, with its registers and static shared memory."""
    if len(data) < 64 or data[:4] != ELF_MAGIC or data[4] != 2:
        raise BadInput("not a 64-bit ELF cubin", "cubin")
    sections = _sections(data)
    by_name = {name: s for name, s in sections}
    symbols: dict[int, str] = {}
    if ".symtab" in by_name and ".strtab" in by_name:
        sym, strtab = by_name[".symtab"], by_name[".strtab"]
        for i in range(sym[5] // 24):
            st_name, = struct.unpack_from("<I", data, sym[4] + i * 24)
            symbols[i] = data[strtab[4] + st_name:data.index(b"\0", strtab[4] + st_name)].decode(errors="replace")
    regs: dict[str, int] = {}
    for name, s in sections:
        if name != ".nv.info":
            continue
        pos, end = s[4], s[4] + s[5]
        while pos + 4 <= end:
            fmt, attr, size = struct.unpack_from("<BBH", data, pos)
            if fmt == EIFMT_SVAL and attr == EIATTR_REGCOUNT and size >= 8:
                sym_idx, value = struct.unpack_from("<II", data, pos + 4)
                regs[symbols.get(sym_idx, f"#{sym_idx}")] = value
            pos += 4 + (size if fmt == EIFMT_SVAL else 0)
    out = []
    for name, s in sections:
        if name.startswith(".text."):
            kernel = name[len(".text."):]
            shared = by_name.get(f".nv.shared.{kernel}")
            out.append(CubinKernel(kernel, regs.get(kernel, 0), shared[5] if shared else 0, s[5]))
    return out


# -- cuobjdump -elf -------------------------------------------------------------------------------------------
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
    """Per kernel: the attributes ``cuobjdump -elf`` lists (BadInput for a non-cubin, ToolMissing without it)."""
    path = Path(path)
    check_cubin(path)
    return parse_elf_listing(run_tool("cuobjdump", ["-elf"], path))
