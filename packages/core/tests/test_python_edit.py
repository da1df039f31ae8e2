"""mosaic.python_edit: nodes found through ast, their exact spans spliced; the rest of the text (comments, blank
lines, spacing) byte for byte as it was; keywords set, added and removed with their commas; qualified names
through the file's imports; NotApplicable when nothing matches; every result parses."""

import ast

import pytest
from mosaic.python_edit import Edit, Source, dotted, edit_until_done, keyword, literal
from mosaic.rewrites import NotApplicable

KERNEL = '''"""A docstring that mentions jnp.exp(x) (not code)."""
import jax
import jax.numpy as jnp  # numpy, as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu


def body(x):
    # jnp.exp(x) in a comment stays as it is
    y = jnp.exp(x - 1.0)   # the exponential
    z = "jnp.exp(q)"
    return jnp.exp(jnp.exp(y)) + z


params = plgpu.CompilerParams(
    lowering_semantics=plgpu.LoweringSemantics.Lane,  # lane semantics
    max_concurrent_steps=2,
)
'''


def exp_to_exp2(src: Source) -> list[Edit]:
    return [src.replace(c, f"jnp.exp2({src.operand(c.args[0])} * 1.4426950408889634)")
            for c in src.calls("jax.numpy.exp")]


def test_qualified_names_go_through_the_imports():
    src = Source(KERNEL)
    assert src.aliases["jnp"] == "jax.numpy" and src.aliases["plgpu"] == "jax.experimental.pallas.mosaic_gpu"
    assert [src.segment(c) for c in src.calls("jax.numpy.exp")] == \
        ["jnp.exp(x - 1.0)", "jnp.exp(jnp.exp(y))", "jnp.exp(y)"]
    assert src.spell("jax.numpy.exp2") == "jnp.exp2" and src.spell("jax.lax.rsqrt") == "jax.lax.rsqrt"
    assert src.spell("cutlass.cute.math.exp") is None
    call = src.calls("jax.experimental.pallas.mosaic_gpu.CompilerParams")[0]
    assert dotted(call.func) == "plgpu.CompilerParams" and literal(keyword(call, "max_concurrent_steps").value) == 2


def test_spans_are_spliced_exactly_and_the_rest_is_kept():
    out = edit_until_done(KERNEL, exp_to_exp2, "no jnp.exp")
    assert "    y = jnp.exp2((x - 1.0) * 1.4426950408889634)   # the exponential\n" in out
    # the nested exp: the outer call first, the inner one in the next round on the re-parsed text
    assert "return jnp.exp2(jnp.exp2(y * 1.4426950408889634) * 1.4426950408889634) + z" in out
    # comments, the docstring and the string literal that look like calls are not code: untouched
    assert '"""A docstring that mentions jnp.exp(x) (not code)."""' in out
    assert "    # jnp.exp(x) in a comment stays as it is\n" in out and 'z = "jnp.exp(q)"' in out
    ast.parse(out)
    # every line the edit did not touch is the same
    changed = [n for n, (a, b) in enumerate(zip(KERNEL.splitlines(), out.splitlines(), strict=True)) if a != b]
    assert changed == [8, 10]


def test_a_column_after_non_ascii_text_is_a_character_offset():
    text = 's = "żółw"; y = jnp.exp(x)  # ü\nimport jax.numpy as jnp\n'
    out = Source(text).apply(exp_to_exp2(Source(text)))
    assert out == 's = "żółw"; y = jnp.exp2(x * 1.4426950408889634)  # ü\nimport jax.numpy as jnp\n'


def test_keywords_are_replaced_added_and_removed_with_their_comma():
    src = Source(KERNEL)
    call = src.calls("jax.experimental.pallas.mosaic_gpu.CompilerParams")[0]
    added = src.apply([src.set_keyword(call, "approx_math", "True")])
    assert "    max_concurrent_steps=2, approx_math=True,\n)" in added and ast.parse(added)
    replaced = src.apply([src.set_keyword(call, "max_concurrent_steps", "4")])
    assert "    max_concurrent_steps=4,\n" in replaced
    removed = src.apply(src.remove_keyword(call, "max_concurrent_steps"))
    assert "    lowering_semantics=plgpu.LoweringSemantics.Lane,  # lane semantics\n)\n" in removed
    assert "max_concurrent" not in removed
    first = src.apply(src.remove_keyword(call, "lowering_semantics"))
    assert "lowering_semantics" not in first and "# lane semantics" in first and ast.parse(first)
    for text in (added, removed, first):
        ast.parse(text)
    with pytest.raises(NotApplicable):
        src.remove_keyword(call, "approx_math")


@pytest.mark.parametrize("call,out", [
    ("f()", "f(k=1)"),
    ("f(a)", "f(a, k=1)"),
    ("f(a,)", "f(a, k=1,)"),
    ("f((a + b))", "f((a + b), k=1)"),
    ("f(a, *rest, **kw)", "f(a, *rest, **kw, k=1)"),
    ("f(\n    a,  # the a\n)", "f(\n    a, k=1,  # the a\n)"),
])
def test_a_keyword_is_added_after_the_last_argument(call, out):
    src = Source(call)
    assert src.apply([src.set_keyword(src.calls("f")[0], "k", "1")]) == out


@pytest.mark.parametrize("call,out", [
    ("f(k=1)", "f()"),
    ("f(a, k=1)", "f(a)"),
    ("f(k=1, a=2)", "f(a=2)"),
    ("f(a, k=(1 + 2), b=3)", "f(a, b=3)"),
    ("f(a,  # keep me\n  k=1)", "f(a  # keep me\n  )"),
    ("f(a, k=1,)", "f(a,)"),
    ("f(\n    a=1,  # the a\n    k=2,\n    b=3,\n)", "f(\n    a=1,  # the a\n    b=3,\n)"),
    ("f(a,  # the a\n  k=2, b=3)", "f(a,  # the a\n  b=3)"),
])
def test_a_keyword_is_removed_with_its_comma(call, out):
    src = Source(call)
    got = src.apply(src.remove_keyword(src.calls("f")[0], "k"))
    assert got == out
    ast.parse(got)


def test_nothing_to_edit_is_not_applicable():
    with pytest.raises(NotApplicable, match="no jnp.exp"):
        edit_until_done("import jax.numpy as jnp\ny = jnp.exp2(x)\n", exp_to_exp2, "no jnp.exp")
    with pytest.raises(NotApplicable, match="nothing"):
        Source("x = 1\n").apply([], "nothing")


def test_overlapping_edits_are_refused():
    src = Source("y = f(g(x))\n")
    outer, inner = src.calls("f")[0], src.calls("g")[0]
    with pytest.raises(ValueError, match="overlapping"):
        src.apply([src.replace(outer, "a"), src.replace(inner, "b")])


def test_decorators_and_the_enclosing_function():
    text = "import cutlass.cute as cute\n\n@cute.kernel\ndef k(x):\n    return x / 2\n\ndef host(x):\n    return x / 2\n"
    src = Source(text)
    divs = [n for n in ast.walk(src.tree) if isinstance(n, ast.BinOp)]
    owners = [src.enclosing_function(d).name for d in divs]
    assert sorted(owners) == ["host", "k"]
    kernel_divs = [d for d in divs if src.decorated(src.enclosing_function(d), "cutlass.cute.kernel")]
    assert [src.enclosing_function(d).name for d in kernel_divs] == ["k"]
