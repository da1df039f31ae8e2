"""Knobs of the Pallas row-wise kernels (rmsnorm, softmax): validation in one line, command-line strings,
the problems each knob set has on a shape, the shared-memory count, and the dependency table that mends a
single edit into a buildable compound edit. No jax needed."""

import attrs
import pytest
from mosaic.errors import RecordError
from mosaic.proposers.dependencies import complete
from mosaic.records import KernelSpec
from mosaic_target_pallas.rowwise_knobs import (
    ROWWISE_KNOBS,
    RmsnormKnobs,
    SoftmaxKnobs,
    can_implement,
    table_configs,
    values,
)


@pytest.fixture(scope="module")
def h200():
    from mosaic.plugins import PluginHost

    return PluginHost(allow="hopper").load().get("gpus", "h200")


def _spec(family="rmsnorm", rows=16384, cols=8192, dtype="bf16", **knobs):
    return KernelSpec(family=family, shape={"rows": rows, "cols": cols}, dtype=dtype, language="pallas", knobs=knobs)


@pytest.mark.parametrize("family", ["rmsnorm", "softmax"])
def test_every_table_value_constructs_and_neighbours_outside_are_refused(family):
    cls = ROWWISE_KNOBS[family]
    for knob, vals in values(family).items():
        for v in vals:
            assert getattr(cls(**{knob: v}), knob) == v
    for knob, bad in [("block_rows", 1), ("block_rows", 12), ("block_rows", 128), ("tma_cols", 32),
                      ("tma_cols", 512), ("vector", 16), ("vector", 3), ("max_concurrent_steps", 0),
                      ("max_concurrent_steps", 5), ("blocks_per_cta", 512), ("out_slots", 3), ("out_slots", -1),
                      ("approx_math", "yes"), ("block_rows", True)]:
        with pytest.raises(RecordError) as exc:
            cls(**{knob: bad})
        line = str(exc.value)
        assert "\n" not in line and knob in line and "must be" in line, line


def test_command_line_strings_convert():
    k = SoftmaxKnobs(block_rows="8", tma_cols="128", vector="4", online="false", approx_math="TRUE")
    assert (k.block_rows, k.tma_cols, k.vector, k.online, k.approx_math) == (8, 128, 4, False, True)
    with pytest.raises(RecordError, match="online='maybe' is invalid: must be true or false"):
        SoftmaxKnobs(online="maybe")
    assert "online" not in {f.name for f in attrs.fields(RmsnormKnobs)}


def test_problems_name_each_conflict_with_its_rule_code():
    k = RmsnormKnobs(tma_cols=64, vector=8, max_concurrent_steps=4, blocks_per_cta=2)
    codes = dict(k.problems(1004, 8100))
    assert set(codes) == {"vector-tiles-box", "steps-within-cta", "PALLAS-ROWS"}
    assert "32 lanes x vector must divide tma_cols=64" in codes["vector-tiles-box"]
    lines = [line for _, line in k.problems(1004, 8100)]
    assert any("rows=1004 is not divisible by block_rows x blocks_per_cta = 4 x 2" in x for x in lines)
    assert any("cols=8100 is not divisible by tma_cols=64" in x for x in lines)
    assert RmsnormKnobs().problems(16384, 8192) == []
    # more than 256 boxes per row cannot be one TMA copy
    assert "one TMA copy takes at most 256" in RmsnormKnobs(tma_cols=64, vector=2).problems(16384, 65536)[0][1]


def test_smem_count_and_budget(h200):
    k = RmsnormKnobs()  # 2 stages + 1 output slot of 4 x 8192 bf16, the weight row, the reduction scratch, barriers
    assert k.smem_bytes(8192, 2, weight=True) == 3 * 4 * 8192 * 2 + 8192 * 2 + 2048 + 24
    assert can_implement(k, _spec(), h200) == []
    over = can_implement(RmsnormKnobs(block_rows=8), _spec(), h200)
    assert [d.code for d in over] == ["smem-per-block"]
    assert can_implement(SoftmaxKnobs(block_rows=8), _spec("softmax", cols=2048), h200) == []


def test_dependencies_mend_single_edits(h200):
    cls = RmsnormKnobs
    base = attrs.asdict(cls())
    # a narrower box needs a narrower vector
    assert complete(cls.DEPENDENCIES, cls, {**base, "tma_cols": 64}, {"tma_cols"}, _spec(), h200) == [
        {"knob": "vector", "value": 2, "was": 8, "code": "vector-tiles-box"}]
    # two output slots at 8192 columns leave room for one stage only
    assert complete(cls.DEPENDENCIES, cls, {**base, "out_slots": 2}, {"out_slots"}, _spec(), h200) == [
        {"knob": "max_concurrent_steps", "value": 1, "was": 2, "code": "smem-per-block"}]
    # one block per CTA cannot have two in flight
    parts = complete(cls.DEPENDENCIES, cls, {**base, "blocks_per_cta": 1}, {"blocks_per_cta"}, _spec(), h200)
    assert parts == [{"knob": "max_concurrent_steps", "value": 1, "was": 2, "code": "steps-within-cta"}]
    # in place frees the output buffer: a third stage fits 8192 columns; with one stage it needs a second
    assert can_implement(cls(out_slots=0, max_concurrent_steps=3), _spec(), h200) == []
    assert complete(cls.DEPENDENCIES, cls, {**base, "max_concurrent_steps": 1, "out_slots": 0}, {"out_slots"}, _spec(),
                    h200) == [{"knob": "max_concurrent_steps", "value": 2, "was": 1, "code": "in-place-needs-two-stages"}]
    # two-row blocks: half the buffers, so four stages and two output slots fit 8192 columns
    assert can_implement(cls(block_rows=2, vector=4, max_concurrent_steps=4, out_slots=2, blocks_per_cta=8), _spec(),
                         h200) == []
    assert "2 warps x 32 lanes x vector must divide tma_cols=256" in dict(cls(block_rows=2).problems(16384, 8192))[
        "vector-tiles-box"]
    # direct loads stage nothing: any block fits, and the pipeline knobs go back to their defaults
    assert can_implement(cls(copy="direct", block_rows=64), _spec(), h200) == []
    assert complete(cls.DEPENDENCIES, cls, {**base, "max_concurrent_steps": 3, "copy": "direct"}, {"copy"}, _spec(),
                    h200) == [{"knob": "max_concurrent_steps", "value": 2, "was": 3, "code": "direct-has-no-pipeline"}]
    # 8 rows of 8192 bf16 columns do not fit any pipeline: no compound edit
    assert complete(cls.DEPENDENCIES, cls, {**base, "block_rows": 8}, {"block_rows"}, _spec(), h200) is None


@pytest.mark.parametrize("family", ["rmsnorm", "softmax"])
def test_table_configs_are_buildable_where_found(family, h200):
    spec = _spec(family, cols=512)
    configs = table_configs(family, spec, h200)
    assert len(configs) == sum(len(v) for v in values(family).values())
    for knob, value, knobs in configs:
        assert knobs is not None, (knob, value)  # at 512 columns every table value fits
        assert knobs[knob] == value
        assert can_implement(ROWWISE_KNOBS[family](**knobs), spec, h200) == []
    # at 8192 columns only 2- and 4-row blocks fit shared memory; 2 rows split each row over two warps, so a
    # vector of 8 would span 512 columns of a 256-column box: the table mends it to 4
    wide = {(k, v): kn for k, v, kn in table_configs(family, _spec(family), h200)}
    assert [v for (k, v), kn in wide.items() if k == "block_rows" and kn is not None] == [2, 4]
    assert wide[("block_rows", 2)]["vector"] == 4


def test_the_plugin_routes_the_row_wise_families():
    from mosaic_target_pallas.plugin import LANGUAGE

    assert {"rmsnorm", "softmax"} <= set(LANGUAGE.families)
    for family in ("rmsnorm", "softmax"):
        assert {f"{family}:{c}" for c in ("cpu-lowering", "interpreter", "race-detection", "gpu-capture")} <= \
            LANGUAGE.capabilities
        assert LANGUAGE.backend.knobs(family) is ROWWISE_KNOBS[family]
    from mosaic.errors import BadInput

    with pytest.raises(BadInput, match="pallas has no family 'conv'; known: gemm, attention, rmsnorm, softmax"):
        LANGUAGE.backend.knobs("conv")
