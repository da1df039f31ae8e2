"""Mechanical source rewrites of CuTe DSL kernel files (``register_rewrites``): one catalog concept each.

Every rewrite edits the file through :mod:`ast` (:mod:`mosaic.python_edit`): it finds the calls by their
qualified names through the file's imports (``cute.math.exp`` after ``import cutlass.cute as cute`` is
``cutlass.cute.math.exp``), splices new text at their exact spans and spells new names the file's way; a file
with nothing to edit is :class:`~mosaic.rewrites.NotApplicable`. Lowered on the CPU
(``tests/test_rewrites.py``), each moves its row on the PTX and the SASS, as listed in docs/cute.md.

Not offered, because no edit of the file's own idiom does it mechanically: ``cp.async`` <-> universal copy
(a ``cpasync.CopyG2SOp`` atom needs a shared-memory destination and the file's commit/wait groups; turning a
register copy into one rewrites the data path), an ``fma`` contraction switch (the DSL contracts as LLVM does;
no per-expression spelling) and ``unroll_full`` (a loop over a dynamic bound cannot be fully unrolled).
"""

from __future__ import annotations

import ast

from mosaic.python_edit import NOT_LITERAL, Edit, Source, edit_until_done, keyword, literal
from mosaic.records import Rewrite
from mosaic.rewrites import NotApplicable

LANGUAGE = "cute"
LOG2E = "1.4426950408889634"

CUTE = "cutlass.cute"
EXP = (f"{CUTE}.math.exp", f"{CUTE}.exp")
SQRT = (f"{CUTE}.math.sqrt", f"{CUTE}.sqrt")
RCP = f"{CUTE}.arch.rcp_approx"
RANGE = "cutlass.range"
COPY_ATOM = f"{CUTE}.make_copy_atom"
UNIVERSAL = f"{CUTE}.nvgpu.CopyUniversalOp"
KERNEL_DECORATORS = (f"{CUTE}.kernel", f"{CUTE}.jit")
COPY_BITS = (32, 64, 128)  # a universal copy atom's vector width: one to four 32-bit registers


def _spell(src: Source, qualified: str) -> str:
    name = src.spell(qualified)
    if name is None:
        raise NotApplicable(f"the file does not import {qualified.rsplit('.', 1)[0]}")
    return name


def _fastmath(call: ast.Call):
    """The fastmath value of a cute.math call (a keyword or the second positional argument)."""
    kw = keyword(call, "fastmath")
    if kw is not None:
        return literal(kw.value)
    return literal(call.args[1]) if len(call.args) > 1 else False


# -- approximate-exp ---------------------------------------------------------------------------------------------
def exp_fastmath(text: str) -> str:
    """``cute.math.exp(x)`` -> ``cute.math.exp(x, fastmath=True)``: ex2.approx instead of the accurate expf."""
    src = Source(text)
    edits = []
    for call in src.calls(*EXP):
        if _fastmath(call) is True or len(call.args) != 1:
            continue
        edits.append(src.set_keyword(call, "fastmath", "True"))
    return src.apply(edits, "no cute.math.exp without fastmath=True")


def exp_precise(text: str) -> str:
    """``cute.math.exp(x, fastmath=True)`` -> ``cute.math.exp(x)``; the exp2-with-log2(e) fold
    ``cute.math.exp2(x * 1.4426950408889634)`` back to ``cute.math.exp(x)``: the accurate expf."""

    def find(src: Source) -> list[Edit]:
        edits = []
        for call in src.calls(*EXP):
            if keyword(call, "fastmath") is not None and _fastmath(call) is True:
                edits.extend(src.remove_keyword(call, "fastmath"))
        for call in src.calls(*(f"{q}2" for q in EXP)):
            arg = call.args[0] if len(call.args) == 1 and not call.keywords else None
            if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mult):
                for x, k in ((arg.left, arg.right), (arg.right, arg.left)):
                    if literal(k) == float(LOG2E):
                        exp = _spell(src, src.qualified(call.func)[:-1])
                        edits.append(src.replace(call, f"{exp}({src.segment(x)})"))
                        break
        return edits

    return edit_until_done(text, find, "no cute.math.exp(..., fastmath=True) and no exp2 of x * log2(e)")


def exp_to_exp2(text: str) -> str:
    """``cute.math.exp(E)`` -> ``cute.math.exp2(E * 1.4426950408889634)`` (the log2(e) fold): ex2.approx."""

    def find(src: Source) -> list[Edit]:
        edits = []
        for call in src.calls(*EXP):
            if not call.args:
                continue
            exp2 = _spell(src, src.qualified(call.func) + "2")
            rest = "".join(f", {src.segment(n)}" for n in (*call.args[1:], *call.keywords))
            edits.append(src.replace(call, f"{exp2}({src.operand(call.args[0])} * {LOG2E}{rest})"))
        return edits

    return edit_until_done(text, find, "no cute.math.exp to fold into exp2")


# -- approximate-reciprocal ----------------------------------------------------------------------------------------
def _one(node: ast.AST) -> bool:
    v = literal(node)
    return v is not NOT_LITERAL and not isinstance(v, bool) and isinstance(v, int | float) and v == 1


def rsqrt(text: str) -> str:
    """``1 / cute.math.sqrt(E)`` -> ``cute.math.rsqrt(E)``: rsqrt.approx, no IEEE division."""

    def find(src: Source) -> list[Edit]:
        edits = []
        for node in ast.walk(src.tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _one(node.left) and \
                    isinstance(node.right, ast.Call) and src.qualified(node.right.func) in SQRT:
                call = node.right
                name = _spell(src, src.qualified(call.func)[:-4] + "rsqrt")
                edits.append(src.replace(node, f"{name}({src.segment(call.args[0])})"))
        return edits

    return edit_until_done(text, find, "no 1 / cute.math.sqrt(...)")


def _kernel_divisions(src: Source) -> list[ast.BinOp]:
    return [n for n in ast.walk(src.tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
            and src.decorated(src.enclosing_function(n), f"{CUTE}.kernel")
            and literal(n.right) is NOT_LITERAL]  # x / 2.0 is a multiply after constant folding, no division


def div_rcp_approx(text: str) -> str:
    """``a / b`` in a ``@cute.kernel`` -> ``a * cute.arch.rcp_approx(b)`` (``1 / b`` -> ``rcp_approx(b)``): the
    reciprocal through rcp.approx.ftz instead of the IEEE division. A division by a literal is left alone."""

    def find(src: Source) -> list[Edit]:
        rcp = _spell(src, RCP)
        edits = []
        for node in _kernel_divisions(src):
            if _one(node.left):
                edits.append(src.replace(node, f"{rcp}({src.segment(node.right)})"))
            else:
                edits.append(src.replace(node, f"{src.operand(node.left)} * {rcp}({src.segment(node.right)})"))
        return edits

    return edit_until_done(text, find, "no division in a @cute.kernel")


def div_ieee(text: str) -> str:
    """``a * cute.arch.rcp_approx(b)`` -> ``a / b`` and ``cute.arch.rcp_approx(b)`` -> ``(1.0 / b)``: the IEEE
    division back."""

    def find(src: Source) -> list[Edit]:
        edits, done = [], set()
        for node in ast.walk(src.tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.right, ast.Call) \
                    and src.qualified(node.right.func) == RCP and len(node.right.args) == 1:
                edits.append(src.replace(node, f"{src.segment(node.left)} / {src.operand(node.right.args[0])}"))
                done.add(id(node.right))
        for call in src.calls(RCP):
            if id(call) not in done and len(call.args) == 1:
                edits.append(src.replace(call, f"(1.0 / {src.operand(call.args[0])})"))
        return edits

    return edit_until_done(text, find, "no cute.arch.rcp_approx")


# -- the unroll of the file's dynamic loops (cta-tile: control:k-loop-unroll) --------------------------------------
def _unroll(call: ast.Call):
    kw = keyword(call, "unroll")
    return 0 if kw is None else literal(kw.value)


def unroll_double(text: str) -> str:
    """Every ``cutlass.range(...)`` loop unrolled twice as far: no ``unroll`` (or 0, 1) -> ``unroll=2``, N -> 2N."""
    src = Source(text)
    edits = []
    for call in src.calls(RANGE):
        n = _unroll(call)
        if keyword(call, "unroll_full") is not None or not isinstance(n, int) or isinstance(n, bool):
            continue
        edits.append(src.set_keyword(call, "unroll", str(max(1, n) * 2)))
    return src.apply(edits, "no cutlass.range loop with a literal unroll")


def unroll_halve(text: str) -> str:
    """Every ``cutlass.range(..., unroll=N)`` with N >= 2 -> N // 2 (``unroll=2`` -> no unroll keyword)."""
    src = Source(text)
    edits = []
    for call in src.calls(RANGE):
        n = _unroll(call)
        if not isinstance(n, int) or isinstance(n, bool) or n < 2:
            continue
        edits.extend(src.remove_keyword(call, "unroll") if n // 2 == 1 else
                     [src.set_keyword(call, "unroll", str(n // 2))])
    return src.apply(edits, "no cutlass.range loop unrolled 2 or more")


# -- plain-global-load: the vector width of the file's universal copy atoms ---------------------------------------
def _copy_atoms(src: Source):
    for call in src.calls(COPY_ATOM):
        op = call.args[0] if call.args else None
        kw = keyword(call, "num_bits_per_copy")
        if isinstance(op, ast.Call) and src.qualified(op.func) == UNIVERSAL and kw is not None:
            bits = literal(kw.value)
            if bits in COPY_BITS:
                yield call, bits


def _copy_width(factor: float, text: str) -> str:
    src = Source(text)
    edits = []
    for call, bits in _copy_atoms(src):
        new = int(bits * factor)
        if new in COPY_BITS:
            edits.append(src.set_keyword(call, "num_bits_per_copy", str(new)))
    return src.apply(edits, f"no universal copy atom whose num_bits_per_copy can be {'doubled' if factor > 1 else 'halved'}"
                            f" within {COPY_BITS[0]}..{COPY_BITS[-1]}")


def copy_width_double(text: str) -> str:
    """``cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), T, num_bits_per_copy=N)`` -> 2N (at most 128)."""
    return _copy_width(2, text)


def copy_width_halve(text: str) -> str:
    """``num_bits_per_copy=N`` of a universal copy atom -> N / 2 (at least 32)."""
    return _copy_width(0.5, text)


def _r(rewrite, concept, rows, side, forms, apply, summary) -> Rewrite:
    return Rewrite(rewrite=rewrite, language=LANGUAGE, concept=concept, rows=rows, side=side, forms=forms,
                   apply=apply, summary=summary)


WIDTH_ROWS = ("access.global.load_width", "access.global.store_width")

#: the table: rewrite, concept, diff rows, side, the row's form tokens, the edit
REWRITES: tuple[Rewrite, ...] = (
    _r("exp-fastmath", "approximate-exp", ("exp.form",), "gain", ("approx",), exp_fastmath,
       "cute.math.exp(x) -> cute.math.exp(x, fastmath=True): ex2.approx instead of the accurate expf"),
    _r("exp-to-exp2", "approximate-exp", ("exp.form",), "gain", ("approx",), exp_to_exp2,
       "cute.math.exp(E) -> cute.math.exp2(E * log2(e)): ex2.approx of the folded argument"),
    _r("exp-precise", "approximate-exp", ("exp.form",), "lose", ("approx",), exp_precise,
       "cute.math.exp(x, fastmath=True) and exp2(x * log2(e)) -> cute.math.exp(x): the accurate expf"),
    _r("rsqrt", "approximate-reciprocal", ("div.form",), "lose", ("ieee",), rsqrt,
       "1 / cute.math.sqrt(E) -> cute.math.rsqrt(E): no IEEE division"),
    _r("div-rcp-approx", "approximate-reciprocal", ("div.form",), "gain", ("approx",), div_rcp_approx,
       "a / b in a @cute.kernel -> a * cute.arch.rcp_approx(b): rcp.approx instead of div.rn"),
    _r("div-ieee", "approximate-reciprocal", ("div.form",), "lose", ("approx",), div_ieee,
       "a * cute.arch.rcp_approx(b) -> a / b: the IEEE division back"),
    _r("unroll-double", "cta-tile", ("loop.unroll",), "gain", (), unroll_double,
       "cutlass.range(...) loops: unroll N -> 2N (none -> 2)"),
    _r("unroll-halve", "cta-tile", ("loop.unroll",), "lose", (), unroll_halve,
       "cutlass.range(..., unroll=N) loops: N -> N / 2"),
    _r("copy-width-double", "plain-global-load", WIDTH_ROWS, "gain", (), copy_width_double,
       "a universal copy atom's num_bits_per_copy N -> 2N (32..128): wider global loads and stores"),
    _r("copy-width-halve", "plain-global-load", WIDTH_ROWS, "lose", (), copy_width_halve,
       "a universal copy atom's num_bits_per_copy N -> N / 2 (32..128): narrower global loads and stores"),
)

__all__ = ["REWRITES"]
