"""What a cubin says about its kernels, read from the ELF itself (no CUDA tools needed).

Registers per thread come from the ``EIATTR_REGCOUNT`` attribute (0x2f) in ``.nv.info``, keyed by the
kernel's symbol index (the figure ``cuobjdump --dump-resource-usage`` prints); static shared memory is
the size of ``.nv.shared.<kernel>``; code size is the size of ``.text.<kernel>``.
"""

from __future__ import annotations

import struct

import attrs
from mosaic.errors import BadInput

EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 0x04


@attrs.frozen
class CubinKernel:
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
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:
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
