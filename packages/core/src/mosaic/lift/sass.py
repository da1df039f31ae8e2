"""SASS parser: the listings of ``nvdisasm`` (with or without ``-hex``) and ``cuobjdump -sass``.

Each kernel becomes a :class:`~mosaic.lift.instruction.Program`: instructions with predicate, opcode,
modifiers, operands, branch targets (labels, or absolute addresses in cuobjdump's form), addresses and,
when the listing carries the 128-bit encodings, the scheduling control bits. A listing that is not SASS,
is cut short, or jumps to labels it never defines raises :class:`~mosaic.errors.BadInput`.
"""

from __future__ import annotations

import gc
import re

from mosaic.errors import BadInput
from mosaic.lift.instruction import Instruction, Program, split_operands
from mosaic.lift.opclass import SASS_BASE, sass_class

_HEX_RE = re.compile(r"/\*\s*0x([0-9a-fA-F]{16})\s*\*/")
_LABEL_RE = re.compile(r"^\s*([.$A-Za-z_][\w.$]*)\s*:\s*$")
_KERNEL_NVDISASM_RE = re.compile(r"^\s*\.text\.([\w.$]+)\s*:\s*$")
_KERNEL_CUOBJDUMP_RE = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
_TARGET_RE = re.compile(r"`\(([^)`]+)\)")
_ANNOTATION_RE = re.compile(r"\(\*(.*?)\*\)")
_PRED_RE = re.compile(r"^@(!?U?P[0-7T])\s+")
_PRED_OPERAND_RE = re.compile(r"!?U?P[0-6]")
_ARCH_RE = re.compile(r"\b(?:\.target|code for)\s+(sm_\d+[af]?)")
_BENIGN_PREFIXES = ("//", ".", "#", "Fatbin", "=", "arch", "code version", "host", "compile_size",
                    "code for", "Function", "identifier", "ptxasOptions", "----")
# the two line forms that make up almost every listing, matched whole (the general path below handles the rest):
# an instruction ``/*0040*/  IADD3 R1, R1, -0x2990, RZ ;  /* 0xffffd67001017810 */`` and the second half of its
# encoding ``/* 0x001fe20007ffe0ff */``
_INSN_LINE_RE = re.compile(r"\s*/\*([0-9a-fA-F]{4,})\*/\s*(?P<body>(?:@(?P<pred>!?U?P[0-7T])\s+)?"
                           r"(?P<op>[A-Z][A-Z0-9_]*)(?P<mods>(?:\.[^\s;/{}]+)?)(?P<rest>[^;/{}]*);)"
                           r"\s*(?P<hex>/\*\s*0x[0-9a-fA-F]{16}\s*\*/)?\s*")

_CONTROL_LINE_RE = re.compile(r"\s*/\*\s*0x([0-9a-fA-F]{16})\s*\*/\s*")
_BRANCHES = {"BRA", "BRX", "JMP", "JMX", "BRXU", "JMXU", "CALL", "RET", "EXIT", "BREAK", "KILL"}


def looks_like_sass(text: str) -> bool:
    return bool(re.search(r"/\*[0-9a-fA-F]{4,}\*/\s+\S", text[:200_000]))


_OPCODE_RE = re.compile(r"[A-Z][A-Z0-9_]*")
_OK_OPCODES = set(SASS_BASE) | {"SYNCS"}


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return text.strip() == text


def decode_control(hi: int) -> dict:
    """Scheduling bits of a Volta-and-later instruction (upper 64 bits of the 128-bit encoding).

    The parser keeps the raw upper word in ``Instruction.control``; this decodes it on demand."""
    return {"stall": (hi >> 41) & 0xF, "yield": (hi >> 45) & 1, "write_barrier": (hi >> 46) & 7,
            "read_barrier": (hi >> 49) & 7, "wait_mask": (hi >> 52) & 0x3F, "reuse": (hi >> 58) & 0xF}


class _Kernel:
    __slots__ = ("name", "insns", "labels", "pending_labels", "addr_index", "last")

    def __init__(self, name: str):
        self.name = name
        self.insns: list[Instruction] = []
        self.labels: dict[str, int] = {}
        self.pending_labels: list[str] = []
        self.addr_index: dict[int, int] = {}
        self.last: Instruction | None = None


def parse_sass(text: str, *, where: str = "SASS") -> dict[str, Program]:
    """Every kernel of a SASS listing, by name (``kernel`` when the listing names none)."""
    # the parse allocates one Instruction (and its tuples) per line and makes no reference cycles: the cyclic
    # collector's passes over the growing list are pure cost (about a fifth of the parse of a 75k listing)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_sass(text, where)
    finally:
        if was_enabled:
            gc.enable()


def _parse_sass(text: str, where: str) -> dict[str, Program]:
    if "\x00" in text:
        raise BadInput("binary data where SASS text was expected", where)
    arch_m = _ARCH_RE.search(text[:20_000])
    arch = arch_m.group(1) if arch_m else None
    kernels: dict[str, _Kernel] = {}
    cur: _Kernel | None = None
    unknown_lines = 0
    first_bad = ""
    unknown_ops: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        head = raw.lstrip()
        if head.startswith("/* 0x") and len(head) == 24 and head.endswith(" */"):  # an encoding's second half
            digits = head[5:21]
            try:
                word = int(digits, 16) if digits.isalnum() else None
            except ValueError:
                word = None
            if word is not None:
                if cur is not None and cur.last is not None and cur.last.control == -1:
                    cur.last.control = word
                continue
        fast = _INSN_LINE_RE.fullmatch(raw)
        if fast is not None and cur is not None:
            op = fast.group("op")
            if op in _SLOW_OPCODES or "(" in fast.group("rest"):
                insn = _parse_body(fast.group("body")[:-1].rstrip(), len(cur.insns), int(fast.group(1), 16), lineno,
                                   where, unknown_ops)
            else:
                insn = _plain_insn(op, fast.group("mods"), fast.group("rest"), fast.group("pred") or "",
                                   len(cur.insns), int(fast.group(1), 16), lineno, unknown_ops)
            if cur.pending_labels:
                for lab in cur.pending_labels:
                    cur.labels[lab] = insn.index
                cur.pending_labels.clear()
            cur.addr_index.setdefault(insn.address, insn.index)
            cur.insns.append(insn)
            cur.last = insn
            if fast.group("hex") is not None:
                insn.control = -1  # filled in by the next line's upper 64 bits
            continue
        fast = _CONTROL_LINE_RE.fullmatch(raw)
        if fast is not None:
            if cur is not None and cur.last is not None and cur.last.control == -1:
                cur.last.control = int(fast.group(1), 16)
            continue
        line = raw.strip()
        if not line:
            continue
        if line.startswith("/*"):
            close = line.find("*/", 2)
            addr_text = line[2:close] if close > 0 else ""
            if addr_text.startswith(" 0x") or addr_text.startswith("0x"):
                # the second (control) half of the previous instruction's encoding
                word = line[5:21] if len(line) == 24 and line.startswith("/* 0x") and line.endswith(" */") else ""
                if not (word and _is_hex(word)):
                    hexm = _HEX_RE.fullmatch(line)
                    word = hexm.group(1) if hexm else ""
                if not word:
                    unknown_lines += 1
                    first_bad = first_bad or f"line {lineno}: {line[:60]!r}"
                elif cur is not None and cur.last is not None and cur.last.control == -1:
                    cur.last.control = int(word, 16)
                continue
            if close > 0 and len(addr_text) >= 4 and _is_hex(addr_text):
                if cur is None:
                    cur = kernels.setdefault("kernel", _Kernel("kernel"))
                body = line[close + 2:]
                semi = body.find(";")
                has_hex = False
                if semi >= 0:
                    has_hex = "/* 0x" in body[semi:] or "/*0x" in body[semi:]
                    body = body[:semi + 1]
                insn = _parse_insn(body, len(cur.insns), int(addr_text, 16), lineno, where, unknown_ops)
                if insn is None:  # an empty "{ }" pair line or similar
                    continue
                if cur.pending_labels:
                    for lab in cur.pending_labels:
                        cur.labels[lab] = insn.index
                    cur.pending_labels.clear()
                cur.addr_index.setdefault(insn.address, insn.index)
                cur.insns.append(insn)
                cur.last = insn
                if has_hex:
                    insn.control = -1  # filled in by the next line's upper 64 bits
                continue
        km = _KERNEL_NVDISASM_RE.match(line) or _KERNEL_CUOBJDUMP_RE.match(line)
        if km:
            name = km.group(1)
            cur = kernels.setdefault(name, _Kernel(name))
            continue
        lm = _LABEL_RE.match(line)
        if lm:
            if cur is not None:
                cur.pending_labels.append(lm.group(1))
            continue
        if line.startswith(_BENIGN_PREFIXES) or line in ("{", "}"):
            continue
        if set(line) <= set(".") or line.startswith("...."):
            continue
        unknown_lines += 1
        if not first_bad:
            first_bad = f"line {lineno}: {line[:60]!r}"
    if unknown_lines:
        raise BadInput(f"not a SASS listing: {unknown_lines} line(s) are not SASS, first {first_bad}", where)
    programs = {}
    for name, k in kernels.items():
        if not k.insns:
            continue
        programs[name] = _finish(k, arch, where, unknown_ops)
    if not programs:
        raise BadInput("no SASS instructions found", where)
    return programs


def _parse_insn(body: str, index: int, address: int, lineno: int, where: str,
                unknown_ops: dict[str, int]) -> Instruction | None:
    body = body.strip().strip("{}").strip()
    if body.startswith("/*"):
        raise BadInput(f"SASS line {lineno} is not an instruction: {body[:60]!r}", where)
    if not body:
        return None
    if not body.endswith(";"):
        raise BadInput(f"SASS instruction at line {lineno} is cut short (no ';'): {body[:60]!r}", where)
    return _parse_body(body[:-1].strip(), index, address, lineno, where, unknown_ops)


def _parse_body(body: str, index: int, address: int, lineno: int, where: str,
                unknown_ops: dict[str, int]) -> Instruction:
    """One instruction's text without its ``;`` (stripped): predicate, opcode.modifiers, operands, targets."""
    # nvdisasm's annotation of an indirect branch through a jump table (a dense ``switch``: flash-attn-4's
    # Blackwell forward dispatches its warp roles so): ``BRX R4 -0x980 (*"BRANCH_TARGETS .L_x_315,.L_x_6"*)``
    annotated: tuple = ()
    am = _ANNOTATION_RE.search(body) if "(*" in body else None
    if am:
        tm = re.match(r'"BRANCH_TARGETS\s+([^"]*)"', am.group(1).strip())
        if tm:
            annotated = tuple(t.strip() for t in tm.group(1).split(",") if t.strip())
        body = (body[:am.start()] + body[am.end():]).strip()
    pred = ""
    pm = _PRED_RE.match(body) if body.startswith("@") else None
    if pm:
        pred = pm.group(1)
        body = body[pm.end():]
    head, _, rest = body.partition(" ")
    parts = head.split(".")
    opcode = parts[0]
    if opcode not in _OK_OPCODES and not _OPCODE_RE.fullmatch(opcode):
        raise BadInput(f"SASS instruction at line {lineno} has no opcode: {body[:60]!r}", where)
    mods = tuple(parts[1:])
    operands = tuple(split_operands(rest)) if rest.strip() else ()
    targets = ()
    if opcode == "RET":
        pass  # ``RET.REL.NODEC R12 `(divsum)``: returns to its caller; the label names the function, not a target
    elif opcode in _BRANCHES or opcode in ("BSSY", "BREAK"):
        labs = _TARGET_RE.findall(rest) or list(annotated)
        if labs:
            targets = tuple(labs)
        elif operands and re.fullmatch(r"0x[0-9a-fA-F]+", operands[-1]):
            targets = (f"@0x{int(operands[-1], 16):x}",)
    if opcode in ("BRA", "BRX", "JMP", "JMX") and len(operands) >= 2 and _PRED_OPERAND_RE.fullmatch(operands[0]):
        # sm_100's uniform branch ``BRA.U !UP0, `(.L_x_4)`` (and ``@!P1 BRA !P3, ...``): the condition is an operand
        pred = pred or operands[0]
    cls = sass_class(opcode, mods)
    if opcode == "HFMA2" and "MMA" in mods and operands[1:3] == ("-RZ", "RZ"):
        cls = "move"  # the compiler's idiom for materialising a constant
    if cls is None:
        unknown_ops[opcode] = unknown_ops.get(opcode, 0) + 1
        cls = "other"
    return Instruction(index=index, opcode=opcode, mods=mods, operands=operands, pred=pred, targets=targets,
                       address=address, line=lineno, opclass=cls)


_SLOW_OPCODES = frozenset(_BRANCHES | {"BSSY", "HFMA2"})  # targets; HFMA2.MMA's constant idiom
_CLASS_CACHE: dict[tuple[str, str], tuple[tuple, str | None]] = {}


def _plain_insn(opcode: str, modtext: str, rest: str, pred: str, index: int, address: int, lineno: int,
                unknown_ops: dict[str, int]) -> Instruction:
    """The common instruction (no branch target, no annotation, no parenthesis), from the line regex's groups:
    the same fields :func:`_parse_body` gives it."""
    key = (opcode, modtext)
    hit = _CLASS_CACHE.get(key)
    if hit is None:
        mods = tuple(modtext[1:].split(".")) if modtext else ()
        hit = _CLASS_CACHE[key] = (mods, sass_class(opcode, mods))
    mods, cls = hit
    if cls is None:
        unknown_ops[opcode] = unknown_ops.get(opcode, 0) + 1
        cls = "other"
    rest = rest.strip()
    if not rest:
        operands = ()
    else:
        operands = tuple(rest.split(", "))  # nvdisasm's own separator; anything else takes the general split
        if "[" in rest or "{" in rest or "  " in rest or rest.count(",") != len(operands) - 1 or "" in operands \
                or operands[0] != operands[0].strip() or operands[-1] != operands[-1].strip():
            operands = tuple(split_operands(rest))
    return Instruction(index=index, opcode=opcode, mods=mods, operands=operands, pred=pred, targets=(),
                       address=address, line=lineno, opclass=cls)


def _finish(k: _Kernel, arch: str | None, where: str, unknown_ops: dict[str, int]) -> Program:
    # Absolute-address targets (cuobjdump) become synthetic labels.
    for insn in k.insns:
        if insn.targets and insn.targets[0].startswith("@"):
            addr = int(insn.targets[0][3:], 16)
            if addr not in k.addr_index:
                raise BadInput(f"{insn.full} at /*{insn.address:04x}*/ jumps to 0x{addr:x}, outside the listing "
                               "(cut short?)", where)
            k.labels.setdefault(insn.targets[0], k.addr_index[addr])
        if insn.opcode == "CALL" and any(t not in k.labels for t in insn.targets):
            insn.targets = tuple(t for t in insn.targets if t in k.labels)  # an external function (``vprintf``)
        for t in insn.targets:
            if t not in k.labels:
                raise BadInput(f"{insn.full} at /*{insn.address:04x}*/ jumps to {t}, which the listing never "
                               "defines (cut short?)", where)
    # Addresses must rise in one step size; a gap or a step back means a damaged or spliced listing.
    addrs = [i.address for i in k.insns]
    if len(addrs) > 1:
        steps = {b - a for a, b in zip(addrs, addrs[1:], strict=False)}
        if len(steps) != 1 or min(steps) <= 0:
            step = addrs[1] - addrs[0]
            bad = next(i for i, (a, b) in enumerate(zip(addrs, addrs[1:], strict=False))
                       if b - a != step or b - a <= 0)
            raise BadInput(f"SASS addresses are not contiguous in kernel {k.name} near /*{addrs[bad + 1]:04x}*/ "
                           "(damaged or spliced listing)", where)
    last_real = next((i for i in reversed(k.insns) if i.opcode != "NOP"), None)
    if last_real is None or last_real.opcode not in ("EXIT", "BRA", "RET", "JMP", "BRX", "JMX", "KILL"):
        raise BadInput(f"kernel {k.name} does not end in EXIT/BRA (listing cut short?)", where)
    prog = Program(kernel=k.name, dialect="sass", instructions=k.insns, labels=k.labels, arch=arch)
    prog.unknown = {op: n for op, n in unknown_ops.items() if any(i.opcode == op for i in k.insns)}
    return prog
