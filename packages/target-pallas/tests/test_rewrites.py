"""The Pallas Mosaic GPU source rewrites (mosaic_target_pallas.rewrites) on real kernel files, lowered through the
kernel-file backend (what `mosaic capture --file --lower-only` runs in its child): the original and the rewritten
file are traced and lowered for the cuda platform, and the Mosaic GPU module each serialises is read back
(MLIR bytecode, parsed with jax's own MLIR) to count the operations that become the PTX forms of the rewrite's
row: ``math.exp`` (libdevice's accurate expf: exp.form ``precise``) against the inline ``ex2.approx.ftz.f32``
or ``math.exp2`` (``approx``); ``arith.divf`` of ``math.sqrt`` against ``math.rsqrt`` (div.form); the body's
replication and the ``scf.for`` trip count (loop.unroll). jax's CPU jaxlib has no Mosaic GPU -> PTX passes,
so the PTX rows themselves are lifted only where jax has a GPU (the same test, then also lifting the PTX and
SASS the GPU compile dumped). Files: examples/kernels/pallas/rmsnorm.py and tests/data/softmax_rows.py."""

import re
from collections import Counter
from pathlib import Path

import pytest
from mosaic.rewrites import NotApplicable, apply_rewrite, rewrites_for
from mosaic_target_pallas.rewrites import REWRITES

ROOT = Path(__file__).resolve().parents[3]
RMSNORM = ROOT / "examples" / "kernels" / "pallas" / "rmsnorm.py"
SOFTMAX = Path(__file__).resolve().parent / "data" / "softmax_rows.py"
RW = {r.rewrite: r for r in REWRITES}


def rewrite(name: str, text: str) -> str:
    return apply_rewrite(RW[name], text).text


# -- the table and the edits (no jax needed) -------------------------------------------------------------------
def test_the_table_is_registered_and_selected_by_row():
    from mosaic.catalog import CONCEPTS
    from mosaic.plugins import PluginHost

    names = set(PluginHost(allow="pallas").load().items("rewrites"))
    assert {f"{r.rewrite}@pallas" for r in REWRITES} <= names
    assert all(r.concept in {c.name for c in CONCEPTS} for r in REWRITES)

    class Row:
        key, reference, candidate = "exp.form", ["approx"], ["precise"]

    assert [r.rewrite for r in rewrites_for(Row, "pallas", REWRITES)] == ["approx-math-on", "exp-to-exp2"]
    Row.key, Row.reference, Row.candidate = "loop.unroll", 4, 1
    # a numeric row moves one way: the candidate unrolls less than the reference, so only the rewrite raising it
    assert [r.rewrite for r in rewrites_for(Row, "pallas", REWRITES)] == ["unroll-double"]
    Row.reference, Row.candidate = 1, 4
    assert [r.rewrite for r in rewrites_for(Row, "pallas", REWRITES)] == ["unroll-halve"]


def test_the_edits_splice_only_their_nodes():
    text = RMSNORM.read_text()
    on = rewrite("approx-math-on", text)
    assert "plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane, approx_math=True)" in on
    assert [ln for ln in on.splitlines() if ln not in text.splitlines()] == \
        [ln for ln in on.splitlines() if "approx_math=True" in ln]
    assert rewrite("approx-math-off", on) == text
    with pytest.raises(NotApplicable):
        rewrite("approx-math-on", on)
    with pytest.raises(NotApplicable):
        rewrite("approx-math-off", text)
    bare = "import jax\nfrom jax.experimental.pallas import mosaic_gpu as plgpu\ncall = plgpu.kernel(body, grid=(4,))\n"
    assert rewrite("approx-math-on", bare).endswith(
        "plgpu.kernel(body, grid=(4,), compiler_params=plgpu.CompilerParams(approx_math=True))\n")
    soft = SOFTMAX.read_text()
    folded = rewrite("exp-to-exp2", soft)
    assert folded.count("jnp.exp2((x_smem[...].astype(jnp.float32) - m) * 1.4426950408889634)") == 2
    assert "# the sum of exponentials" in folded
    twice = rewrite("unroll-double", rewrite("unroll-double", soft))
    assert "jax.lax.fori_loop(0, per, one_row, 0, unroll=4)" in twice
    assert rewrite("unroll-halve", rewrite("unroll-halve", twice)) == soft
    with pytest.raises(NotApplicable):
        rewrite("unroll-double", text)  # rmsnorm.py has no fori_loop
    with pytest.raises(NotApplicable):
        rewrite("rsqrt", text)  # already jax.lax.rsqrt


# -- lowered for the cuda platform, the Mosaic GPU module read back ------------------------------------------
def mosaic_modules(stablehlo: str) -> list[str]:
    """The text of every Mosaic GPU module the StableHLO's ``mosaic_gpu`` custom calls carry."""
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib.mlir import ir

    ctx = jmlir.make_ir_context()
    ctx.allow_unregistered_dialects = True  # the serialised (stable_mosaic_gpu.*) ops need no dialect
    out = []
    with ctx:
        def walk(op):
            for region in op.regions:
                for block in region:
                    for o in block:
                        if o.name == "stablehlo.custom_call" and "mhlo.backend_config" in o.attributes:
                            cfg = ir.DictAttr(o.attributes["mhlo.backend_config"])
                            out.append(str(ir.Module.parse(ir.StringAttr(cfg["module"]).value_bytes)))
                        walk(o)

        walk(ir.Module.parse(stablehlo).operation)
    return out


OPS = re.compile(r'"stable_mosaic_gpu\.((?:math|arith|scf)\.(?:exp2?|rsqrt|sqrt|divf|for))"'
                 r'|asm_string = "([a-z0-9.]*approx[a-z0-9.]*)')


class Low:
    def __init__(self, ops: Counter, lowered):
        self.ops, self.lowered = ops, lowered

    def rows(self, *keys):
        """{dialect: {key: value}} lifted from the GPU compile's PTX and SASS; {} without a GPU."""
        from mosaic.lift.inputs import lift_path

        out = {}
        for dialect, path in (("ptx", self.lowered.ptx), ("sass", self.lowered.sass)):
            if path is not None:
                fp = lift_path(path)
                out[dialect] = {k: (fp.get(k) or next(f for f in fp.features if f.key == k)).value for k in keys}
        return out


@pytest.fixture(scope="module")
def lower(tmp_path_factory):
    pytest.importorskip("jax", minversion="0.11.2", reason="needs jax 0.11.2 (Python >= 3.12): run in .venv312")
    from mosaic.kernel_files import read_kernel_file
    from mosaic.plugins import PluginHost
    from mosaic.records import KernelSpec
    from mosaic_target_pallas.kernel_file import PallasFileBackend

    gpu = PluginHost(allow="hopper").load().get("gpus", "h200")
    tmp = tmp_path_factory.mktemp("pallas-rewrites")
    seen = {}

    def run(text: str, name: str, family: str) -> Low:
        path = tmp / name
        path.write_text(text)
        spec = KernelSpec(family=family, shape={"rows": 64, "cols": 1024}, dtype="bf16", language="pallas",
                          knobs={}, name=name)
        work = tmp / path.stem
        low = PallasFileBackend(read_kernel_file(path)).lower(spec, gpu, work)
        (module,) = mosaic_modules(next(work.glob("*.stablehlo.mlir")).read_text())
        seen[name] = Low(Counter(a or b for a, b in OPS.findall(module)), low)
        return seen[name]

    return run


def test_approx_math_moves_exp_to_ex2_approx(lower):
    soft = SOFTMAX.read_text()
    base = lower(soft, "softmax.py", "softmax")
    assert base.ops["math.exp"] == 2 and base.ops["ex2.approx.ftz.f32"] == 0
    on = lower(rewrite("approx-math-on", soft), "on.py", "softmax")
    assert on.ops["math.exp"] == 0 and on.ops["ex2.approx.ftz.f32"] > 0
    off = lower(rewrite("approx-math-off", rewrite("approx-math-on", soft)), "off.py", "softmax")
    assert off.ops == base.ops
    if base.lowered.ptx is not None:  # on a GPU: the PTX/SASS rows themselves
        assert {d: r["exp.form"] for d, r in base.rows("exp.form").items()} == {"ptx": ["precise"], "sass": ["precise"]}
        assert {d: r["exp.form"] for d, r in on.rows("exp.form").items()} == {"ptx": ["approx"], "sass": ["approx"]}


def test_exp_to_exp2_drops_the_accurate_expf(lower):
    soft = SOFTMAX.read_text()
    base = lower(soft, "softmax.py", "softmax")
    folded = lower(rewrite("exp-to-exp2", soft), "exp2.py", "softmax")
    assert base.ops["math.exp"] == 2 and base.ops["math.exp2"] == 0
    assert folded.ops["math.exp"] == 0 and folded.ops["math.exp2"] == 2
    if folded.lowered.ptx is not None:
        assert {d: r["exp.form"] for d, r in folded.rows("exp.form").items()} == {"ptx": ["approx"], "sass": ["approx"]}


def test_rsqrt_removes_the_division(lower):
    """rmsnorm's reciprocal square root spelled as a division (the fixture: examples' rmsnorm.py with
    ``jax.lax.rsqrt(E)`` written ``1.0 / jnp.sqrt(E)``), rewritten back to the shipped file."""
    text = RMSNORM.read_text()
    sqrt = text.replace("jax.lax.rsqrt(", "1.0 / jnp.sqrt(")
    assert rewrite("rsqrt", sqrt) == text
    before = lower(sqrt, "sqrt.py", "rmsnorm")
    after = lower(rewrite("rsqrt", sqrt), "rsqrt.py", "rmsnorm")
    assert before.ops["math.sqrt"] == 1 and before.ops["math.rsqrt"] == 0
    assert after.ops["math.sqrt"] == 0 and after.ops["math.rsqrt"] == 1
    assert after.ops["arith.divf"] == before.ops["arith.divf"] - 1
    if before.lowered.ptx is not None:
        assert "ieee" in before.rows("div.form")["ptx"]["div.form"]


def test_unroll_replicates_the_fori_loop_body(lower):
    soft = SOFTMAX.read_text()
    base = lower(soft, "softmax.py", "softmax")
    two = lower(rewrite("unroll-double", soft), "u2.py", "softmax")
    # rows_per_cta=4: one row's three pipelines (each an scf.for) in a loop of 4 trips; unrolled twice: two rows'
    # pipelines in a loop of 2 trips; four times (= the trip count): jax drops the loop, four rows inline
    assert (base.ops["math.exp"], base.ops["scf.for"]) == (2, 4)
    assert (two.ops["math.exp"], two.ops["scf.for"]) == (4, 7)
    four = lower(rewrite("unroll-double", rewrite("unroll-double", soft)), "u4.py", "softmax")
    assert (four.ops["math.exp"], four.ops["scf.for"]) == (8, 12)
    back = lower(rewrite("unroll-halve", rewrite("unroll-double", rewrite("unroll-double", soft))), "h2.py", "softmax")
    assert back.ops == two.ops
