"""Kernel-file contracts read without running the file: C++ comment lines + a frozen Knobs struct, Python
module constants + a frozen dataclass; every broken contract is one BadInput line; knob values typed;
the C++ substitution keeps the file's lines; through `mosaic capture --file` a broken file exits 2 with
one error line and no traceback, and a Python file is never executed by the parent process."""

import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from mosaic.errors import BadInput
from mosaic.kernel_files import KernelFile, read_kernel_file, substitute_cxx_knobs

CU = """// mosaic:entry scale
// mosaic:inputs x[rows,cols]
// mosaic:outputs y[rows,cols]
#include <cuda_bf16.h>
struct Knobs {  // a comment { with a brace
  static constexpr int threads = 128;  /* block size */
  static constexpr bool fast = false;
  static constexpr float alpha = 2.5f;
};
extern "C" __global__ void __launch_bounds__(Knobs::threads) scale(const MOSAIC_T* x, MOSAIC_T* y, int rows, int cols) {}
void mosaic_geometry(const int* dims, unsigned grid[3], unsigned block[3], unsigned* smem) {}
"""

PY = '''import dataclasses

ENTRY = "softmax_kernel"
INPUTS = {"x": ("rows", "cols")}
OUTPUTS = {"y": ("rows", "cols")}


@dataclasses.dataclass(frozen=True)
class Knobs:
    block_rows: int = 4
    use_exp2: bool = True
    label: str = "a"


def softmax_kernel(x, y, knobs):
    raise RuntimeError("never called in these tests")
'''


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_cxx_contract(tmp_path):
    kf = read_kernel_file(write(tmp_path, "scale.cu", CU))
    assert (kf.syntax, kf.entry, kf.knob_class) == ("c++", "scale", "Knobs")
    assert [o.text() for o in kf.inputs] == ["x[rows,cols]"] and [o.text() for o in kf.outputs] == ["y[rows,cols]"]
    assert [(k.name, k.type, k.default) for k in kf.knobs] == [("threads", "int", 128), ("fast", "bool", False),
                                                               ("alpha", "float", 2.5)]
    assert kf.knob_values({"threads": "256", "fast": "true"}) == {"threads": 256, "fast": True, "alpha": 2.5}
    text = substitute_cxx_knobs(kf, kf.knob_values({"threads": "0x100", "alpha": "0.5"}))
    assert "static constexpr int threads = 256;" in text and "static constexpr float alpha = 0.5;" in text
    assert "static constexpr bool fast = false;" in text and text.count("\n") == CU.count("\n")
    assert "/* block size */" in text and "// a comment { with a brace" in text
    back = KernelFile.from_json(kf.to_json(with_source=True))
    assert back == kf and len(kf.sha256) == 64
    kf.check_family(("rows", "cols"))
    with pytest.raises(BadInput, match="dimension"):
        kf.check_family(("m", "n", "k"))


def test_python_contract(tmp_path):
    kf = read_kernel_file(write(tmp_path, "softmax.py", PY))
    assert (kf.syntax, kf.entry, kf.knob_class) == ("python", "softmax_kernel", "Knobs")
    assert [(k.name, k.type, k.default) for k in kf.knobs] == [("block_rows", "int", 4), ("use_exp2", "bool", True),
                                                               ("label", "str", "a")]
    assert kf.knob_values({"block_rows": "8", "label": "b"}) == {"block_rows": 8, "use_exp2": True, "label": "b"}
    attrs_style = PY.replace("@dataclasses.dataclass(frozen=True)", "@attrs.frozen").replace(
        "import dataclasses", "import attrs")
    assert read_kernel_file(write(tmp_path, "a.py", attrs_style)).knob_class == "Knobs"


BROKEN = [
    ("noentry.cu", CU.replace("// mosaic:entry scale", ""), "no '// mosaic:entry"),
    ("wrongentry.cu", CU.replace("mosaic:entry scale", "mosaic:entry scale2"), "not defined as a __global__"),
    ("notfrozen.cu", CU.replace("static constexpr bool fast", "bool fast"), "not frozen: line 7"),
    ("noknobs.cu", CU.replace("struct Knobs", "struct Other"), "no 'struct Knobs"),
    ("badlit.cu", CU.replace("= 128", "= 64 * 2"), "not a int literal"),
    ("badop.cu", CU.replace("x[rows,cols]", "x(rows)"), "not name[dim"),
    ("unknownline.cu", CU.replace("mosaic:outputs", "mosaic:output"), "unknown contract line"),
    ("dup.cu", CU.replace("y[rows,cols]", "x[rows,cols]"), "more than once"),
    ("syntax.py", PY.replace("def softmax_kernel(x, y, knobs):", "def softmax_kernel(x, y, knobs)"),
     "syntax error at line 15"),
    ("noentry.py", PY.replace("def softmax_kernel", "def other"), "entry point 'softmax_kernel' is not defined"),
    ("mutable.py", PY.replace("(frozen=True)", ""), "not frozen"),
    ("mutable2.py", PY.replace("frozen=True", "frozen=False"), "not frozen"),
    ("nodefault.py", PY.replace("block_rows: int = 4", "block_rows: int"), "has no default"),
    ("badtype.py", PY.replace("label: str", "label: list"), "annotated 'list'"),
    ("computed.py", PY.replace('ENTRY = "softmax_kernel"', 'ENTRY = "softmax" + "_kernel"'), "must be a literal"),
    ("noinputs.py", PY.replace('INPUTS = {"x": ("rows", "cols")}', ""), "no module-level INPUTS"),
    ("kernel.txt", CU, "suffix '.txt' unknown"),
]


@pytest.mark.parametrize("name, text, message", BROKEN, ids=[case[0] for case in BROKEN])
def test_broken_contracts_are_one_line(tmp_path, name, text, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace("[", r"\[")) as err:
        read_kernel_file(write(tmp_path, name, text))
    assert "\n" not in err.value.line() and name in err.value.line()


def test_unknown_and_mistyped_knobs(tmp_path):
    kf = read_kernel_file(write(tmp_path, "scale.cu", CU))
    with pytest.raises(BadInput, match="unknown knob.*thread.*known: threads, fast, alpha"):
        kf.knob_values({"thread": "1"})
    for knob, value in (("threads", "many"), ("fast", "yes"), ("alpha", "x"), ("alpha", "inf"), ("alpha", "nan")):
        with pytest.raises(BadInput, match=f"knob '{knob}'"):
            kf.knob_values({knob: value})


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


def test_cli_broken_files_exit_2_with_one_line(tmp_path):
    write(tmp_path, "syntax.py", PY.replace("def softmax_kernel(x, y, knobs):", "def softmax_kernel(x, y, knobs)"))
    write(tmp_path, "scale.cu", CU)
    cases = [(["--file", "syntax.py", "--lang", "cute", "--family", "softmax", "--shape", "8x128"], "syntax error"),
             (["--file", "missing.cu", "--lang", "cutlass", "--family", "softmax", "--shape", "8x128"], "not found"),
             (["--file", "scale.cu", "--lang", "cutlass", "--family", "softmax", "--shape", "8x128",
               "--knob", "blocks=2"], "unknown knob(s) blocks"),
             (["--file", "scale.cu", "--lang", "cutlass", "--family", "gemm", "--shape", "8x128x8"],
              "the family does not have")]
    for args, message in cases:
        p = _cli("capture", *args, "--dtype", "bf16", "--lower-only", "-o", "x.bundle", cwd=tmp_path)
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines
        assert "Traceback" not in p.stderr and not (tmp_path / "x.bundle").exists()


def test_parent_never_runs_a_python_file(tmp_path):
    """A file whose import would leave a marker: reading its contract (what the CLI parent does) leaves none."""
    marker = tmp_path / "ran"
    text = f"open({str(marker)!r}, 'w').write('x')\n" + PY
    kf = read_kernel_file(write(tmp_path, "marker.py", text))
    assert kf.entry == "softmax_kernel" and not marker.exists()
    p = _cli("capture", "--file", "marker.py", "--lang", "cutlass", "--family", "softmax", "--shape", "8x128",
             "--dtype", "bf16", "--lower-only", "-o", "m.bundle", cwd=tmp_path)
    assert p.returncode == 2 and "builds c++ kernel files" in p.stderr and not marker.exists()


def test_source_candidate_breaking_the_contract_is_unbuildable_and_kept(tmp_path):
    from mosaic.bundle import load_bundle
    from mosaic.kernel_files import lower_source
    from mosaic.records import KernelSpec

    spec = KernelSpec(family="softmax", shape={"rows": 8, "cols": 128}, dtype="bf16", language="cutlass",
                      name="scale.cu")
    text = CU.replace("static constexpr bool fast = false;", "bool fast = false;")
    r = lower_source(spec, text, "h200", tmp_path / "c.bundle")
    assert r.status == "unbuildable" and "not frozen" in r.message and "\n" not in r.message
    b = load_bundle(r.bundle)
    assert b.one("source").read_text() == text and b.manifest["capture"]["summary"]["error"] == r.message
    misnamed = KernelSpec(family="softmax", shape={"rows": 8, "cols": 128}, dtype="bf16", language="cutlass",
                          name="../k.txt")
    r = lower_source(misnamed, CU, "h200", tmp_path / "n.bundle")
    assert r.status == "unbuildable" and "spec.name must be the kernel file's name" in r.message
    assert load_bundle(r.bundle).one("source").name == "edited.txt"
    unnamed = attrs.evolve(misnamed, name="")  # named after what its language builds: kernel.cu for cutlass
    r = lower_source(unnamed, text, "h200", tmp_path / "u.bundle")
    assert r.status == "unbuildable" and "not frozen" in r.message
    assert load_bundle(r.bundle).one("source").name == "kernel.cu"


def test_source_knobs_apply_what_the_file_has():
    from mosaic.kernel_files import source_knobs
    from mosaic.records import KernelSpec

    kf = KernelFile.from_json({**read_kernel_file_text(CU).to_json(with_source=True)})
    spec = KernelSpec(family="softmax", shape={"rows": 8, "cols": 128}, dtype="bf16", language="cutlass",
                      knobs={"threads": 512, "tile_m": 128, "kernel_schedule": "pingpong"})
    values, ignored = source_knobs(spec, kf)
    assert values == {"threads": 512, "fast": False, "alpha": 2.5} and ignored == ["kernel_schedule", "tile_m"]


def read_kernel_file_text(text: str, name: str = "scale.cu") -> KernelFile:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_text(text)
        return read_kernel_file(p)


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
TOKENS = st.sampled_from(["{", "}", ";", "//", "/*", "*/", "\"", "'", "\\", "\n", "mosaic:entry", "mosaic:knobs X",
                          "static constexpr", "struct Knobs {", "= 1e400", "= 0x", "[rows,", "]", "(", ")", ":", "@",
                          "frozen=True", "class Knobs:", "ENTRY = ", "INPUTS = {", "\x00", "\ufeff", "=", "0" * 400])


@st.composite
def mutated(draw, text: str):
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert", "token"]))
        if kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)):]
        elif kind == "insert":
            text = text[:at] + draw(st.text(max_size=12)) + text[at:]
        else:
            text = text[:at] + draw(TOKENS) + text[at:]
    return text


@FUZZ
@given(st.sampled_from([("k.cu", CU), ("k.py", PY)]).flatmap(lambda nt: st.tuples(st.just(nt[0]), mutated(nt[1]))),
       st.dictionaries(st.sampled_from(["threads", "fast", "alpha", "block_rows", "use_exp2", "label", "x"]),
                       st.text(max_size=8), max_size=3))
def test_fuzzed_files_read_or_refuse_in_one_line(tmp_path_factory, case, knobs):
    """Whatever the damage to a contract, reading it gives a KernelFile or one BadInput line; nothing else."""
    name, text = case
    path = tmp_path_factory.mktemp("fuzz") / name
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        kf = read_kernel_file(path)
    except BadInput as exc:
        assert "\n" not in exc.line() or exc.line().count("\n") == str(path).count("\n")
        return
    assert kf.entry and kf.inputs and kf.outputs
    try:
        values = kf.knob_values(knobs)
    except BadInput as exc:
        assert exc.line()
        return
    if kf.syntax == "c++":
        out = substitute_cxx_knobs(kf, values)
        assert out.count("\n") == kf.source.count("\n")


# -- what every language's file backend shares (mosaic.kernel_files.FileBackend / PythonFileBackend) ---

def test_failure_is_one_line_naming_the_type_and_the_first_message_line():
    from mosaic.backend import Unbuildable
    from mosaic.kernel_files import failure

    exc = failure("cute.compile failed", ValueError("\n\n  tile 96 does not divide 4096  \nsecond line"), "k.py")
    assert isinstance(exc, Unbuildable) and exc.where == "k.py"
    assert exc.what == "cute.compile failed: ValueError: tile 96 does not divide 4096"
    assert failure("x", RuntimeError("a" * 1000), "k.py").what == "x: RuntimeError: " + "a" * 400
    assert failure("Mosaic GPU lowering failed", KeyError(), "k.py").what == "Mosaic GPU lowering failed: KeyError"


def test_file_backend_checks_family_dims_and_knobs_in_the_child(tmp_path):
    from mosaic.kernel_files import FileBackend
    from mosaic.records import KernelSpec

    kf = read_kernel_file(write(tmp_path, "scale.cu", CU))
    be = FileBackend(kf)
    be.check(KernelSpec(family="rmsnorm", language="cutlass", dtype="bf16", shape={"rows": 8, "cols": 64},
                        knobs={"threads": 64}))
    with pytest.raises(BadInput, match="family does not have"):
        be.check(KernelSpec(family="gemm", language="cutlass", dtype="bf16", shape={"m": 8, "n": 8, "k": 8}))
    with pytest.raises(BadInput, match="unknown knob"):
        be.check(KernelSpec(family="rmsnorm", language="cutlass", dtype="bf16", shape={"rows": 8, "cols": 64},
                            knobs={"warps": 4}))
    with pytest.raises(BadInput, match="own class"):
        be.knobs("rmsnorm")


def test_python_file_backend_imports_once_and_builds_the_files_own_knobs(tmp_path):
    from mosaic.kernel_files import PythonFileBackend
    from mosaic.records import KernelSpec

    class Backend(PythonFileBackend):
        module_name = "mosaic_test_python_file_backend"

    kf = read_kernel_file(write(tmp_path, "softmax.py", PY))
    be = Backend(kf)
    spec = KernelSpec(family="softmax", language="cute", dtype="f32", shape={"rows": 4, "cols": 32},
                      knobs={"block_rows": 8})
    be.check(spec)
    assert be.module() is be.module() and be.module().__name__ == "mosaic_test_python_file_backend"
    knobs = be.knob_instance(spec)
    assert type(knobs).__name__ == "Knobs" and (knobs.block_rows, knobs.use_exp2, knobs.label) == (8, True, "a")
    broken = read_kernel_file(write(tmp_path, "broken.py", PY.replace("import dataclasses",
                                                                      "import dataclasses\nimport no_such_pkg_x")))
    with pytest.raises(BadInput, match="importing the kernel file raised ModuleNotFoundError"):
        Backend(broken).check(spec)


def test_captured_file_source_is_the_bundles_own_copy(tmp_path):
    """A timing session rebuilds a kernel-file reference from the text its bundle kept (the H200 quack rmsnorm ->
    Pallas campaign asked the worker for the language's own kernel instead, and failed)."""
    from mosaic.bundle import load_bundle, save_bundle
    from mosaic.kernel_files import captured_file_source
    from mosaic.records import KernelSpec

    spec = KernelSpec(family="rmsnorm", shape={"rows": 8, "cols": 64}, dtype="bf16", language="cute", name="k.py")
    text = "# the measured file\n"
    with_copy = save_bundle(tmp_path / "a.bundle", kernel=spec, language="cute",
                            files={"source/k.py": ("source", text)}, extra={"kernel_file": {"path": "k.py"}})
    assert captured_file_source(with_copy) == text
    own = save_bundle(tmp_path / "b.bundle", kernel=spec, language="cute", files={"source/k.py": ("source", text)})
    assert captured_file_source(own) is None  # a language's own kernel: no file to rebuild from
    lost = save_bundle(tmp_path / "c.bundle", kernel=spec, language="cute", files={"x.log": ("log", "")},
                       extra={"kernel_file": {"path": "k.py"}})
    with pytest.raises(BadInput, match="holds no copy"):
        captured_file_source(load_bundle(lost.root))
