"""AttentionKnobs validation, the attention budget rules (no compile) and their refusals through the backend."""

from pathlib import Path

import attrs
import pytest
from mosaic.backend import Unbuildable
from mosaic.errors import RecordError
from mosaic.plugins import PluginHost
from mosaic.proposers.dependencies import complete
from mosaic.records import KernelSpec
from mosaic_target_cute import budget
from mosaic_target_cute.backend import CuteBackend
from mosaic_target_cute.knobs import AttentionKnobs, AttentionShape, attention_can_implement
from mosaic_target_cute.lowering import CuteBuild

SHAPE = {"batch": 4, "seq": 4096, "heads": 32, "head_dim": 128}


@pytest.fixture(scope="module")
def h200():
    return PluginHost(allow="hopper").load().get("gpus", "h200")


def _spec(knobs, shape=SHAPE):
    return KernelSpec(family="attention", shape=shape, dtype="bf16", language="cute", knobs=knobs, name="attn")


@pytest.mark.parametrize("bad, field", [
    (dict(block_m=96), "block_m"),
    (dict(block_n=72), "block_n"),
    (dict(stages=0), "stages"),
    (dict(consumer_warpgroups=4), "consumer_warpgroups"),
    (dict(block_m=64, consumer_warpgroups=2), "block_m"),  # 32 rows per warpgroup
    (dict(block_m=256, consumer_warpgroups=1), "block_m"),  # 256 rows per warpgroup
    (dict(consumer_regs=250), "consumer_regs"),  # setmaxnreg takes multiples of 8
    (dict(producer_regs=16), "producer_regs"),
    (dict(pingpong=True, block_m=192, consumer_warpgroups=3), "pingpong"),
    (dict(p_in="tmem"), "p_in"),
    (dict(kernel="naive", block_n=64), "block_n"),
    (dict(rows_per_block=64), "rows_per_block"),
])
def test_bad_knobs_name_the_field(bad, field):
    with pytest.raises(RecordError, match=rf"AttentionKnobs\.{field}="):
        AttentionKnobs(**bad)


def test_knobs_from_the_command_line_are_converted():
    """``mosaic capture --knob block_n=176 --knob pingpong=true`` passes strings."""
    k = AttentionKnobs(block_n="176", stages="3", pingpong="true", causal_skip="0", p_in="smem")
    assert (k.block_n, k.stages, k.pingpong, k.causal_skip) == (176, 3, True, False)
    with pytest.raises(RecordError, match=r"AttentionKnobs\.block_n='17x'"):
        AttentionKnobs(block_n="17x")


def test_the_backend_gives_the_attention_knobs():
    assert CuteBackend().knobs("attention") is AttentionKnobs
    k = AttentionKnobs()
    assert (k.threads, k.rows_per_warpgroup) == (384, 64)
    assert AttentionKnobs(kernel="naive", rows_per_block=64).threads == 64


def test_shape_defaults_and_checks():
    s = AttentionShape.from_shape({**SHAPE, "kv_heads": 8, "causal": 1})
    assert (s.group, s.causal) == (4, True)
    assert AttentionShape.from_shape(SHAPE).kv_heads == 32
    with pytest.raises(RecordError, match="head_dim=80"):
        AttentionKnobs().check_shape(AttentionShape.from_shape({**SHAPE, "head_dim": 80}))
    AttentionKnobs(kernel="naive").check_shape(AttentionShape.from_shape({**SHAPE, "head_dim": 80}))


def test_estimates(h200):
    s = AttentionShape.from_shape(SHAPE)
    # Q 128x128 + 2 x (K + V) 128x128, 16-bit, + 2 KiB (barrier slot, static)
    assert budget.attention_smem_bytes(AttentionKnobs(), s) == (128 * 128 + 4 * 128 * 128) * 2 + 2048
    assert budget.attention_smem_bytes(AttentionKnobs(p_in="smem"), s) == (5 * 128 * 128 + 128 * 128) * 2 + 2048
    assert budget.consumer_registers(AttentionKnobs(), s) == {"S": 64, "O": 64, "P": 32, "other": 24, "total": 184}
    assert budget.attention_diagnose(AttentionKnobs(), s, h200) == []


@pytest.mark.parametrize("knobs, shape, code, figure", [
    # Q 32 KiB + 4 x (K + V) 32 KiB each = 288 KiB + 2 KiB
    (dict(stages=4), SHAPE, "smem-per-block", 296960),
    (dict(block_n=192, p_in="smem"), SHAPE, "smem-per-block", 280576),
    # three consumer warpgroups at 240 registers: 128 x (24 + 720) > 65536
    (dict(block_m=192, consumer_warpgroups=3), SHAPE, "CUTE-REG-SPLIT", 95232),
    # 128 rows per warpgroup at head_dim 128: S 128 + O 128 + P 64 + 24
    (dict(block_m=128, consumer_warpgroups=1, producer_regs=56, consumer_regs=256), SHAPE, "CUTE-ACC-REGS", 344),
    # three warpgroups at 160 registers hold head_dim 64 (FlashAttention-3's split) but not 128
    (dict(block_m=192, consumer_warpgroups=3, producer_regs=32, consumer_regs=160), SHAPE, "CUTE-ACC-REGS", 184),
])
def test_unbuildable_configs_are_refused_by_rule(knobs, shape, code, figure, h200, tmp_path):
    k, s = AttentionKnobs(**knobs), AttentionShape.from_shape(shape)
    found = budget.attention_diagnose(k, s, h200)
    assert [d.code for d in found] == [code] and found[0].actual == figure
    # the backend refuses it before compiling, naming the rule (nothing is written)
    with pytest.raises(Unbuildable, match=rf"\[{code}\].*{figure}"):
        CuteBackend().lower(_spec(knobs, shape), h200, tmp_path)
    assert not (tmp_path / "cute_dump").exists()


def test_every_broken_rule_is_reported(h200):
    k = AttentionKnobs(block_m=192, consumer_warpgroups=3, stages=6, block_n=256)
    codes = [d.code for d in budget.attention_diagnose(k, AttentionShape.from_shape(SHAPE), h200)]
    assert codes == ["smem-per-block", "CUTE-REG-SPLIT", "CUTE-ACC-REGS"]


def test_a_problem_the_kernel_does_not_build_is_unbuildable(h200, tmp_path):
    with pytest.raises(Unbuildable, match="head_dim=80"):
        CuteBackend().lower(_spec({}, {**SHAPE, "head_dim": 80}), h200, tmp_path)


def _build(**kw):
    base = dict(kernel_name="k", ptx=Path("x"), cubin=Path("y"), registers=168, static_smem=1024,
                dynamic_smem=164864, threads=384, cluster=(1, 1, 1), grid_ctas=4096, compile_seconds=0.1)
    return CuteBuild(**{**base, **kw})


def test_register_pool_of_the_compiled_launch(h200):
    k = AttentionKnobs()
    assert budget.register_pool(_build(), k, h200) == []  # 168 x 384 = 64512 = 128 x (24 + 2 x 240)
    # a launch of fewer registers than the split asks: the consumers' setmaxnreg.inc would wait forever
    found = budget.register_pool(_build(registers=128), k, h200)
    assert [d.code for d in found] == ["CUTE-REG-POOL"] and found[0].actual == 64512
    with pytest.raises(Unbuildable, match=r"\[CUTE-REG-POOL\]"):
        budget.check_attention(_build(registers=128), k, h200)
    with pytest.raises(Unbuildable, match=r"\[smem-per-block\]"):
        budget.check_attention(_build(dynamic_smem=240000), k, h200)


def test_compound_edit_mends_a_register_split(h200):
    """Three consumer warpgroups need a smaller share each: the dependency table's partner values find it."""
    spec = _spec({}, {**SHAPE, "head_dim": 64})
    knobs = attrs.asdict(AttentionKnobs(block_m=192, consumer_warpgroups=3))  # builds; the budget refuses it
    parts = complete(AttentionKnobs.DEPENDENCIES, AttentionKnobs, knobs, {"block_m", "consumer_warpgroups"}, spec,
                     h200)
    assert parts == [{"knob": "consumer_regs", "value": 160, "was": 240, "code": "CUTE-REG-SPLIT"}]
    assert attention_can_implement(AttentionKnobs(block_m=192, consumer_warpgroups=3, consumer_regs=160),
                                   spec, h200) == []


def test_attention_constructs_name_catalog_concepts_and_real_knobs():
    """Each attention construct is a concept of core's catalog, registered by the plugin; each knob it names is an
    AttentionKnobs field (the knobs proposer maps a concept to those names)."""
    from mosaic.catalog import CONCEPT_NAMES, catalog_from_host
    from mosaic.plugins import host
    from mosaic.proposers.knobs import construct_knobs
    from mosaic_target_cute.constructs import ATTENTION_CONSTRUCTS

    assert {c.concept for c in ATTENTION_CONSTRUCTS} <= CONCEPT_NAMES and len(ATTENTION_CONSTRUCTS) == 6
    cat = catalog_from_host(host())
    assert all(cat.entry(c.concept, "cute").source == "cute" for c in ATTENTION_CONSTRUCTS)
    fields = attrs.fields_dict(AttentionKnobs)
    named = {k for c in ATTENTION_CONSTRUCTS for k, _ in construct_knobs(c.expression)}
    assert named == {"block_n", "stages", "pingpong", "causal_skip", "p_in"} and named <= set(fields)
