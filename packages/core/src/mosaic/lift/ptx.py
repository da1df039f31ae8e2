"""PTX parser: every ``.entry`` of a PTX module, with its performance directives and shared memory.

Statements are split at ``;`` with scoping braces and labels peeled off; instructions keep their guard
predicate, opcode, modifiers and operands, and branches their target labels. A module with no entry, a body
that never closes (cut short) or a branch to an undefined label raises :class:`~mosaic.errors.BadInput`.
"""

from __future__ import annotations

import re

from mosaic.errors import BadInput
from mosaic.lift.instruction import Instruction, Program, split_operands
from mosaic.lift.opclass import ptx_class

# an unclosed ``/*`` runs to the end of the text (matched once, not re-scanned from every later ``/*``)
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?(?:\*/|\Z)", re.S)
_ENTRY_RE = re.compile(r"\.entry\s+([\w$]+)\s*\(?")
_LEAD_RE = re.compile(r"^\s*(?:[{}]|[\w$.]+\s*:(?!:))\s*")
_PRED_RE = re.compile(r"^@(!?[%\w$]+)\s+")
_OPCODE_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# the element type follows ``.shared`` on its own line within a few qualifiers (``.align 16``): the bounded
# gap keeps the scan linear on hostile text (an unbounded one re-scanned the rest of the module per match)
_SHARED_RE = re.compile(r"\.shared\b[^;\n]{0,160}?\.(?:b|u|s|f)(8|16|32|64)\s+([\w$]+)\s*((?:\[\s*\d*\s*\])*)")
_TARGET_RE = re.compile(r"\.target\s+(sm_\d+[af]?)")
_DIRECTIVES = {"maxntid": 3, "reqntid": 3, "reqnctapercluster": 3, "maxnreg": 1, "minnctapersm": 1,
               "maxnctapersm": 1, "maxclusterrank": 1}


def looks_like_ptx(text: str) -> bool:
    head = _COMMENT_RE.sub("", text[:50_000])
    return bool(re.search(r"^\s*\.(version|target|entry|visible\s+\.entry)\b", head, re.M))


def _shared_bytes(decl_text: str) -> int:
    total = 0
    for m in _SHARED_RE.finditer(decl_text):
        elems = 1
        for dim in re.findall(r"\[\s*(\d*)\s*\]", m.group(3)):
            elems *= int(dim) if dim else 0  # extern (dynamic) arrays count 0
        total += elems * int(m.group(1)) // 8
    return total


def parse_ptx(text: str, *, where: str = "PTX") -> dict[str, Program]:
    """Every kernel (``.entry``) of a PTX module, by name."""
    if "\x00" in text:
        raise BadInput("binary data where PTX text was expected", where)
    src = _COMMENT_RE.sub(" ", text)
    arch_m = _TARGET_RE.search(src)
    arch = arch_m.group(1) if arch_m else None
    programs: dict[str, Program] = {}
    module_shared = {m.group(2): m for m in _SHARED_RE.finditer(src)}
    pos = 0
    while True:
        m = _ENTRY_RE.search(src, pos)
        if not m:
            break
        name = m.group(1)
        open_at = src.find("{", m.end())
        if open_at < 0:
            raise BadInput(f"PTX kernel {name} has no body (cut short?)", where)
        header = src[m.end():open_at]
        depth, i = 0, open_at
        close_at = -1
        for j in range(open_at, len(src)):
            c = src[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    close_at = j
                    break
        if close_at < 0:
            raise BadInput(f"the body of PTX kernel {name} never closes (cut short?)", where)
        i = close_at
        programs[name] = _parse_body(name, header, src[open_at + 1:close_at], arch, where, module_shared)
        pos = i + 1
    if not programs:
        raise BadInput("no PTX kernel (.entry) found" if looks_like_ptx(text) else "not PTX: no .version/.target/.entry",
                       where)
    return programs


_LINE_INFO_RE = re.compile(r"^[ \t]*\.(loc|file)\b[^\n;]*$", re.M)


def _parse_body(name: str, header: str, body: str, arch: str | None, where: str, module_shared: dict) -> Program:
    directives: dict = {}
    for key, n in _DIRECTIVES.items():
        dm = re.search(rf"\.{key}\s+([\d\s,]+)", header)
        if dm:
            nums = [int(x) for x in re.findall(r"\d+", dm.group(1))][:n]
            directives[key] = tuple(nums + [1] * (n - len(nums))) if n == 3 else nums[0]
    if re.search(r"\.explicitcluster\b", header):
        directives["explicitcluster"] = True
    insns: list[Instruction] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    unknown: dict[str, int] = {}
    decls = []
    # ``.loc``/``.file`` line-info directives end at the newline, not at a ';': left in, they would swallow the
    # instruction that follows them into one "declaration"
    body = _LINE_INFO_RE.sub("", body)
    # Labels are scoped by braces: CUTLASS's and jax's inline-asm mbarrier waits each define ``LAB_WAIT:`` and
    # ``DONE:`` inside their own ``{ }``, so a label is keyed by its scope and a branch resolves to the innermost
    # enclosing scope that defines it (after the whole body is read: branches may jump forward).
    scope: list[int] = [0]
    n_scopes = 0
    defined: dict[tuple[str, int], int] = {}
    branch_scopes: dict[int, tuple] = {}
    for piece in body.split(";"):
        stmt = piece
        while True:
            lm = _LEAD_RE.match(stmt)
            if not lm or lm.end() == 0:
                break
            tok = lm.group(0).strip()
            if tok == "{":
                n_scopes += 1
                scope.append(n_scopes)
            elif tok == "}":
                if len(scope) > 1:
                    scope.pop()
            else:
                pending.append((tok.rstrip(":").strip(), scope[-1]))
            stmt = stmt[lm.end():]
        stmt = stmt.strip()
        while stmt.endswith("}"):
            stmt = stmt[:-1].strip()
            if len(scope) > 1:
                scope.pop()
        if not stmt:
            continue
        if stmt.startswith("."):
            decls.append(stmt + ";")
            continue
        pred = ""
        pm = _PRED_RE.match(stmt)
        if pm:
            pred = pm.group(1).replace("%", "")
            stmt = stmt[pm.end():]
        head, _, rest = stmt.partition(" ")
        if "\t" in head:
            head, _, more = head.partition("\t")
            rest = more + " " + rest
        parts = head.split(".")
        opcode = parts[0]
        if not _OPCODE_RE.match(opcode):
            raise BadInput(f"not a PTX statement in kernel {name}: {stmt[:60]!r}", where)
        mods = tuple(p for p in parts[1:] if p)
        operands = tuple(split_operands(rest)) if rest.strip() else ()
        cls = ptx_class(opcode, mods)
        if cls is None:
            unknown[opcode] = unknown.get(opcode, 0) + 1
            cls = "other"
        targets = ()
        if opcode in ("bra", "brx") and operands:
            targets = tuple(t for t in re.findall(r"[\w$]+", operands[-1]) if not t.startswith("%"))
            if opcode == "bra":
                targets = targets[:1]
        insn = Instruction(index=len(insns), opcode=opcode, mods=mods, operands=operands, pred=pred,
                           targets=targets, opclass=cls)
        for lab in pending:
            defined[lab] = insn.index
        pending.clear()
        if targets:
            branch_scopes[insn.index] = tuple(scope)
        insns.append(insn)
    if not insns:
        raise BadInput(f"PTX kernel {name} has no instructions", where)
    if pending:  # labels at the very end point one past the last instruction: give them a ret-like anchor
        for lab in pending:
            defined[lab] = len(insns) - 1

    def key(lab: str, sc: int) -> str:
        return lab if sc == 0 else f"{lab}@{{{sc}}}"

    for (lab, sc), idx in defined.items():
        labels[key(lab, sc)] = idx
    for idx, chain in branch_scopes.items():
        insn = insns[idx]
        resolved = []
        for t in insn.targets:
            sc = next((c for c in reversed(chain) if (t, c) in defined), None)
            if sc is None:
                raise BadInput(f"PTX kernel {name}: {insn.full} jumps to {t}, which is never defined", where)
            resolved.append(key(t, sc))
        insn.targets = tuple(resolved)
    decl_text = " ".join(decls)
    shared = _shared_bytes(decl_text)
    declared = {m.group(2) for m in _SHARED_RE.finditer(decl_text)}
    for sym, sm in module_shared.items():  # module-scope .shared symbols the body names
        if sym not in declared and re.search(rf"\b{re.escape(sym)}\b", body):
            shared += _shared_bytes(sm.group(0))
    directives["shared_bytes"] = shared
    return Program(kernel=name, dialect="ptx", instructions=insns, labels=labels, arch=arch,
                   directives=directives, unknown=unknown)
