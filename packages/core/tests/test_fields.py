"""mosaic.fields: the public validators every record, knob class and config uses; each bad value gives one
RecordError naming the record, the field, the value and what is allowed."""

from __future__ import annotations

import attrs
import pytest
from mosaic import fields
from mosaic.errors import BadInput, RecordError


@attrs.frozen
class Sample:
    name: str = attrs.field(default="gemm", validator=fields.name_field)
    arch: str = attrs.field(default="sm_90a", validator=fields.sm_arch)
    count: int = attrs.field(default=1, validator=fields.positive)
    spare: int = attrs.field(default=0, validator=fields.non_negative_int)
    kind: str = attrs.field(default="a", validator=fields.one_of("a", "b"))
    limit: int | None = attrs.field(default=None, validator=fields.optional(fields.positive))
    grid: tuple = attrs.field(default=(1, 1, 1), converter=fields.to_dim3, validator=fields.dim3)


def message(**kw) -> str:
    with pytest.raises(RecordError) as err:
        Sample(**kw)
    return str(err.value)


def test_good_values_pass_and_dim3_is_padded():
    s = Sample(name="h200.x-1_b", arch="sm_100a", count=2.5, spare=0, kind="b", limit=3, grid=[4, 2])
    assert s.grid == (4, 2, 1)
    assert Sample(grid=7).grid == (7, 1, 1) and Sample(grid={"y": 3}).grid == (1, 3, 1)
    assert Sample(limit=None).limit is None


@pytest.mark.parametrize(("kw", "expected"), [
    ({"name": "Gemm"}, "Sample.name='Gemm' is invalid: must be a lower-case name of letters, digits, '_', '.', '-' "
                       "starting with a letter"),
    ({"arch": "sm90"}, "Sample.arch='sm90' is invalid: must be an SM architecture such as sm_90a, sm_100a, sm_120a"),
    ({"count": 0}, "Sample.count=0 is invalid: must be a positive number"),
    ({"count": True}, "Sample.count=True is invalid: must be a positive number"),
    ({"spare": -1}, "Sample.spare=-1 is invalid: must be an integer >= 0"),
    ({"spare": 1.0}, "Sample.spare=1.0 is invalid: must be an integer >= 0"),
    ({"kind": "c"}, "Sample.kind='c' is invalid: must be one of a, b"),
    ({"limit": -2}, "Sample.limit=-2 is invalid: must be a positive number"),
    ({"grid": (1, 0, 1)}, "Sample.grid=(1, 0, 1) is invalid: must be three positive integers (x, y, z)"),
    ({"grid": [1, 2, 3, 4]}, "Sample.grid=[1, 2, 3, 4] is invalid: must be three positive integers (x, y, z)"),
])
def test_each_validator_names_record_field_value_and_what_is_allowed(kw, expected):
    assert message(**kw) == expected


def test_fail_is_a_record_error_and_bad_input_for_an_instance_or_a_class():
    field = attrs.fields(Sample).count
    for owner in (Sample(), Sample):
        with pytest.raises(RecordError, match=r"^Sample\.count=9 is invalid: must be <= 8$") as err:
            fields.fail(owner, field, 9, "<= 8")
        assert isinstance(err.value, BadInput) and isinstance(err.value, ValueError) and err.value.exit_code == 2


def test_records_use_the_public_validators():
    from mosaic.records import GpuTarget, KernelSpec

    with pytest.raises(RecordError, match=r"KernelSpec\.dtype='f128' is invalid: must be one of f64, f32"):
        KernelSpec(family="gemm", shape={"m": 1}, dtype="f128", language="cute")
    assert attrs.fields(GpuTarget).arch.validator is fields.sm_arch
    assert attrs.fields(GpuTarget).sm_count.validator is fields.positive
