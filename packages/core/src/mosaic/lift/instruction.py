"""The parsed instruction and program: the common form the SASS and PTX parsers produce."""

from __future__ import annotations

import re

import attrs


@attrs.define(slots=True)
class Instruction:
    """One machine (SASS) or virtual (PTX) instruction.

    ``opcode`` is the base mnemonic (``HGMMA``, ``cp``), ``mods`` the dot-separated modifiers
    (``("64x8x16", "F32")``, ``("async", "cg", "shared", "global")``), ``operands`` the comma-separated
    operands as written, ``targets`` the labels a branch may jump to, ``opclass`` the operation class
    (``opclass.py``; ``other`` for an unknown mnemonic). ``control`` holds the upper 64 bits of the
    encoding (scheduling bits: stall cycles, yield, barriers; ``sass.decode_control``) when the SASS listing
    carries encodings.
    """

    index: int
    opcode: str
    mods: tuple
    operands: tuple
    pred: str = ""  # "P0", "!P0", "UP1", ... ("" = always)
    targets: tuple = ()
    address: int | None = None
    line: int = 0
    opclass: str = "other"
    control: int | None = None  # upper 64 bits of the encoding (sass.decode_control); None without -hex

    @property
    def full(self) -> str:
        return ".".join((self.opcode, *self.mods))

    @property
    def predicated(self) -> bool:
        return bool(self.pred) and self.pred not in ("PT", "UPT")

    def text(self) -> str:
        pred = f"@{self.pred} " if self.pred else ""
        return f"{pred}{self.full} {', '.join(self.operands)}".rstrip()


@attrs.define
class Program:
    """One kernel's instruction list plus what its listing declares.

    ``dialect`` is ``sass`` or ``ptx``; ``labels`` maps a label to the index of the instruction it
    precedes; ``directives`` holds PTX performance directives (``maxntid``, ``reqntid``, ``cluster``,
    ``maxnreg``, ``minnctapersm``) and shared-memory declarations (``shared_bytes``); ``unknown`` counts
    instructions whose mnemonic is not in the opcode tables (kept with opclass ``other``).
    """

    kernel: str
    dialect: str
    instructions: list
    labels: dict
    arch: str | None = None
    directives: dict = attrs.field(factory=dict)
    unknown: dict = attrs.field(factory=dict)
    warnings: list = attrs.field(factory=list)

    def __len__(self) -> int:
        return len(self.instructions)


_OPERAND_RE = re.compile(r"(?:[^,\[\]{}()]|\[[^\[\]]*\]|\{[^{}]*\}|\([^()]*\))+")


def split_operands(text: str) -> list[str]:
    """Split an operand list at top-level commas (not inside [], {} or ()); SASS and PTX alike."""
    if "[" not in text and "{" not in text and "(" not in text:
        return [p for p in map(str.strip, text.split(",")) if p]
    if "[[" not in text and "{{" not in text and "((" not in text:
        return [p for p in map(str.strip, _OPERAND_RE.findall(text)) if p]
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth <= 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    last = "".join(cur).strip()
    if last:
        out.append(last)
    return out
