"""The cutlass plugin's mechanical C++ rewrites of .cu kernel files (mosaic_target_cutlass.rewrites).

Each rewrite is applied to a real kernel file (examples/kernels/cuda, or tests/data: a row softmax with expf
and a float reciprocal, an RMSNorm with 1.0f / sqrtf), the result is built by the plugin's own nvcc build
(build_file: what CudaFileBackend.lower runs) and lifted, and the row the rewrite targets must read
differently from the original build's (exp.form ["precise"] -> ["approx"] ...). Without nvcc those tests
skip; the edits themselves (comments, strings and preprocessor lines untouched, integer division never
rewritten, NotApplicable where there is nothing to edit, the nvcc-flags whitelist) are checked everywhere."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from mosaic.catalog import CONCEPT_NAMES
from mosaic.errors import BadInput
from mosaic.kernel_files import cxx_nvcc_flags, read_kernel_file
from mosaic.lift.rules import BY_KEY
from mosaic.rewrites import NotApplicable, apply_rewrite, registered, rewrites_for
from mosaic.toolchain.nvcc import find_nvcc
from mosaic_target_cutlass.rewrites import NOT_OFFERED, REWRITES, hot_loop, mask

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "kernels" / "cuda"
DATA = Path(__file__).resolve().parent / "data"
SOFTMAX, RMS_SQRT = DATA / "softmax.cu", DATA / "rmsnorm_sqrt.cu"
RMSNORM, GEMM = EXAMPLES / "rmsnorm.cu", EXAMPLES / "gemm.cu"
FAMILY = {SOFTMAX: "softmax", RMS_SQRT: "rmsnorm", RMSNORM: "rmsnorm", GEMM: "gemm"}
BY_NAME = {rw.rewrite: rw for rw in REWRITES}
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not on PATH (the build and lift checks need it)")


def rw(name: str, text: str, row=None) -> str:
    return apply_rewrite(BY_NAME[name], text, row).text


def row(key, reference, candidate):
    return SimpleNamespace(key=key, reference=reference, candidate=candidate, where="loop L0 (depth 1)")


# -- the table ------------------------------------------------------------------------------------------


def test_the_rules_are_registered_by_the_plugin_with_catalog_concepts_and_lifted_rows():
    installed = registered()
    for r in REWRITES:
        assert installed[r.name] is r or installed[r.name] == r
        assert r.language == "cutlass" and r.concept in CONCEPT_NAMES
        assert all(key in BY_KEY for key in r.rows), r.rows  # rows the lifter reads and the diff ranks
    assert {r.rewrite for r in REWRITES} >= {"exp-approx", "exp-precise", "exp2-fold", "rsqrt-approx", "div-approx",
                                             "fast-math", "fmad-off", "fmad-on", "unroll-more", "unroll-less"}
    targeted = {key for r in REWRITES for key in r.rows}
    assert not targeted & set(NOT_OFFERED)  # what the listing and the docs say is not offered really is not


def test_rewrites_for_picks_the_rewrites_that_move_a_form_row_the_reference_way():
    exp = row("exp.form", ["approx"], ["precise"])
    assert {r.rewrite for r in rewrites_for(exp, "cutlass", REWRITES)} == {"exp-approx", "exp2-fold", "fast-math"}
    back = row("exp.form", ["precise"], ["approx"])
    assert {r.rewrite for r in rewrites_for(back, "cutlass", REWRITES)} == {"exp-precise", "fast-math-off"}
    div = row("div.form", [], ["ieee"])  # the reference has no IEEE divide: only removing it helps
    assert {r.rewrite for r in rewrites_for(div, "cutlass", REWRITES)} == {"rsqrt-approx"}
    # a numeric row: raised toward a larger reference value, lowered toward a smaller one
    assert {r.rewrite for r in rewrites_for(row("loop.unroll", 8, 4), "cutlass", REWRITES)} == {"unroll-more"}
    assert {r.rewrite for r in rewrites_for(row("loop.unroll", 1, 4), "cutlass", REWRITES)} == {"unroll-less"}
    # a categorical row: not the rewrite producing what the candidate already has
    assert {r.rewrite for r in rewrites_for(row("fma.contraction", "unfused", "fused"), "cutlass", REWRITES)} == \
        {"fmad-off"}
    assert rewrites_for(exp, "pallas", REWRITES) == []


# -- edits: code only ------------------------------------------------------------------------------------

SNIPPET = """// expf(a) in a comment
/* expf(b) and 1.0f / sqrtf(q) in a block comment */
#define E(x) expf(x)
#include <math.h>
const char* s = "expf(c) 1.0f / sqrtf(q)";
__device__ float f(float d, float e, float g) {
  return expf(d) + ::expf(e) + std::expf(g) + obj.expf(d) + p->expf(d) + cute::expf(d) + my_expf(d) + E(d);
}
"""


def test_call_rewrites_touch_code_only_on_word_boundaries():
    out = rw("exp-approx", SNIPPET)
    assert "return __expf(d) + __expf(e) + __expf(g) + obj.expf(d) + p->expf(d) + cute::expf(d) + my_expf(d) + E(d);" \
        in out
    assert out.splitlines()[:5] == SNIPPET.splitlines()[:5]  # comments, #define, #include, the string
    assert mask(SNIPPET).count("expf") == 7 and len(mask(SNIPPET)) == len(SNIPPET)
    assert rw("exp-precise", out) == SNIPPET.replace("::expf(e)", "expf(e)").replace("std::expf(g)", "expf(g)")


def test_the_shipped_test_file_keeps_its_comments_strings_and_defines(tmp_path):
    text = SOFTMAX.read_text()
    for name in ("exp-approx", "exp2-fold", "div-approx"):
        out = rw(name, text)
        for kept in ('"expf(x) / sqrtf(y)" in this comment', '#define MOSAIC_NOTE "expf(1.0f / sqrtf(2.0f))"',
                     'MOSAIC_NOTE " and expf(z)"', "// mosaic:entry softmax_row"):
            assert kept in out, (name, kept)
        assert read_kernel_file(_write(out, tmp_path / name / "softmax.cu")).entry == "softmax_row"
    assert rw("exp-approx", text).count("__expf(") == 2 and mask(text).count("expf(") == 2 < text.count("expf(")


def test_division_is_rewritten_only_where_the_file_shows_it_is_float():
    src = """__global__ void k(float* out, const int* n, int rows, double dd) {
  float x = out[0];
  float y = out[1];
  const int w = threadIdx.x / 32;
  int a = rows / 4;
  int b = n[0] / rows;
  float q = x / y;
  float h = 1.0f / y + 2 / x;
  float dq = dd / x;
  float pre = q * x / y;
  float cast = (float)rows / y;
  float neg = x / -y;
  x /= y;
  float un = mystery / x;
  out[2] = out[0] / static_cast<float>(rows);
}
"""
    out = rw("div-approx", src)
    for kept in ("threadIdx.x / 32", "rows / 4", "n[0] / rows", "dd / x", "q * x / y", "(float)rows / y", "x / -y",
                 "x /= y", "mystery / x"):
        assert kept in out, kept
    for made in ("float q = __fdividef(x, y);", "float h = __fdividef(1.0f, y) + __fdividef(2, x);",
                 "out[2] = __fdividef(out[0], static_cast<float>(rows));"):
        assert made in out, made
    with pytest.raises(NotApplicable):
        rw("div-approx", GEMM.read_text())  # its divisions are all integer (tile indices)


def test_rsqrt_and_exp2_edits():
    assert rw("rsqrt-approx", "float r = 1.0f / sqrtf(v + eps) * 2.0f;\n") == "float r = rsqrtf(v + eps) * 2.0f;\n"
    assert rw("rsqrt-approx", "float r = 1/std::sqrtf(v);\n") == "float r = rsqrtf(v);\n"
    with pytest.raises(NotApplicable):
        rw("rsqrt-approx", "float r = c * 1.0f / sqrtf(v);\nfloat t = 2.0f / sqrtf(v);\n")  # (c*1)/.., not 1/..
    assert rw("rsqrt-exact", "float r = rsqrtf(v);\n") == "float r = (1.0f / sqrtf(v));\n"
    assert rw("exp2-fold", "float e = expf(x - m);\n") == "float e = exp2f((x - m) * 1.4426950408889634f);\n"
    folded = rw("exp2-fold", "float e = expf(s * 0.5f);\n")
    assert folded == f"float e = exp2f(s * {0.5 * 1.4426950408889634!r}f);\n"
    assert rw("div-ieee", "float q = __fdividef(a + b, c);\n") == "float q = ((a + b) / (c));\n"


@pytest.mark.parametrize("name", ["exp-approx", "exp-precise", "exp2-fold", "rsqrt-approx", "rsqrt-exact",
                                  "div-approx", "div-ieee"])
def test_a_file_without_the_construct_is_not_applicable(name):
    with pytest.raises(NotApplicable, match="nothing to rewrite"):
        rw(name, "// mosaic:entry k\n__global__ void k(int* x) { x[0] = x[1] / 2; }\n")


# -- the nvcc-flags line -----------------------------------------------------------------------------------


def _write(text: str, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_flag_rewrites_edit_the_nvcc_flags_line_and_round_trip(tmp_path):
    text = RMSNORM.read_text()
    off = rw("fmad-off", text)
    assert "// mosaic:outputs y[rows,cols]\n// mosaic:nvcc-flags -fmad=false\n" in off
    assert cxx_nvcc_flags(off) == ("-fmad=false",)
    assert read_kernel_file(_write(off, tmp_path / "a" / "rmsnorm.cu")).entry == "rmsnorm"
    both = rw("fast-math", off)
    assert cxx_nvcc_flags(both) == ("-fmad=false", "-use_fast_math")
    assert rw("fmad-on", rw("fast-math-off", both)) == text  # the line goes when it is left empty
    with pytest.raises(NotApplicable):
        rw("fmad-off", off)
    with pytest.raises(NotApplicable):
        rw("fmad-on", text)  # fmad is nvcc's default: nothing to remove
    with pytest.raises(NotApplicable, match="not a kernel file"):
        rw("fast-math", "__global__ void k() {}\n")


@pytest.mark.parametrize(("flags", "match"), [
    ("-Xcompiler -rdynamic", "'-Xcompiler' is not allowed"),
    ("-fmad=true -fmad=false", "gives -fmad twice"),
    ("-fmad=maybe", "'-fmad=maybe' is not allowed"),
    ("$(touch /tmp/x)", "is not allowed"),
    ("-ccbin=/bin/sh", "is not allowed")])
def test_the_nvcc_flags_whitelist_refuses_anything_else(tmp_path, flags, match):
    text = RMSNORM.read_text().replace("// mosaic:entry", f"// mosaic:nvcc-flags {flags}\n// mosaic:entry")
    with pytest.raises(BadInput, match=match):
        read_kernel_file(_write(text, tmp_path / "rmsnorm.cu"))


def test_a_bad_flag_is_one_error_line_from_capture(tmp_path):
    text = RMSNORM.read_text().replace("// mosaic:entry", "// mosaic:nvcc-flags -O0\n// mosaic:entry")
    path = _write(text, tmp_path / "rmsnorm.cu")
    p = subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", "capture", "--file", str(path),
                        "--lang", "cutlass", "--family", "rmsnorm", "--shape", "64x256", "--dtype", "f32",
                        "--lower-only", "-o", "x.bundle"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "'-O0' is not allowed" in lines[0], lines
    assert not (tmp_path / "x.bundle").exists()


# -- unrolling -------------------------------------------------------------------------------------------


def test_unroll_sets_a_pragma_on_the_hot_loop_from_the_row_or_by_doubling():
    text = SOFTMAX.read_text()
    loop = hot_loop(text)
    line = text[:loop.start].count("\n")
    assert text.splitlines()[line].strip().startswith("for (int j") and "yr[j]" in text.splitlines()[line + 1]
    more = rw("unroll-more", text)  # no pragma: nvcc's usual 4, doubled
    assert more.splitlines()[line] == "#pragma unroll 8" and more.count("#pragma unroll") == 3
    assert rw("unroll-less", text, row("loop.unroll", 1, 4)).splitlines()[line] == "#pragma unroll 1"
    assert rw("unroll-more", text, row("loop.unroll", 2, 1)).splitlines()[line] == "#pragma unroll 2"
    assert rw("unroll-less", more).splitlines()[line] == "#pragma unroll 4"  # the pragma's own count halved
    with pytest.raises(NotApplicable):
        rw("unroll-more", more)  # 8 is the top
    with pytest.raises(NotApplicable):
        rw("unroll-more", text, row("loop.unroll", 16, 16))  # the candidate is unrolled past 8 already
    knob = text.replace("  for (int j = threadIdx.x; j < cols; j += Knobs::threads)\n    yr",
                        "#pragma unroll Knobs::threads\n  for (int j = threadIdx.x; j < cols; j += Knobs::threads)\n    yr")
    with pytest.raises(NotApplicable, match="not a literal count"):
        rw("unroll-more", knob)
    with pytest.raises(NotApplicable, match="no runtime-trip"):
        rw("unroll-more", "__global__ void k(float* x) {\n#pragma unroll\n  for (int i = 0; i < 4; ++i) x[i] = 0;\n}\n")


# -- built and lifted: the targeted row moves ---------------------------------------------------------------

CASES = [  # (file, rewrites applied first, the rewrite, row, value before, value after)
    (SOFTMAX, (), "exp-approx", "exp.form", ["precise"], ["approx"]),
    (SOFTMAX, (), "exp2-fold", "exp.form", ["precise"], ["approx"]),
    (SOFTMAX, ("exp-approx",), "exp-precise", "exp.form", ["approx"], ["precise"]),
    (SOFTMAX, (), "div-approx", "div.form", ["ieee"], ["approx"]),
    (SOFTMAX, ("div-approx",), "div-ieee", "div.form", ["approx"], ["ieee"]),
    (RMSNORM, (), "div-approx", "div.form", ["ieee"], ["approx"]),
    (RMS_SQRT, (), "rsqrt-approx", "div.form", ["ieee"], ["approx"]),
    (RMS_SQRT, ("rsqrt-approx",), "rsqrt-exact", "div.form", ["approx"], ["ieee"]),
    (SOFTMAX, (), "fast-math", "exp.form", ["precise"], ["approx"]),
    (SOFTMAX, (), "fast-math", "denormal.flush", "ieee", "ftz"),
    (SOFTMAX, ("fast-math",), "fast-math-off", "div.form", ["approx"], ["ieee"]),
    (RMSNORM, (), "fmad-off", "fma.contraction", "fused", "mixed"),
    (RMSNORM, ("fmad-off",), "fmad-on", "fma.contraction", "mixed", "fused"),
    (SOFTMAX, (), "unroll-more", "loop.unroll", 4, 8),
]


@pytest.fixture(scope="module")
def lifted(tmp_path_factory):
    """Build a source with the plugin's nvcc build (cached per text) and lift its cubin."""
    from mosaic.lift.inputs import lift_path
    from mosaic_target_cutlass.kernel_file import build_file

    root = tmp_path_factory.mktemp("rewrites")
    done: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOSAIC_CACHE_DIR", str(root / "cache"))

        def lift(source: Path, text: str):
            if text not in done:
                path = _write(text, root / f"src{len(done)}" / source.name)
                kfile = read_kernel_file(path)
                build = build_file(kfile, kfile.knob_values({}), "f32", FAMILY[source], "sm_90a")
                done[text] = lift_path(build.cubin)
            return done[text]

        yield lift


def value(fingerprint, key):
    feature = next(f for f in fingerprint.features if f.key == key)
    return json.loads(json.dumps(feature.value))


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize(("source", "first", "name", "key", "before", "after"), CASES,
                         ids=[f"{c[2]}-{c[0].stem}-{c[3]}" for c in CASES])
def test_the_rewritten_file_builds_and_the_targeted_row_moves(lifted, source, first, name, key, before, after):
    text = source.read_text()
    for earlier in first:
        text = rw(earlier, text)
    new = rw(name, text)
    assert value(lifted(source, text), key) == before
    assert value(lifted(source, new), key) == after


# -- mosaic catalog --rewrites ---------------------------------------------------------------------------


def mosaic(*args):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args], capture_output=True,
                          text=True, timeout=300)


def test_catalog_rewrites_lists_the_plugins_rewrites_by_concept_and_claims_nothing_else():
    p = mosaic("catalog", "--rewrites", "--lang", "cutlass", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["languages"] == ["cutlass"]
    listed = {r["name"]: r for r in data["rewrites"]}
    assert set(listed) == {r.name for r in REWRITES}
    assert listed["exp-approx@cutlass"] == {**BY_NAME["exp-approx"].to_json(), "plugin": "cutlass"}
    concepts = {c["name"]: c["rewrites"]["cutlass"] for c in data["concepts"]}
    assert set(concepts) == set(CONCEPT_NAMES)
    assert concepts["approximate-exp"] == ["exp-approx@cutlass", "exp-precise@cutlass", "exp2-fold@cutlass",
                                           "fast-math@cutlass", "fast-math-off@cutlass"]
    assert concepts["tma-load"] == [] and concepts["plain-global-load"] == [] and concepts["cp-async"] == []
    text = mosaic("catalog", "--rewrites", "--lang", "cutlass")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"{len(REWRITES)} rewrite(s) installed for cutlass"
    assert "approximate-reciprocal  [numerics]" in lines
    assert any(ln.split()[:3] == ["cutlass", "rsqrt-approx", "div.form"] and "(lose ieee)" in ln for ln in lines)
    none = next(ln for ln in lines if ln.startswith("no rewrite in cutlass"))
    assert "plain-global-load" in none and "cp-async" in none and "approximate-exp" not in none
    assert "pallas" not in text.stdout


def test_catalog_rewrites_refuses_an_unknown_language_in_one_line():
    p = mosaic("catalog", "--rewrites", "--lang", "fortran")
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: unknown language 'fortran'"), lines
