"""ptxas: assemble PTX into a cubin, and the one parser of its ``-v`` resource log.

A ``ptxas -v`` log (also what ``nvcc -Xptxas -v`` prints) holds one block per function::

    ptxas info    : Compiling entry function 'k' for 'sm_90a'
    ptxas info    : Function properties for k
        8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
    ptxas info    : Used 130 registers, used 1 barriers, 656 bytes smem, 400 bytes cmem[0]

:func:`parse_log` returns one :class:`FunctionResources` per block, in log order; a figure the log does not
state is ``None``. Lines before the first block (a log without any) form a block named ``""``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import attrs

from mosaic.records import ResourceUsage
from mosaic.toolchain.tools import require_tool, version_number

_ENTRY_RE = re.compile(r"Compiling entry function\s+'?([\w$.]+)'?(?:\s+for\s+'(\w+)')?")
_PROPS_RE = re.compile(r"Function properties for\s+'?([\w$.]+)'?")
_STACK_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_CMEM_RE = re.compile(r"(\d+) bytes cmem\[0\]")
TIMEOUT_S = 300


@attrs.frozen
class FunctionResources:
    """What ptxas reported for one function; ``None`` where the log says nothing."""

    name: str
    entry: bool = False  # a kernel ("Compiling entry function"), not only "Function properties for"
    arch: str | None = None
    registers: int | None = None
    static_smem: int | None = None
    stack_frame: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    constant_bytes: int | None = None  # cmem[0]

    def usage(self) -> ResourceUsage:
        """The figures as a :class:`~mosaic.records.ResourceUsage` (unstated ones 0; needs ``registers``)."""
        if self.registers is None:
            raise ValueError(f"ptxas reported no register count for {self.name!r}")
        return ResourceUsage(registers=self.registers, static_smem=self.static_smem or 0,
                             spill_stores=self.spill_stores or 0, spill_loads=self.spill_loads or 0,
                             stack_frame=self.stack_frame or 0, constant_bytes=self.constant_bytes or 0)


def parse_log(text: str) -> list[FunctionResources]:
    """Every function block of a ``ptxas -v`` log, in order (see the module docstring).

    Within a block the first stack-frame line and the first ``Used N registers`` line count (shared
    memory and cmem[0] are read from that same ``Used`` line).
    """
    blocks: list[dict] = []
    cur: dict | None = None
    for line in text.splitlines():
        m = _ENTRY_RE.search(line)
        if m:
            cur = {"name": m.group(1), "entry": True, "arch": m.group(2)}
            blocks.append(cur)
            continue
        m = _PROPS_RE.search(line)
        if m:
            if cur is None or cur["name"] != m.group(1):
                cur = {"name": m.group(1)}
                blocks.append(cur)
            continue
        stack, regs = _STACK_RE.search(line), _REGS_RE.search(line)
        if not (stack or regs):
            continue
        if cur is None:
            cur = {"name": ""}
            blocks.append(cur)
        if stack and "stack_frame" not in cur:
            cur.update(stack_frame=int(stack.group(1)), spill_stores=int(stack.group(2)),
                       spill_loads=int(stack.group(3)))
        if regs and "registers" not in cur:
            cur["registers"] = int(regs.group(1))
            smem, cmem = _SMEM_RE.search(line), _CMEM_RE.search(line)
            if smem:
                cur["static_smem"] = int(smem.group(1))
            if cmem:
                cur["constant_bytes"] = int(cmem.group(1))
    return [FunctionResources(**b) for b in blocks]


def kernel_resources(text: str, kernel: str | None = None) -> FunctionResources | None:
    """The block of entry function ``kernel`` (its first), or with no name the last entry function's
    block (the lone unnamed block of a log without any); None when there is none."""
    functions = parse_log(text)
    entries = [f for f in functions if f.entry]
    if kernel is not None:
        return next((f for f in entries if f.name == kernel), None)
    if entries:
        return entries[-1]
    return next((f for f in functions if f.name == ""), None)


@attrs.frozen
class Assembly:
    """One ``ptxas -arch=<arch> -v`` run: the command, what it printed and the cubin it wrote."""

    cmd: tuple[str, ...]
    exe: str
    version: str | None  # "13.0.88"
    returncode: int | None  # None when it timed out
    stdout: str
    stderr: str
    cubin: Path | None  # None unless it succeeded and wrote one

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def log(self) -> str:
        """stdout + stderr: the ``-v`` resource report and any warnings or errors."""
        return self.stdout + self.stderr

    def message(self) -> str:
        """ptxas's last message line (why it failed), or ``exit N`` / ``timed out``."""
        if self.returncode is None:
            return "timed out"
        lines = self.log.strip().splitlines()
        return lines[-1] if lines else f"exit {self.returncode}"

    def functions(self) -> list[FunctionResources]:
        return parse_log(self.log)


def assemble(ptx: str | os.PathLike, arch: str, cubin: str | os.PathLike | None, *,
             timeout: float = TIMEOUT_S) -> Assembly:
    """``ptxas -arch=<arch> -v -o <cubin> <ptx>`` (``cubin=None``: ``-o /dev/null``, the log only).

    Never raises for a bad PTX or a timeout (see :attr:`Assembly.ok`); raises
    :class:`~mosaic.errors.ToolMissing` when there is no ptxas.
    """
    exe = require_tool("ptxas", "install a CUDA toolkit (ptxas) on PATH or set CUDA_HOME")
    out = Path(cubin) if cubin is not None else None
    cmd = (exe, f"-arch={arch}", "-v", "-o", str(out) if out is not None else os.devnull, str(ptx))
    version = version_number(exe)
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return Assembly(cmd, exe, version, None, "", "", None)
    wrote = out if done.returncode == 0 and out is not None and out.is_file() else None
    return Assembly(cmd, exe, version, done.returncode, done.stdout, done.stderr, wrote)
