"""The CuTe DSL source rewrites (mosaic_target_cute.rewrites) on real kernel files, lowered on the CPU: each file
and its rewrite are captured with `mosaic capture --file --lower-only` (cute.compile for sm_90a: PTX, cubin,
SASS), both lifted, and the rewrite's diff row moves as the table says -- on the PTX and on the SASS. The files:
examples/kernels/cute/rmsnorm.py and two of tests/data (a softmax row kernel using cute.math.exp, a row kernel
copying through universal copy atoms). The edits themselves are AST splices: every other line is unchanged."""

import difflib
import subprocess
import sys
from pathlib import Path

import pytest
from mosaic.rewrites import NotApplicable, apply_rewrite, rewrites_for
from mosaic_target_cute.rewrites import REWRITES

ROOT = Path(__file__).resolve().parents[3]
RMSNORM = ROOT / "examples" / "kernels" / "cute" / "rmsnorm.py"
DATA = Path(__file__).resolve().parent / "data"
SOFTMAX = DATA / "softmax_rows.py"
SCALE = DATA / "scale_rows.py"
RW = {r.rewrite: r for r in REWRITES}


def rewrite(name: str, text: str) -> str:
    return apply_rewrite(RW[name], text).text


def changed_lines(a: str, b: str) -> int:
    return sum(1 for ln in difflib.ndiff(a.splitlines(), b.splitlines()) if ln.startswith("- "))


# -- the table and the edits (no DSL needed) -------------------------------------------------------------------
def test_the_table_is_registered_and_selected_by_row():
    from mosaic.plugins import PluginHost

    host = PluginHost(allow="cute").load()
    names = set(host.items("rewrites"))
    assert {f"{r.rewrite}@cute" for r in REWRITES} <= names
    from mosaic.catalog import CONCEPTS

    concepts = {c.name for c in CONCEPTS}
    assert all(r.concept in concepts and r.language == "cute" for r in REWRITES)

    class Row:
        key, reference, candidate = "exp.form", ["approx"], ["precise"]

    assert [r.rewrite for r in rewrites_for(Row, "cute", REWRITES)] == ["exp-fastmath", "exp-to-exp2"]
    Row.reference, Row.candidate = ["precise"], ["approx"]
    assert [r.rewrite for r in rewrites_for(Row, "cute", REWRITES)] == ["exp-precise"]


def test_the_edits_splice_only_their_nodes():
    text = SOFTMAX.read_text()
    fast = rewrite("exp-fastmath", text)
    assert fast.count("fastmath=True") == 2 and changed_lines(text, fast) == 2
    assert "# the row's sum of exponentials" in fast
    assert rewrite("exp-precise", fast) == text
    folded = rewrite("exp-to-exp2", text)
    assert "cute.math.exp2((x[row, j].to(cutlass.Float32) - m) * 1.4426950408889634)" in folded
    assert rewrite("exp-precise", folded) == text
    rcp = rewrite("div-rcp-approx", text)
    assert "(cute.math.exp(x[row, j].to(cutlass.Float32) - m) * cute.arch.rcp_approx(s))" in rcp
    assert rewrite("div-ieee", rcp) == text
    assert "threads // 32" in rcp  # floor divisions are integer math: untouched
    twice = rewrite("unroll-double", rewrite("unroll-double", text))
    assert twice.count("cutlass.range(tidx, cols, threads, unroll=4)") == 3
    assert "cutlass.range_constexpr(5)" in twice  # already unrolled at trace time
    assert rewrite("unroll-halve", rewrite("unroll-halve", twice)) == text
    wide = rewrite("copy-width-double", SCALE.read_text())
    assert wide.count("num_bits_per_copy=128") == 2
    assert rewrite("copy-width-halve", wide) == SCALE.read_text()
    with pytest.raises(NotApplicable):
        rewrite("copy-width-double", wide)  # 256 bits is no universal copy
    with pytest.raises(NotApplicable):
        rewrite("exp-fastmath", RMSNORM.read_text())  # rmsnorm has no exp
    with pytest.raises(NotApplicable):
        rewrite("unroll-halve", text)


# -- lowered on the CPU, lifted ------------------------------------------------------------------------------
def capture(text: str, name: str, family: str, tmp: Path):
    pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl (Python >= 3.12): run in .venv312")
    from mosaic.lift.inputs import lift_path

    path = tmp / name
    path.write_text(text)
    out = tmp / f"{path.stem}.bundle"
    p = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "capture", "--file", str(path),
                        "--lang", "cute", "--family", family, "--shape", "64x1024", "--dtype", "bf16", "--lower-only",
                        "-o", str(out), "--force"], capture_output=True, text=True, cwd=tmp, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    return {"sass": lift_path(out), "ptx": lift_path(out / "kernel.ptx")}


def row(fps, key):
    """{dialect: value} of a kernel-wide row, or of the main role's (loop.unroll)."""
    out = {}
    for dialect, fp in fps.items():
        assert fp.dialect == dialect
        f = fp.get(key) or next(x for x in fp.features if x.key == key)
        out[dialect] = f.value
    return out


def both(value):
    return {"sass": value, "ptx": value}


@pytest.fixture(scope="module")
def softmax(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("softmax")
    return capture(SOFTMAX.read_text(), "softmax_rows.py", "softmax", tmp), tmp


def test_exp_rewrites_move_exp_form(softmax):
    base, tmp = softmax
    assert row(base, "exp.form") == both(["precise"])
    text = SOFTMAX.read_text()
    for name in ("exp-fastmath", "exp-to-exp2"):
        fps = capture(rewrite(name, text), f"{name.replace('-', '_')}.py", "softmax", tmp)
        assert row(fps, "exp.form") == both(["approx"]), name
        back = capture(rewrite("exp-precise", rewrite(name, text)), f"back_{name.replace('-', '_')}.py", "softmax", tmp)
        assert row(back, "exp.form") == both(["precise"]), name


def test_unroll_rewrites_move_loop_unroll(softmax):
    base, tmp = softmax
    assert row(base, "loop.unroll") == both(1)
    two = rewrite("unroll-double", SOFTMAX.read_text())
    assert row(capture(two, "u2.py", "softmax", tmp), "loop.unroll") == both(2)
    four = rewrite("unroll-double", two)
    assert row(capture(four, "u4.py", "softmax", tmp), "loop.unroll") == both(4)
    assert row(capture(rewrite("unroll-halve", four), "h2.py", "softmax", tmp), "loop.unroll") == both(2)


def test_division_rewrites_move_div_form(softmax):
    base, tmp = softmax
    assert row(base, "div.form") == both(["ieee"])  # the row's exponentials / their sum
    rcp = rewrite("div-rcp-approx", SOFTMAX.read_text())
    assert row(capture(rcp, "rcp.py", "softmax", tmp), "div.form") == both(["approx"])
    assert row(capture(rewrite("div-ieee", rcp), "ieee.py", "softmax", tmp), "div.form") == both(["ieee"])


def test_rsqrt_removes_the_ieee_division(tmp_path):
    """rmsnorm's reciprocal square root spelled as a division (the fixture: examples' rmsnorm.py with
    ``cute.math.rsqrt(E)`` written ``1.0 / cute.math.sqrt(E)``), rewritten back to the shipped file."""
    text = RMSNORM.read_text()
    # the mean's division by the (static) column count folds into a multiply: no division is left
    assert row(capture(text, "rmsnorm.py", "rmsnorm", tmp_path), "div.form") == both([])
    sqrt = text.replace("cute.math.rsqrt(", "1.0 / cute.math.sqrt(")
    assert row(capture(sqrt, "sqrt.py", "rmsnorm", tmp_path), "div.form") == both(["ieee"])
    assert rewrite("rsqrt", sqrt) == text


def test_copy_width_rewrites_move_the_global_access_width(tmp_path):
    text = SCALE.read_text()
    base = capture(text, "scale.py", "softmax", tmp_path)
    assert row(base, "access.global.load_width") == both([64])
    wide = capture(rewrite("copy-width-double", text), "wide.py", "softmax", tmp_path)
    assert row(wide, "access.global.load_width") == both([128])
    assert row(wide, "access.global.store_width") == both([128])
    narrow = capture(rewrite("copy-width-halve", text), "narrow.py", "softmax", tmp_path)
    assert row(narrow, "access.global.load_width") == both([32])
