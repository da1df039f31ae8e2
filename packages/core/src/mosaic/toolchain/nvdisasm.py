"""SASS text from a cubin, through NVIDIA's disassemblers (the cubin is only read, never executed)."""

from __future__ import annotations

import os
from pathlib import Path

from mosaic.errors import ToolMissing
from mosaic.toolchain.cubin import check_cubin
from mosaic.toolchain.tools import find_tool, run_tool

#: the listing the lifter parses: labels plus each instruction's encoding
LIFT_FLAGS = ("-c", "-hex")


def disassemble(cubin: str | os.PathLike, flags: tuple[str, ...] = LIFT_FLAGS) -> str:
    """SASS text of every kernel in ``cubin`` (``nvdisasm <flags> <cubin>``).

    Raises :class:`~mosaic.errors.BadInput` for a file without an ELF header or one nvdisasm cannot read,
    :class:`~mosaic.errors.ToolMissing` without nvdisasm.
    """
    path = Path(cubin)
    check_cubin(path)
    return run_tool("nvdisasm", list(flags), path)


def dump_sass(cubin: str | os.PathLike) -> tuple[str, str]:
    """``(SASS text, how it was made)``: ``cuobjdump -sass`` when installed, else ``nvdisasm -c``.

    The second item names the tool and flags (``"cuobjdump -sass"``), for a build's notes. Raises like
    :func:`disassemble`; :class:`~mosaic.errors.ToolMissing` when neither tool is installed.
    """
    path = Path(cubin)
    for name, args in (("cuobjdump", ["-sass"]), ("nvdisasm", ["-c"])):
        if find_tool(name) is not None:
            return run_tool(name, args, path, timeout=300), " ".join([name, *args])
    raise ToolMissing("neither cuobjdump nor nvdisasm found: pip install nvidia-cuda-cuobjdump", str(path))
