"""Unified diffs of kernel sources: apply one strictly, or make one.

An agent may answer with a unified diff against its parent kernel's source (``diff -u`` / ``git diff``
output) instead of the whole file. :func:`apply_unified_diff` applies it with no fuzz: every hunk's
context and removed lines must be found, exactly, either where the hunk header says (after the shift of
the hunks before it) or at exactly one other place in the file; anything else is refused with one line
naming the hunk. A diff that touches more than one file, or holds no hunk, is refused too. Nothing in a
diff is executed; the result is plain text handed to the target backend's build like any source.

:func:`make_unified_diff` is the inverse, for reports and for agents' examples.
"""

from __future__ import annotations

import difflib
import re

from mosaic.errors import BadInput

HUNK = re.compile(r"^@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@")


def _hunks(diff: str, where: str) -> list[tuple[int, list[str], list[str]]]:
    """(old start, old lines, new lines) of every hunk, checked against its header's line counts."""
    lines = diff.splitlines(keepends=True)
    hunks: list[tuple[int, list[str], list[str]]] = []
    files = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files += 1
            if files > 1:
                raise BadInput("the diff touches more than one file; send one kernel file's diff", where)
            i += 2
            continue
        m = HUNK.match(line)
        if not m:
            if hunks:
                raise BadInput(f"line {i + 1} of the diff is neither a hunk line nor a hunk header: "
                               f"{line.rstrip()[:80]!r}", where)
            i += 1  # preamble (diff --git, index ...) before the first hunk
            continue
        old_start, old_n = int(m.group(1)), int(m.group(2) or 1)
        new_n = int(m.group(4) or 1)
        old, new = [], []
        i += 1
        while i < len(lines) and (len(old) < old_n or len(new) < new_n):
            body = lines[i]
            tag, text = body[:1], body[1:]
            if body.startswith("\\"):  # "\ No newline at end of file": the previous line has no newline
                _strip_last_newline(old, new, lines[i - 1][:1])
            elif tag == " " or body in ("\n", "\r\n"):
                text = text if tag == " " else body
                old.append(text)
                new.append(text)
            elif tag == "-":
                old.append(text)
            elif tag == "+":
                new.append(text)
            else:
                raise BadInput(f"hunk {len(hunks) + 1} (line {i + 1}) ends before its header's line counts "
                               f"(-{old_n} +{new_n})", where)
            i += 1
        if len(old) != old_n or len(new) != new_n:
            raise BadInput(f"hunk {len(hunks) + 1} holds -{len(old)} +{len(new)} lines, its header says "
                           f"-{old_n} +{new_n}", where)
        if i < len(lines) and lines[i].startswith("\\"):
            _strip_last_newline(old, new, lines[i - 1][:1])
            i += 1
        hunks.append((old_start, old, new))
    if not hunks:
        raise BadInput("the diff holds no hunk (@@ -a,b +c,d @@)", where)
    return hunks


def _strip_last_newline(old: list[str], new: list[str], tag: str) -> None:
    sides = {" ": (old, new), "-": (old,), "+": (new,)}.get(tag, ())
    for side in sides:
        if side:
            side[-1] = side[-1].rstrip("\r\n")


def _find(text: list[str], block: list[str], at: int) -> int | None:
    """Where ``block`` sits in ``text``: at ``at`` when it matches there, else its one other place."""
    n = len(block)
    if 0 <= at <= len(text) - n and text[at:at + n] == block:
        return at
    if not block:
        return at if 0 <= at <= len(text) else None
    places = [j for j in range(len(text) - n + 1) if text[j:j + n] == block]
    return places[0] if len(places) == 1 else None


def apply_unified_diff(original: str, diff: str, where: str = "diff") -> str:
    """``original`` with ``diff`` applied (strict: no fuzz); BadInput naming the first hunk that does not apply."""
    text = original.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # next line of ``text`` not yet copied
    shift = 0
    for n, (old_start, old, new) in enumerate(_hunks(diff, where), 1):
        at = _find(text, old, max(old_start - 1, 0) + shift) if old else max(old_start, 0) + shift
        if at is None or at < pos:
            first = next((ln for ln in old if ln.strip()), old[0] if old else "")
            raise BadInput(f"hunk {n} (@@ -{old_start},{len(old)}) does not apply: its context and removed lines "
                           f"are not in the parent's source at one place (first: {first.rstrip()[:60]!r})", where)
        out.extend(text[pos:at])
        out.extend(new)
        pos = at + len(old)
        shift = at - (old_start - 1) if old else shift
    out.extend(text[pos:])
    return "".join(out)


def make_unified_diff(a: str, b: str, name: str = "kernel") -> str:
    """The unified diff from ``a`` to ``b`` (3 lines of context), as ``diff -u`` would print it."""
    lines = difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                 fromfile=f"a/{name}", tofile=f"b/{name}")
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


__all__ = ["apply_unified_diff", "make_unified_diff"]
