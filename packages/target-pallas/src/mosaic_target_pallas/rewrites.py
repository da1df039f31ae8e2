"""Mechanical source rewrites of Pallas Mosaic GPU kernel files (``register_rewrites``): one catalog concept each.

Every rewrite edits the file through :mod:`ast` (:mod:`mosaic.python_edit`): calls are found by their qualified
names through the file's imports (``plgpu.CompilerParams`` after ``from jax.experimental.pallas import
mosaic_gpu as plgpu``), new text is spliced at the nodes' exact spans and new names are spelled the file's
way; a file with nothing to edit is :class:`~mosaic.rewrites.NotApplicable`.

What jax 0.11.2 lowers each to (``jax/_src/pallas/mosaic_gpu/lowering.py``, checked on the CPU in the Mosaic
GPU module the lowering serialises, ``tests/test_rewrites.py``): ``approx_math=True`` makes ``exp`` the
inline ``ex2.approx.ftz.f32`` of ``x * log2(e)`` (also rsqrt, sqrt, log, tanh, sin, cos: their ``.approx``
forms); without it ``exp`` is ``math.exp`` (libdevice's accurate expf) and ``exp2`` ``math.exp2``;
``jax.lax.rsqrt`` is ``math.rsqrt`` where ``1 / jnp.sqrt`` is an ``arith.divf`` of ``math.sqrt``; a
``fori_loop``'s ``unroll=N`` replicates the body N times in an ``scf.for`` of length / N trips.

Not offered, because Pallas Mosaic GPU has no mechanical switch for them in a kernel file's idiom: an
approximate reciprocal (jax 0.11.2 lowers ``lax.div`` to ``arith.divf`` whatever ``approx_math`` says, and
has no approximate-reciprocal primitive for Mosaic GPU), the copy path (``emit_pipeline`` and
``copy_gmem_to_smem`` are TMA; plain loads are a different kernel structure: register layouts and no
pipeline), the vector width of a load (a layout choice of ``plgpu.load``, not one argument).
"""

from __future__ import annotations

import ast

from mosaic.python_edit import Edit, Source, edit_until_done, keyword, literal
from mosaic.records import Rewrite
from mosaic.rewrites import NotApplicable

LANGUAGE = "pallas"
LOG2E = "1.4426950408889634"

PLGPU = "jax.experimental.pallas.mosaic_gpu"
COMPILER_PARAMS = f"{PLGPU}.CompilerParams"
#: the calls that take Mosaic GPU compiler params: a kernel without them gets ``compiler_params=`` added
LAUNCHES = (f"{PLGPU}.kernel", "jax.experimental.pallas.pallas_call")
EXP = ("jax.numpy.exp", "jax.lax.exp")
SQRT = ("jax.numpy.sqrt", "jax.lax.sqrt")
FORI = ("jax.lax.fori_loop",)


def _spell(src: Source, qualified: str) -> str:
    name = src.spell(qualified)
    if name is None:
        raise NotApplicable(f"the file does not import {qualified.rsplit('.', 1)[0]}")
    return name


# -- approximate-exp -----------------------------------------------------------------------------------------------
def approx_math_on(text: str) -> str:
    """``approx_math=True`` in the file's Mosaic GPU ``CompilerParams`` (the keyword added when absent; a kernel
    launched without compiler params gets ``compiler_params=plgpu.CompilerParams(approx_math=True)``)."""
    src = Source(text)
    edits = []
    params = src.calls(COMPILER_PARAMS)
    for call in params:
        kw = keyword(call, "approx_math")
        if kw is None or literal(kw.value) is False:
            edits.append(src.set_keyword(call, "approx_math", "True"))
    inside = {id(p) for p in params}
    for call in src.calls(*LAUNCHES):
        kw = keyword(call, "compiler_params")
        if kw is None:
            edits.append(src.set_keyword(call, "compiler_params", f"{_spell(src, COMPILER_PARAMS)}(approx_math=True)"))
        elif id(kw.value) not in inside and literal(kw.value) is None:
            edits.append(src.replace(kw.value, f"{_spell(src, COMPILER_PARAMS)}(approx_math=True)"))
    return src.apply(edits, "no Mosaic GPU CompilerParams without approx_math (a literal False or none)")


def approx_math_off(text: str) -> str:
    """``approx_math=True`` removed from the file's ``CompilerParams`` (jax's default: accurate math)."""
    src = Source(text)
    edits = []
    for call in src.calls(COMPILER_PARAMS):
        kw = keyword(call, "approx_math")
        if kw is not None and literal(kw.value) is True:
            edits.extend(src.remove_keyword(call, "approx_math"))
    return src.apply(edits, "no Mosaic GPU CompilerParams with approx_math=True")


def exp_to_exp2(text: str) -> str:
    """``jnp.exp(E)`` -> ``jnp.exp2(E * 1.4426950408889634)`` (``lax.exp`` -> ``lax.exp2``): the log2(e) fold."""

    def find(src: Source) -> list[Edit]:
        edits = []
        for call in src.calls(*EXP):
            if len(call.args) != 1 or call.keywords:
                continue
            exp2 = _spell(src, src.qualified(call.func) + "2")
            edits.append(src.replace(call, f"{exp2}({src.operand(call.args[0])} * {LOG2E})"))
        return edits

    return edit_until_done(text, find, "no jnp.exp / lax.exp to fold into exp2")


# -- approximate-reciprocal ----------------------------------------------------------------------------------------
def _one(node: ast.AST) -> bool:
    v = literal(node)
    return not isinstance(v, bool) and isinstance(v, int | float) and v == 1


def rsqrt(text: str) -> str:
    """``1 / jnp.sqrt(E)`` (``1.0 /``, ``lax.sqrt``) -> ``jax.lax.rsqrt(E)``: no division."""

    def find(src: Source) -> list[Edit]:
        edits = []
        for node in ast.walk(src.tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _one(node.left) and \
                    isinstance(node.right, ast.Call) and src.qualified(node.right.func) in SQRT and \
                    len(node.right.args) == 1:
                name = _spell(src, "jax.lax.rsqrt")
                edits.append(src.replace(node, f"{name}({src.segment(node.right.args[0])})"))
        return edits

    return edit_until_done(text, find, "no 1 / jnp.sqrt(...)")


# -- the unroll of the file's fori_loops (cta-tile: control:k-loop-unroll) -----------------------------------------
def _unroll(call: ast.Call):
    kw = keyword(call, "unroll")
    if kw is None:
        return 1
    v = literal(kw.value)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def unroll_double(text: str) -> str:
    """Every ``lax.fori_loop(...)`` unrolled twice as far: no ``unroll`` (1) -> ``unroll=2``, N -> 2N (jax asks
    that N divide the trip count: a loop where it does not is the lowering's error, an unbuildable candidate)."""
    src = Source(text)
    edits = []
    for call in src.calls(*FORI):
        n = _unroll(call)
        if n is not None and n >= 1:
            edits.append(src.set_keyword(call, "unroll", str(n * 2)))
    return src.apply(edits, "no lax.fori_loop with a literal unroll")


def unroll_halve(text: str) -> str:
    """Every ``lax.fori_loop(..., unroll=N)`` with N >= 2 -> N // 2 (``unroll=2`` -> no unroll keyword)."""
    src = Source(text)
    edits = []
    for call in src.calls(*FORI):
        n = _unroll(call)
        if n is None or n < 2:
            continue
        edits.extend(src.remove_keyword(call, "unroll") if n // 2 == 1 else
                     [src.set_keyword(call, "unroll", str(n // 2))])
    return src.apply(edits, "no lax.fori_loop unrolled 2 or more")


def _r(rewrite, concept, rows, side, forms, apply, summary) -> Rewrite:
    return Rewrite(rewrite=rewrite, language=LANGUAGE, concept=concept, rows=rows, side=side, forms=forms,
                   apply=apply, summary=summary)


#: the table: rewrite, concept, diff rows, side, the row's form tokens, the edit
REWRITES: tuple[Rewrite, ...] = (
    _r("approx-math-on", "approximate-exp", ("exp.form",), "gain", ("approx",), approx_math_on,
       "approx_math=True in the Mosaic GPU CompilerParams: exp as ex2.approx (and rsqrt, log, tanh ... .approx)"),
    _r("approx-math-off", "approximate-exp", ("exp.form",), "lose", ("approx",), approx_math_off,
       "approx_math=True removed from the CompilerParams: the accurate expf"),
    _r("exp-to-exp2", "approximate-exp", ("exp.form",), "gain", ("approx",), exp_to_exp2,
       "jnp.exp(E) -> jnp.exp2(E * log2(e)): exp2 of the folded argument"),
    _r("rsqrt", "approximate-reciprocal", ("div.form",), "lose", ("ieee",), rsqrt,
       "1 / jnp.sqrt(E) -> jax.lax.rsqrt(E): no IEEE division"),
    _r("unroll-double", "cta-tile", ("loop.unroll",), "gain", (), unroll_double,
       "lax.fori_loop(...): unroll N -> 2N (none -> 2)"),
    _r("unroll-halve", "cta-tile", ("loop.unroll",), "lose", (), unroll_halve,
       "lax.fori_loop(..., unroll=N): N -> N / 2"),
)

__all__ = ["REWRITES"]
