"""Edits of a Python source located through :mod:`ast`, spliced into the text at the nodes' exact spans.

A rewrite never edits raw text by pattern: it parses the file, finds the nodes it changes (a call by its
qualified name, a keyword of that call, a binary operation) and replaces each node's source span
(``lineno``/``col_offset`` .. ``end_lineno``/``end_col_offset``; the columns are UTF-8 byte offsets, converted
here) with new text. Everything outside the spans -- comments, blank lines, the file's own formatting -- is
left as it was. Language-neutral: the Pallas and CuTe plugins' rewrites are written with it.

* :class:`Source` -- the text, its tree, the span of a node, its exact text, and the import aliases, so a
  call is matched by its qualified name (``jnp.exp`` in a file that ``import jax.numpy as jnp`` is
  ``jax.numpy.exp``) and new code is spelled with the file's own names (:meth:`Source.spell`).
* :class:`Edit` -- replace ``[start, end)`` by ``text``; :meth:`Source.apply` splices a list of them
  (overlapping edits are an error, no edit is :class:`~mosaic.rewrites.NotApplicable`).
* keyword edits of a call: :meth:`Source.set_keyword` (replace its value, or add ``name=value`` after the
  last argument), :meth:`Source.remove_keyword` (with its comma).
* :func:`edit_until_done` -- rounds of find-and-splice for edits whose matches disappear once made (an
  ``exp`` inside another ``exp``'s argument is edited in the next round, on the re-parsed text).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable, Iterable

import attrs

from mosaic.rewrites import NotApplicable

_NEWLINE = re.compile(r"\r\n|\r|\n")  # the line ends ast counts (not str.splitlines' form feeds and others)


@attrs.frozen
class Edit:
    """Replace the characters ``[start, end)`` of the text by ``text`` (``start == end``: an insertion)."""

    start: int
    end: int
    text: str

    def __attrs_post_init__(self):
        if not 0 <= self.start <= self.end:
            raise ValueError(f"an edit spans [{self.start}, {self.end})")


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None (a call's result, a subscript ...)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def literal(node: ast.AST | None):
    """The value of a literal node (``4``, ``True``, ``-1``), else the :data:`NOT_LITERAL` marker."""
    if node is None:
        return NOT_LITERAL
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return NOT_LITERAL


NOT_LITERAL = object()

#: nodes whose source can be an operand of ``*`` (or a call argument) without parentheses
_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set,
          ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class Source:
    """One Python source text, parsed: spans of nodes as character offsets, qualified names of calls."""

    def __init__(self, text: str, where: str = "<source>"):
        self.text = text
        self.tree = ast.parse(text, filename=where)
        self._starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]
        self.aliases = _aliases(self.tree)
        self._parents: dict[int, ast.AST] | None = None

    # -- positions ------------------------------------------------------------------------------------------
    def offset(self, lineno: int, col: int) -> int:
        """The character offset of ast's (1-based line, UTF-8 byte column)."""
        start = self._starts[lineno - 1]
        end = self._starts[lineno] if lineno < len(self._starts) else len(self.text)
        line = self.text[start:end]
        return start + len(line.encode("utf-8")[:col].decode("utf-8", errors="strict"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        if getattr(node, "end_lineno", None) is None:
            raise ValueError(f"{type(node).__name__} node has no source span")
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def operand(self, node: ast.AST) -> str:
        """The node's source, parenthesised unless it is an atom (a name, a call, a subscript, a literal)."""
        src = self.segment(node)
        return src if isinstance(node, _ATOMS) else f"({src})"

    # -- names ----------------------------------------------------------------------------------------------
    def qualified(self, node: ast.AST) -> str | None:
        """The qualified name of a Name/Attribute chain through the file's imports (``jnp.exp`` ->
        ``jax.numpy.exp``); a name no import binds keeps its own spelling."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        base = self.aliases.get(head, head)
        return f"{base}.{rest}" if rest else base

    def spell(self, qualified: str) -> str | None:
        """How this file writes ``qualified`` with its own imports (``cutlass.cute.arch.rcp_approx`` -> ``cute.arch
        .rcp_approx`` after ``import cutlass.cute as cute``); None when no import reaches it."""
        best = None
        for local, target in self.aliases.items():
            if qualified == target or qualified.startswith(target + "."):
                if best is None or len(target) > len(best[1]):
                    best = (local, target)
        if best is None:
            return None
        return best[0] + qualified[len(best[1]):]

    def calls(self, *qualified: str) -> list[ast.Call]:
        """Every call whose callee's qualified name is one of ``qualified``, in source order."""
        want = set(qualified)
        out = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call) and self.qualified(n.func) in want]
        return sorted(out, key=lambda n: (n.lineno, n.col_offset))

    def parent(self, node: ast.AST) -> ast.AST | None:
        if self._parents is None:
            self._parents = {id(c): p for p in ast.walk(self.tree) for c in ast.iter_child_nodes(p)}
        return self._parents.get(id(node))

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        p = self.parent(node)
        while p is not None and not isinstance(p, ast.FunctionDef | ast.AsyncFunctionDef):
            p = self.parent(p)
        return p

    def decorated(self, fn: ast.AST | None, *qualified: str) -> bool:
        """Whether ``fn`` carries one of the decorators ``qualified`` (``@cute.kernel``, ``@cute.kernel(...)``)."""
        if fn is None:
            return False
        for d in getattr(fn, "decorator_list", ()):
            target = d.func if isinstance(d, ast.Call) else d
            if self.qualified(target) in qualified:
                return True
        return False

    # -- edits ----------------------------------------------------------------------------------------------
    def replace(self, node: ast.AST, text: str) -> Edit:
        a, b = self.span(node)
        return Edit(a, b, text)

    def set_keyword(self, call: ast.Call, name: str, value: str) -> Edit:
        """``name=value`` in ``call``: the existing keyword's value replaced, or the keyword added after the last
        argument (or right after the opening parenthesis of a call without arguments)."""
        kw = keyword(call, name)
        if kw is not None:
            return self.replace(kw.value, value)
        opening, commas, closing = self._call_tokens(call)
        last = self._last_item_end(opening, closing)
        if last is None:
            return Edit(opening[1], opening[1], f"{name}={value}")
        return Edit(last, last, f", {name}={value}")

    def remove_keyword(self, call: ast.Call, name: str) -> list[Edit]:
        """``call`` without its keyword ``name`` and the comma that separated it (comments kept): the edits."""
        kw = keyword(call, name)
        if kw is None:
            raise NotApplicable(f"the call has no keyword {name}")
        _, commas, closing = self._call_tokens(call)
        items = sorted(self._items(call), key=lambda n: self.span(n))
        i = next(n for n, item in enumerate(items) if item is kw)
        start, _ = self.span(kw)
        # the item ends at the last token before its separating comma (or the closing parenthesis): a value in
        # parentheses ends after them, past the node's own span
        bound = commas[i][0] if i < len(commas) else closing[0]
        end = self._significant_end(start, bound)
        if i > 0:
            comma = commas[i - 1]
            if not any(t[0].startswith("#") for t in self._tokens(comma[1], start, comments=True)):
                return [Edit(comma[0], end, "")]
            # a comment between the previous comma and the keyword stays: take the keyword with its own comma
            # (its whole line when it stands alone there), or else the previous comma and the keyword apart
            if i >= len(commas):
                return [Edit(comma[0], comma[1], ""), Edit(start, end, "")]
            a, b = start, commas[i][1]
            line_start = self.text.rfind("\n", 0, a) + 1
            eol = self.text.find("\n", b)
            eol = len(self.text) if eol < 0 else eol
            if not self.text[line_start:a].strip() and not self.text[b:eol].strip():
                return [Edit(line_start, min(eol + 1, len(self.text)), "")]
            while b < len(self.text) and self.text[b] in " \t":
                b += 1
            return [Edit(a, b, "")]
        if i < len(commas):
            k = commas[i][1]
            while k < len(self.text) and self.text[k] in " \t":
                k += 1
            return [Edit(start, k, "")]
        return [Edit(start, end, "")]

    def apply(self, edits: Iterable[Edit], reason: str = "nothing to rewrite") -> str:
        """The text with ``edits`` spliced in (from the last to the first); no edit is NotApplicable(reason)."""
        edits = sorted(edits, key=lambda e: (e.start, e.end))
        if not edits:
            raise NotApplicable(reason)
        for a, b in zip(edits, edits[1:], strict=False):
            if b.start < a.end or (a.start == a.end == b.start == b.end):
                raise ValueError(f"overlapping edits at [{a.start}, {a.end}) and [{b.start}, {b.end})")
        text = self.text
        for e in reversed(edits):
            if e.end > len(text):
                raise ValueError(f"an edit ends at {e.end}, past the text's {len(text)} characters")
            text = text[:e.start] + e.text + text[e.end:]
        return text

    # -- helpers --------------------------------------------------------------------------------------------
    @staticmethod
    def _items(call: ast.Call) -> list[ast.AST]:
        return [*call.args, *call.keywords]

    def _tokens(self, start: int, end: int, comments: bool = False) -> list[tuple[str, int, int]]:
        """(string, start, end) of the significant tokens of ``text[start:end]`` (no line ends; comments only
        when asked)."""
        seg = self.text[start:end]
        # a segment inside brackets tokenizes alone once wrapped in a pair of them (its line ends are then no
        # statement ends); the closing one on a line of its own, past a comment that ends the segment
        wrapped = "(" + seg + "\n)"
        line_starts = [0] + [m.end() for m in _NEWLINE.finditer(wrapped)]
        out = []
        for tok in tokenize.generate_tokens(io.StringIO(wrapped).readline):
            if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT):
                continue
            a = line_starts[tok.start[0] - 1] + tok.start[1] - 1
            b = line_starts[tok.end[0] - 1] + tok.end[1] - 1
            if 0 <= a and b <= len(seg) and (comments or tok.type != tokenize.COMMENT):
                out.append((tok.string, start + a, start + b))
        return out

    def _call_tokens(self, call: ast.Call):
        """The call's opening and closing parenthesis and its top-level commas, each as (start, end)."""
        a, b = self.span(call)
        _, func_end = self.span(call.func)
        toks = self._tokens(func_end, b)
        depth, opening, commas, closing = 0, None, [], None
        for s, x, y in toks:
            if s in "([{":
                depth += 1
                if depth == 1 and opening is None and s == "(":
                    opening = (x, y)
            elif s in ")]}":
                if depth == 1 and s == ")":
                    closing = (x, y)
                depth -= 1
            elif s == "," and depth == 1:
                commas.append((x, y))
        if opening is None or closing is None:
            raise ValueError("the call's parentheses were not found")
        return opening, commas, closing

    def _significant_end(self, start: int, bound: int) -> int:
        toks = self._tokens(start, bound)
        return toks[-1][2] if toks else start

    def _last_item_end(self, opening: tuple[int, int], closing: tuple[int, int]) -> int | None:
        """Where the call's last item ends (past its own parentheses, before a trailing comma); None: no items."""
        toks = self._tokens(opening[1], closing[0])
        while toks and toks[-1][0] == ",":
            toks.pop()
        return toks[-1][2] if toks else None


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> qualified module or object, from the file's top-level and nested imports."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    head = a.name.split(".")[0]
                    out.setdefault(head, head)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def edit_until_done(text: str, find: Callable[[Source], list[Edit]], reason: str, rounds: int = 32) -> str:
    """Re-parse and splice ``find``'s edits until it finds none; edits overlapping an earlier (outer) one wait
    for the next round. ``find`` must stop matching what it edited (an ``exp`` made ``exp2``), else this stops
    after ``rounds`` with an error rather than editing forever."""
    first = True
    for _ in range(rounds):
        src = Source(text)
        edits, last_end = [], -1
        for e in sorted(find(src), key=lambda e: (e.start, -e.end)):
            if e.start >= last_end:
                edits.append(e)
                last_end = max(last_end, e.end)
        if not edits:
            if first:
                raise NotApplicable(reason)
            return text
        text = src.apply(edits, reason)
        first = False
    raise ValueError(f"still finding edits after {rounds} rounds")


__all__ = ["NOT_LITERAL", "Edit", "Source", "dotted", "edit_until_done", "keyword", "literal"]
