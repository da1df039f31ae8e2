"""Mechanical source rewrites of ``.cu`` kernel files (language ``cutlass``): catalog concepts edited without an agent.

The rules are data (:data:`RULES`): each names its catalog concept, the diff rows it moves, the side and form
tokens (:class:`mosaic.records.Rewrite`), and one edit function with its parameters. Every edit works on a
*mask* of the file: comments, string and character literals and preprocessor lines (``#include``, ``#define``,
``#pragma`` ...) blanked to spaces, same length, so a match is always code and its offsets are the original
text's. Identifiers match on word boundaries; a member (``.expf``, ``->expf``) or another namespace's function
(``cute::expf``) never matches, ``::expf`` and ``std::expf`` do. The ``// mosaic:`` contract lines are kept;
the flag rewrites edit (or add) the ``// mosaic:nvcc-flags`` line only.

Sides, one convention for every ``*.form`` rewrite: ``gain`` when the edit *produces* a form token in the row
(``forms`` is that token: ``exp-approx`` gains ``approx`` in ``exp.form``), ``lose`` when it only removes one
(``rsqrt-approx`` removes the IEEE divide of ``1.0f / sqrtf``: ``div.form`` loses ``ieee``). A categorical row
(``fma.contraction``) is moved to the value in ``forms`` (core skips the rewrite when the candidate has it); a
numeric row (``loop.unroll``) is raised by a ``gain`` rewrite and lowered by a ``lose`` one (core picks by
whether the reference's value is above or below the candidate's).

``apply(text, row=None)``: ``row`` (a diff row: ``reference``/``candidate``) is read by the unroll rewrites,
which take the reference's numeric unroll as their target; every other rewrite ignores it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from mosaic.records import Rewrite
from mosaic.rewrites import NotApplicable

LANGUAGE = "cutlass"
LOG2E = "1.4426950408889634f"

# -- the mask: code only ---------------------------------------------------------------------------


def mask(text: str) -> str:
    """``text`` with comments, the contents of string/char literals and preprocessor lines (with their
    backslash continuations) replaced by spaces; newlines and the quotes stay, so offsets are the text's."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":  # a preprocessor line: blank to its end (continuations included)
            j = i
            while j < n and text[j] != "\n":
                if text.startswith("/*", j):  # a block comment inside the directive may span lines
                    k = text.find("*/", j + 2)
                    k = n if k < 0 else k + 2
                    j = k
                    continue
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                j += 1
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [ch if ch == "\n" else " " for ch in text[i:j]]
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            out[i + 2:end - 1] = [ch if ch == "\n" else " " for ch in text[i + 2:end - 1]]
            i = end
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and re.match(r"'\w", text[i:]):
                i += 1  # a digit separator (1'000)
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out[i + 1:min(j, n)] = " " * max(0, min(j, n) - i - 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


# -- scanning the mask -----------------------------------------------------------------------------

_OPEN, _CLOSE = {"(": ")", "[": "]", "{": "}"}, {")": "(", "]": "[", "}": "{"}
_IDENT = re.compile(r"[A-Za-z_]\w*")
_NUMBER = re.compile(r"(?:0[xX][0-9a-fA-F']+[uUlL]*|(?:\d[\d']*\.?[\d']*|\.\d[\d']*)(?:[eE][+-]?\d+)?[fFlLuU]*)")
_FLOAT_LITERAL = re.compile(r"(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][+-]?\d+)?[fF]|\d+\.?\d*[eE][+-]?\d+[fF]")
_DOUBLE_LITERAL = re.compile(r"(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[lL]?|\d+[eE][+-]?\d+[lL]?")
_INT_LITERAL = re.compile(r"(?:0[xX][0-9a-fA-F']+|\d[\d']*)[uUlL]*")


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _close(m: str, i: int) -> int:
    """Index just past the bracket matching the opener at ``m[i]``; -1 when unbalanced."""
    stack = [_OPEN[m[i]]]
    j = i + 1
    while j < len(m):
        ch = m[j]
        if ch in _OPEN:
            stack.append(_OPEN[ch])
        elif ch in _CLOSE:
            if ch != stack[-1]:
                return -1
            stack.pop()
            if not stack:
                return j + 1
        j += 1
    return -1


def _open(m: str, j: int) -> int:
    """Index of the opener matching the closer at ``m[j]``; -1 when unbalanced."""
    stack = [_CLOSE[m[j]]]
    i = j - 1
    while i >= 0:
        ch = m[i]
        if ch in _CLOSE:
            stack.append(_CLOSE[ch])
        elif ch in _OPEN:
            if ch != stack[-1]:
                return -1
            stack.pop()
            if not stack:
                return i
        i -= 1
    return -1


def _skip_ws(m: str, i: int) -> int:
    while i < len(m) and m[i].isspace():
        i += 1
    return i


def _skip_ws_back(m: str, i: int) -> int:
    """The index of the last non-space character before ``i`` (-1 when none)."""
    i -= 1
    while i >= 0 and m[i].isspace():
        i -= 1
    return i


def _word_before(m: str, i: int) -> str:
    """The identifier ending just before ``i`` (spaces skipped), or ''."""
    j = _skip_ws_back(m, i)
    k = j
    while k >= 0 and _is_word(m[k]):
        k -= 1
    return m[k + 1:j + 1] if j >= 0 and _is_word(m[j]) else ""


def _template_args(m: str, i: int) -> int:
    """At ``m[i] == '<'``: index past the matching ``>`` when the args hold no operators but ``::``, else -1."""
    depth, j = 0, i
    while j < len(m):
        ch = m[j]
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
            if not depth:
                return j + 1
        elif ch in ";{}()=|&?!+-/%":
            return -1
        j += 1
    return -1


def _primary_forward(m: str, i: int) -> int:
    """End of the postfix expression starting at ``i`` (an identifier chain with calls and subscripts, a
    literal or a parenthesised group); -1 when none starts there."""
    i = _skip_ws(m, i)
    if i >= len(m):
        return -1
    if m[i] == "(":
        j = _close(m, i)
    elif m[i].isdigit() or (m[i] == "." and i + 1 < len(m) and m[i + 1].isdigit()):
        lit = _NUMBER.match(m, i)
        j = lit.end() if lit else -1
        return j
    elif _is_word(m[i]):
        j = _IDENT.match(m, i).end()
        while m.startswith("::", j) and _IDENT.match(m, j + 2):
            j = _IDENT.match(m, j + 2).end()
        k = _skip_ws(m, j)
        if k < len(m) and m[k] == "<":  # a template call (static_cast<float>(...), from_float<T>(...))
            t = _template_args(m, k)
            if t > 0 and _skip_ws(m, t) < len(m) and m[_skip_ws(m, t)] == "(":
                j = t
    else:
        return -1
    while j > 0:
        k = _skip_ws(m, j)
        if k < len(m) and m[k] in "([":
            j = _close(m, k)
        elif m.startswith(".", k) and _IDENT.match(m, k + 1):
            j = _IDENT.match(m, k + 1).end()
        elif m.startswith("->", k) and _IDENT.match(m, k + 2):
            j = _IDENT.match(m, k + 2).end()
        else:
            break
    return j


def _primary_backward(m: str, j: int) -> int:
    """Start of the postfix expression ending just before ``j``; -1 when none ends there."""
    k = _skip_ws_back(m, j)
    if k < 0:
        return -1
    while True:
        ch = m[k]
        if ch in ")]":
            o = _open(m, k)
            if o < 0:
                return -1
            start = o
            p = _skip_ws_back(m, o)
            if p >= 0 and (_is_word(m[p]) or m[p] in ")]"):
                k = p  # a call or a subscript: its callee / array before it
                continue
            if ch == ")" and p >= 0 and m[p] == ">":  # from_float<T>(...): the template arguments, then the name
                depth, q = 0, p
                while q >= 0:
                    depth += {">": 1, "<": -1}.get(m[q], 0)
                    if not depth:
                        break
                    q -= 1
                r = _skip_ws_back(m, q)
                if q < 0 or r < 0 or not _is_word(m[r]):
                    return -1
                k = r
                continue
            return start
        if _is_word(ch) or ch == ".":
            q = k
            while q >= 0 and (_is_word(m[q]) or m[q] == "."):
                q -= 1
            word = m[q + 1:k + 1]
            if re.match(r"\d|\.\d", word):  # a number; 1e-6f is scanned as '6f', then '1e-'
                if q >= 1 and m[q] in "+-" and m[q - 1] in "eE" and re.fullmatch(r"\d+[fFlL]?", word):
                    q2 = q - 1
                    while q2 >= 0 and (_is_word(m[q2]) or m[q2] == "."):
                        q2 -= 1
                    if re.fullmatch(r"(?:\d+\.?\d*|\.\d+)[eE]", m[q2 + 1:q]):
                        return q2 + 1
                return q + 1
            if word.startswith("."):  # a member of a postfix expression: a[i].x, f().y
                if q >= 0 and m[q] in ")]":
                    k = q
                    continue
                return -1
            p = _skip_ws_back(m, q + 1)
            if p >= 1 and m[p - 1:p + 1] == "::":
                r = _skip_ws_back(m, p - 1)
                if r >= 0 and _is_word(m[r]):
                    k = r
                    continue
                return p - 1
            if p >= 1 and m[p - 1:p + 1] == "->":
                k = _skip_ws_back(m, p - 1)
                continue
            return q + 1
        return -1


# -- what a file declares ---------------------------------------------------------------------------

_INT_TYPES = ("int", "unsigned", "long", "short", "char", "bool", "size_t", "int32_t", "int64_t", "uint32_t",
              "uint64_t", "int8_t", "uint8_t", "int16_t", "uint16_t", "ptrdiff_t")
_OTHER_TYPES = ("auto", "half", "__half", "__nv_bfloat16", "__half2", "__nv_bfloat162", "MOSAIC_T", "T",
                "float2", "float4", "double2", "double4", "int2", "int4", "uint2", "uint4", "dim3")
_DECL = re.compile(r"\b(float|double|" + "|".join(_INT_TYPES + _OTHER_TYPES) +
                   r")\b((?:\s*(?:const|volatile|__restrict__|\*|&))*)\s*([A-Za-z_]\w*)\b(?!\s*::)")
_FLOAT_FUNCTIONS = frozenset({"sqrtf", "rsqrtf", "expf", "__expf", "exp2f", "exp10f", "logf", "__logf", "log2f",
                              "fmaxf", "fminf", "fabsf", "powf", "__powf", "tanhf", "sinf", "cosf", "__fdividef",
                              "fmaf", "__fmaf_rn", "__fmul_rn", "__fadd_rn", "__frcp_rn", "__fsqrt_rn",
                              "__bfloat162float", "__half2float", "__int2float_rn", "__uint2float_rn"})
_INT_BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim"})


def declarations(m: str) -> dict[str, set[str]]:
    """name -> the kinds (float, double, int, other) the masked file declares it with (parameters,
    variables, members, functions' return types); a name declared with several kinds is of none."""
    kinds: dict[str, set[str]] = {}
    for d in _DECL.finditer(m):
        t = d.group(1)
        if d.group(3) in ("const", "volatile", "__restrict__"):
            continue
        kind = t if t in ("float", "double") else "int" if t in _INT_TYPES else "other"
        kinds.setdefault(d.group(3), set()).add(kind)
    return kinds


def _one_kind(decls: Mapping[str, set[str]], name: str) -> str:
    got = decls.get(name, set())
    return next(iter(got)) if len(got) == 1 else "unknown"


def operand_kind(expr: str, decls: Mapping[str, set[str]]) -> str:
    """float, int, double or unknown for one operand (masked text of a postfix expression)."""
    e = expr.strip()
    if not e:
        return "unknown"
    if _FLOAT_LITERAL.fullmatch(e):
        return "float"
    if _DOUBLE_LITERAL.fullmatch(e):
        return "double"
    if _INT_LITERAL.fullmatch(e):
        return "int"
    cast = re.match(r"static_cast\s*<\s*(const\s+)?(\w+)\s*>\s*\(", e)
    if cast and _close(e, cast.end() - 1) == len(e):
        t = cast.group(2)
        return t if t in ("float", "double") else "int" if t in _INT_TYPES else "unknown"
    if e[0] == "(" and _close(e, 0) == len(e):
        return _group_kind(e[1:-1], decls)
    base = re.match(r"([A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*)", e)
    if not base:
        return "unknown"
    names = [s.strip() for s in base.group(1).split("::")]
    rest = e[base.end():].lstrip()
    if names[0] in _INT_BUILTINS and re.fullmatch(r"\.\s*[xyz]", rest):
        return "int"
    if re.match(r"\s*(\.|->)", rest):  # a member of a struct: its type is not read here
        return "unknown"
    name = names[-1]
    if rest.startswith("<"):  # a template call: from_float<T>(...)
        return "unknown"
    if rest.startswith("("):
        if name in _FLOAT_FUNCTIONS and (len(names) == 1 or names[:-1] == ["std"]):
            return "float"
        return "float" if _one_kind(decls, name) == "float" else "unknown"
    if rest and not rest.startswith("["):
        return "unknown"
    return _one_kind(decls, name)


def _group_kind(inner: str, decls: Mapping[str, set[str]]) -> str:
    """A parenthesised arithmetic expression: float when one of its terms is float and none is double or
    of another type; int when every term is int. Comparisons, logic, ternaries, commas, assignments and
    casts to anything but float make it unknown."""
    if re.search(r"[?<>=!,&|^~]|\bsizeof\b", re.sub(r"static_cast\s*<\s*float\s*>", "", inner)):
        return "unknown"
    if re.search(r"\(\s*(?:const\s+)?\w+\s*\**\s*\)\s*[\w(]", inner):  # a C cast
        return "unknown"
    kinds, i = [], 0
    while i < len(inner):
        i = _skip_ws(inner, i)
        if i >= len(inner):
            break
        if inner[i] in "+-*/%":
            i += 1
            continue
        j = _primary_forward(inner, i)
        if j <= i:
            return "unknown"
        kinds.append(operand_kind(inner[i:j], decls))
        i = j
    if not kinds or "double" in kinds or "unknown" in kinds:
        return "unknown" if "double" not in kinds else "double"
    return "float" if "float" in kinds else "int"


# -- calls ------------------------------------------------------------------------------------------


def _calls(m: str, name: str, qualified: bool = True) -> list[tuple[int, int, int, int]]:
    """``(start, name_end, open_paren, end)`` of each call of the free function ``name`` in the mask
    (``::name`` and ``std::name`` included when ``qualified``); never a member, another namespace's
    function or a declaration (``float expf(float)``)."""
    prefix = r"(?:(?:std[ \t]*)?::[ \t]*)?" if qualified else ""
    out = []
    for c in re.finditer(rf"(?<![\w.])(?<!::)(?<!->){prefix}\b{re.escape(name)}\b(?=\s*\()", m):
        k = _skip_ws_back(m, c.start())
        if k >= 0 and (m[k] == "." or m[k - 1:k + 1] in ("->", "::")):
            continue  # a member (obj . expf), another namespace's function (cute :: expf)
        before = _word_before(m, c.start())
        if before and before not in ("return", "co_return", "else", "do"):
            continue  # a declaration or a definition of the function itself (float expf(float))
        p = _skip_ws(m, c.end())
        end = _close(m, p)
        if end > 0:
            out.append((c.start(), c.end(), p, end))
    return out


def _args(m: str, p: int, end: int) -> list[tuple[int, int]]:
    """The spans of a call's top-level arguments between ``(`` at ``p`` and the ``)`` before ``end``."""
    spans, depth, start = [], 0, p + 1
    for j in range(p + 1, end - 1):
        ch = m[j]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((start, j))
            start = j + 1
    spans.append((start, end - 1))
    return [s for s in spans if m[s[0]:s[1]].strip()] if len(spans) > 1 or m[start:end - 1].strip() else []


def _edits(text: str, edits: list[tuple[int, int, str]], what: str) -> str:
    """Apply non-overlapping ``(start, end, replacement)`` edits; NotApplicable when there are none."""
    if not edits:
        raise NotApplicable(f"{what}: nothing to rewrite in this file")
    out, last = [], 0
    for start, end, new in sorted(edits):
        if start < last:
            continue  # nested in an edit already made (expf(expf(x)) is rewritten on the outer call only)
        out.append(text[last:start])
        out.append(new)
        last = end
    out.append(text[last:])
    return "".join(out)


def rename_call(text: str, row: Any = None, *, old: str, new: str, what: str) -> str:
    """Every call ``old(...)`` (``::old``, ``std::old``) becomes ``new(...)``; its arguments are kept."""
    m = mask(text)
    edits = [(s, e, new) for s, e, _, _ in _calls(m, old)]
    return _edits(text, edits, what)


def _top_level_scale(m: str, s: int, e: int) -> tuple[int, int] | None:
    """For an argument ``A * L`` (only ``*`` at its top level, ``L`` a float literal): the span of ``L``."""
    depth, ops = 0, []
    for j in range(s, e):
        ch = m[j]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0 and ch in "+-/%<>=&|^?,!~":
            if ch in "+-" and j > s and m[j - 1] in "eE" and j >= 2 and m[j - 2].isdigit():
                continue  # an exponent's sign
            return None
        elif depth == 0 and ch == "*":
            ops.append(j)
    if not ops:
        return None
    k = _skip_ws(m, ops[-1] + 1)
    lit = _FLOAT_LITERAL.match(m, k)
    if lit and m[lit.end():e].strip() == "":
        return k, lit.end()
    return None


def exp2_fold(text: str, row: Any = None, *, what: str) -> str:
    """``expf(E)`` -> ``exp2f((E) * log2(e))``: the exponential through ex2 with the log2(e) scale explicit;
    ``expf(A * 0.5f)`` -> ``exp2f(A * 0.72134752f)`` folds it into a float literal scale."""
    m = mask(text)
    edits = []
    for s, _, p, end in _calls(m, "expf"):
        args = _args(m, p, end)
        if len(args) != 1:
            continue
        a, b = args[0]
        scale = _top_level_scale(m, a, b)
        if scale is not None:
            lit = float(text[scale[0]:scale[1]].rstrip("fF"))
            arg = text[a:scale[0]] + f"{lit * 1.4426950408889634!r}f" + text[scale[1]:b]
            edits.append((s, end, f"exp2f({arg.strip()})"))
        else:
            edits.append((s, end, f"exp2f(({text[a:b].strip()}) * {LOG2E})"))
    return _edits(text, edits, what)


_ONE = re.compile(r"1(?:\.0*)?[fF]|1")
# what may stand before a rewritten quotient without binding tighter than '/' (or as tight, from the left)
_TIGHT_BEFORE = frozenset("*/%)!~.")


def _free_before(m: str, start: int) -> bool:
    """True when the operator before ``start`` binds looser than ``/`` (or there is none): ``x = a / b``,
    ``c - a / b``; False for ``c * a / b`` (that is ``(c * a) / b``), a cast ``(float)a / b``, ``!a``."""
    k = _skip_ws_back(m, start)
    if k < 0:
        return True
    if m[k] in _TIGHT_BEFORE:
        return False
    if m[k] in "+-" and k >= 1 and m[k - 1] == m[k]:
        return False  # ++a / b
    if m[k] == ">" and k >= 1 and m[k - 1] == "-":
        return False
    return True


def _quotients(m: str):
    """Each binary ``/`` of the mask with its operands: ``(left_start, slash, right_end)``."""
    for q in re.finditer(r"/", m):
        j = q.start()
        if m.startswith("/=", j) or (j >= 1 and m[j - 1] in "/*") or m.startswith("/*", j) or m.startswith("//", j):
            continue
        left = _primary_backward(m, j)
        if left < 0 or not _free_before(m, left):
            continue
        r = _skip_ws(m, j + 1)
        if r >= len(m) or m[r] in "+-*&!~":
            continue  # a unary operand (a / -b): left alone
        right = _primary_forward(m, r)
        if right < 0:
            continue
        after = _skip_ws(m, right)
        if m.startswith(("++", "--"), after):
            continue
        yield left, j, right


def rsqrt_approx(text: str, row: Any = None, *, what: str) -> str:
    """``1.0f / sqrtf(E)`` (``1.f``, ``1``) -> ``rsqrtf(E)``: MUFU.RSQ instead of an IEEE sqrt and divide."""
    m = mask(text)
    edits = []
    sqrts = {s: (p, end) for s, _, p, end in _calls(m, "sqrtf")}
    for left, slash, right in _quotients(m):
        if not _ONE.fullmatch(m[left:slash].strip()):
            continue
        r = _skip_ws(m, slash + 1)
        if r not in sqrts or sqrts[r][1] != right:
            continue
        p, end = sqrts[r]
        args = _args(m, p, end)
        if len(args) == 1:
            edits.append((left, right, f"rsqrtf({text[args[0][0]:args[0][1]].strip()})"))
    return _edits(text, edits, what)


def rsqrt_exact(text: str, row: Any = None, *, what: str) -> str:
    """``rsqrtf(E)`` -> ``(1.0f / sqrtf(E))``: an IEEE square root and divide instead of MUFU.RSQ."""
    m = mask(text)
    edits = []
    for s, _, p, end in _calls(m, "rsqrtf", qualified=False):
        args = _args(m, p, end)
        if len(args) == 1:
            edits.append((s, end, f"(1.0f / sqrtf({text[args[0][0]:args[0][1]].strip()}))"))
    return _edits(text, edits, what)


def div_approx(text: str, row: Any = None, *, what: str) -> str:
    """A float ``a / b`` -> ``__fdividef(a, b)`` where the file shows it is float: one operand a float literal
    (``1.0f``), a ``static_cast<float>``, a float-declared name (or element of a float array, or a call of a
    float function), and the other float or integer; never an integer, double or unknown-typed division."""
    m = mask(text)
    decls = declarations(m)
    edits = []
    for left, slash, right in _quotients(m):
        kinds = {operand_kind(m[left:slash], decls), operand_kind(m[slash + 1:right], decls)}
        if "float" in kinds and kinds <= {"float", "int"}:
            edits.append((left, right, f"__fdividef({text[left:slash].strip()}, {text[slash + 1:right].strip()})"))
    return _edits(text, edits, what)


def div_ieee(text: str, row: Any = None, *, what: str) -> str:
    """``__fdividef(a, b)`` -> ``((a) / (b))``: the IEEE division (div.rn) back."""
    m = mask(text)
    edits = []
    for s, _, p, end in _calls(m, "__fdividef", qualified=False):
        args = _args(m, p, end)
        if len(args) == 2:
            a, b = (text[x:y].strip() for x, y in args)
            edits.append((s, end, f"(({a}) / ({b}))"))
    return _edits(text, edits, what)


# -- per-file nvcc flags (the `// mosaic:nvcc-flags` line) ------------------------------------------

_FLAGS_LINE = re.compile(r"^([ \t]*//[ \t]*mosaic:nvcc-flags)[ \t]*(.*?)[ \t]*$", re.M)
_CONTRACT_LINE = re.compile(r"^[ \t]*//[ \t]*mosaic:[\w-]+.*$", re.M)


def set_flag(text: str, row: Any = None, *, what: str, add: str | None = None, remove: str | None = None) -> str:
    """Edit the file's ``// mosaic:nvcc-flags`` line: ``add`` a flag (replacing another value of its option:
    ``-fmad=false`` replaces ``-fmad=true``) or ``remove`` one; the line goes when it is left empty, and is
    added after the contract lines when there is none. NotApplicable when the line already says so."""
    from mosaic.errors import BadInput
    from mosaic.kernel_files import parse_nvcc_flags

    line = _FLAGS_LINE.search(text)
    try:
        flags = list(parse_nvcc_flags(line.group(2))) if line else []
    except BadInput as exc:
        raise NotApplicable(f"{what}: {exc.what}") from None
    if add is not None:
        option = add.split("=")[0]
        new = [f for f in flags if f.split("=")[0] != option] + [add]
    else:
        new = [f for f in flags if f != remove]
    if new == flags or (add is not None and add in flags):
        raise NotApplicable(f"{what}: the file's nvcc flags {'already hold' if add else 'hold no'} {add or remove}")
    if line:
        if new:
            return text[:line.start()] + f"{line.group(1)} {' '.join(new)}" + text[line.end():]
        end = line.end() + 1 if text[line.end():line.end() + 1] == "\n" else line.end()
        return text[:line.start()] + text[end:]
    contract = list(_CONTRACT_LINE.finditer(text))
    if not contract:
        raise NotApplicable(f"{what}: no '// mosaic:' contract lines (not a kernel file)")
    at = contract[-1].end()
    return text[:at] + f"\n// mosaic:nvcc-flags {' '.join(new)}" + text[at:]


# -- loop unrolling ---------------------------------------------------------------------------------

UNROLLS = (1, 2, 4, 8)
#: the unroll nvcc gives a small runtime-trip loop without a pragma (what unroll-more doubles when the row
#: does not say)
DEFAULT_UNROLL = 4
_PRAGMA = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+unroll\b[ \t]*(.*?)[ \t]*$")


def _statement_end(m: str, i: int) -> int:
    """Index past the statement starting at ``i`` (a block, a for/while/if with its body, or up to ';')."""
    i = _skip_ws(m, i)
    if i >= len(m):
        return -1
    if m[i] == "{":
        return _close(m, i)
    kw = _IDENT.match(m, i)
    if kw and kw.group() in ("for", "while", "if", "switch"):
        p = _skip_ws(m, kw.end())
        if p >= len(m) or m[p] != "(":
            return -1
        end = _statement_end(m, _close(m, p))
        if kw.group() == "if" and end > 0:
            e = _IDENT.match(m, _skip_ws(m, end))
            if e and e.group() == "else":
                return _statement_end(m, e.end())
        return end
    depth = 0
    for j in range(i, len(m)):
        ch = m[j]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth < 0:
                return -1
        elif ch == ";" and depth == 0:
            return j + 1
    return -1


@attrs.frozen
class Loop:
    start: int  # the `for` keyword
    end: int  # past its body
    pragma: tuple | None  # (line start, line end, the pragma's argument text) of a `#pragma unroll` before it
    body: int  # non-space characters of the body (its work, roughly)


def for_loops(text: str) -> list[Loop]:
    """Every ``for`` loop of the file, with the ``#pragma unroll`` line right above it (if any)."""
    m = mask(text)
    loops = []
    for f in re.finditer(r"\bfor\b(?=\s*\()", m):
        p = _skip_ws(m, f.end())
        header = _close(m, p)
        end = _statement_end(m, header) if header > 0 else -1
        if end < 0:
            continue
        line_start = text.rfind("\n", 0, f.start()) + 1
        pragma = None
        if not text[line_start:f.start()].strip() and line_start > 0:
            prev_end = line_start - 1
            prev_start = text.rfind("\n", 0, prev_end) + 1
            pm = _PRAGMA.match(text[prev_start:prev_end])
            if pm:
                pragma = (prev_start, prev_end, pm.group(1))
        loops.append(Loop(f.start(), end, pragma, len(re.sub(r"\s", "", m[header:end]))))
    return loops


def hot_loop(text: str) -> Loop:
    """The loop an unroll rewrite edits: among the loops that stay loops in the machine code (not under a
    bare ``#pragma unroll``, which unrolls a constant-trip loop completely), the innermost ones, and of those
    the one with the largest body. NotApplicable when there is none."""
    loops = [lp for lp in for_loops(text) if not (lp.pragma and not lp.pragma[2])]
    inner = [lp for lp in loops if not any(o is not lp and lp.start < o.start < lp.end for o in loops)]
    if not inner:
        raise NotApplicable("no runtime-trip for loop (every loop is under a full #pragma unroll)")
    return max(inner, key=lambda lp: (lp.body, -lp.start))


def _numeric(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 1 else None


def _pow2(n: int) -> int:
    return max(u for u in UNROLLS if u <= max(1, n))


def unroll(text: str, row: Any = None, *, more: bool, what: str) -> str:
    """Set ``#pragma unroll N`` on the hot loop (:func:`hot_loop`), N in 1, 2, 4, 8: the row's reference unroll
    when it is numeric and lies that way, else twice (more) or half (less) the loop's current one (its
    literal pragma, else the row's candidate value, else nvcc's usual 4). A non-literal count (a knob) is the
    knob's to change: NotApplicable."""
    loop = hot_loop(text)
    current = None
    if loop.pragma:
        arg = loop.pragma[2].strip().strip("()")
        if not re.fullmatch(r"\d+", arg):
            raise NotApplicable(f"{what}: the hot loop's '#pragma unroll {loop.pragma[2]}' is not a literal count "
                                "(a knob sets it)")
        current = int(arg)
    cand = _numeric(getattr(row, "candidate", None))
    ref = _numeric(getattr(row, "reference", None))
    base = current or cand or DEFAULT_UNROLL
    if ref is not None and ((more and ref > (cand or base)) or (not more and ref < (cand or base))):
        target = _pow2(min(ref, UNROLLS[-1]))
    else:
        target = _pow2(min(base * 2, UNROLLS[-1])) if more else _pow2(base // 2)
    if (more and target <= base) or (not more and target >= base) or target == current:
        raise NotApplicable(f"{what}: the hot loop's unroll ({base}) is already at the {'top' if more else 'bottom'}"
                            f" of {', '.join(map(str, UNROLLS))}")
    if loop.pragma:
        s, e, _ = loop.pragma
        indent = re.match(r"[ \t]*", text[s:e]).group()
        return text[:s] + f"{indent}#pragma unroll {target}" + text[e:]
    line_start = text.rfind("\n", 0, loop.start) + 1
    if text[line_start:loop.start].strip():  # `if (c) for (...)`: the pragma on a line of its own
        indent = re.match(r"[ \t]*", text[line_start:]).group()
        return text[:loop.start] + f"\n#pragma unroll {target}\n{indent}" + text[loop.start:]
    return text[:line_start] + f"#pragma unroll {target}\n" + text[line_start:]


# -- the table --------------------------------------------------------------------------------------


@attrs.frozen
class Rule:
    """One rewrite as data: its record's fields and the edit (a function of this module) with its parameters."""

    name: str
    concept: str
    rows: tuple
    side: str
    forms: tuple
    summary: str
    edit: Callable[..., str]
    params: Mapping = attrs.field(factory=dict)

    def record(self) -> Rewrite:
        fn = functools.partial(self.edit, what=self.name, **self.params)

        def apply(text: str, row: Any = None) -> str:
            return fn(text, row)

        apply.__name__ = apply.__qualname__ = self.name.replace("-", "_")
        apply.__doc__ = self.summary
        return Rewrite(rewrite=self.name, language=LANGUAGE, concept=self.concept, rows=self.rows, side=self.side,
                       summary=self.summary, apply=apply, forms=self.forms)


RULES: tuple[Rule, ...] = (
    Rule("exp-approx", "approximate-exp", ("exp.form",), "gain", ("approx",),
         "expf(E) -> __expf(E): ex2.approx (MUFU.EX2) instead of libdevice's accurate expf", rename_call,
         {"old": "expf", "new": "__expf"}),
    Rule("exp-precise", "approximate-exp", ("exp.form",), "gain", ("precise",),
         "__expf(E) -> expf(E): the accurate expf (range reduction, rounded FMAs) instead of ex2.approx",
         rename_call, {"old": "__expf", "new": "expf"}),
    Rule("exp2-fold", "approximate-exp", ("exp.form",), "gain", ("approx",),
         "expf(E) -> exp2f((E) * 1.4426950408889634f): ex2 with the log2(e) scale explicit (folded into a float "
         "literal scale: expf(A * s) -> exp2f(A * s*log2e))", exp2_fold),
    Rule("rsqrt-approx", "approximate-reciprocal", ("div.form",), "lose", ("ieee",),
         "1.0f / sqrtf(E) (1.f, 1) -> rsqrtf(E): MUFU.RSQ instead of an IEEE square root and divide", rsqrt_approx),
    Rule("rsqrt-exact", "approximate-reciprocal", ("div.form",), "gain", ("ieee",),
         "rsqrtf(E) -> (1.0f / sqrtf(E)): an IEEE square root and divide instead of MUFU.RSQ", rsqrt_exact),
    Rule("div-approx", "approximate-reciprocal", ("div.form",), "gain", ("approx",),
         "a / b -> __fdividef(a, b) where the file shows a float division (a float literal, static_cast<float> "
         "or float-declared operand, the other float or int): rcp.approx instead of div.rn", div_approx),
    Rule("div-ieee", "approximate-reciprocal", ("div.form",), "gain", ("ieee",),
         "__fdividef(a, b) -> ((a) / (b)): the IEEE division (div.rn) instead of rcp.approx", div_ieee),
    Rule("fast-math", "approximate-exp", ("exp.form", "div.form", "denormal.flush"), "gain", ("approx",),
         "adds -use_fast_math to the file's // mosaic:nvcc-flags line: ex2.approx, rcp.approx and approximate "
         "sqrt, flush-to-zero", set_flag, {"add": "-use_fast_math"}),
    Rule("fast-math-off", "approximate-exp", ("exp.form", "div.form", "denormal.flush"), "gain", ("precise", "ieee"),
         "removes -use_fast_math from the file's // mosaic:nvcc-flags line: accurate expf, IEEE divide and sqrt",
         set_flag, {"remove": "-use_fast_math"}),
    Rule("fmad-off", "fma-contraction", ("fma.contraction",), "gain", ("unfused",),
         "sets -fmad=false on the file's // mosaic:nvcc-flags line: a*b+c stays a multiply then an add "
         "(explicit fmaf calls are kept)", set_flag, {"add": "-fmad=false"}),
    Rule("fmad-on", "fma-contraction", ("fma.contraction",), "gain", ("fused",),
         "removes -fmad=false from the file's // mosaic:nvcc-flags line: nvcc contracts a*b+c into FFMA again",
         set_flag, {"remove": "-fmad=false"}),
    Rule("unroll-more", "cta-tile", ("loop.unroll",), "gain", (),
         "sets #pragma unroll N (1, 2, 4, 8) on the hot loop (innermost runtime-trip for loop, largest body): the "
         "row's reference unroll when larger, else twice the current one", unroll, {"more": True}),
    Rule("unroll-less", "cta-tile", ("loop.unroll",), "lose", (),
         "sets #pragma unroll N (1, 2, 4, 8) on the hot loop: the row's reference unroll when smaller, else half "
         "the current one", unroll, {"more": False}),
)

REWRITES: tuple[Rewrite, ...] = tuple(rule.record() for rule in RULES)

#: rows the C++ rewrites leave alone, and why (docs/catalog.md "Rewrites")
NOT_OFFERED = {
    "access.global.load_width": "a wider load (float -> float4) changes how many elements one thread handles per "
                                "access: its index arithmetic, loop bounds and alignment, which no text edit can "
                                "check; a kernel file exposes the width as a knob instead",
    "access.global.store_width": "as the load width: the store's index arithmetic and alignment change with it",
    "transfer.form": "moving from plain loads to cp.async or TMA adds shared-memory buffers, barriers and a "
                     "pipeline: a restructuring, not a mechanical edit",
}


__all__ = ["NOT_OFFERED", "REWRITES", "RULES", "Rule", "declarations", "for_loops", "hot_loop", "mask",
           "operand_kind"]
