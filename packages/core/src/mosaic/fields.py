"""Public field validators for attrs records (records, knob classes, configs, campaign files).

Each validator has attrs' signature ``(instance, attribute, value)`` and raises
:class:`~mosaic.errors.RecordError` through :func:`fail`, whose message names the record, the field, the
value and what is allowed: ``GemmKnobs.stages=1 is invalid: must be an integer in [2, 8]``. A record's own
rule (a check that needs two fields, say) calls :func:`fail` the same way, so every bad field reads alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import attrs

from mosaic.errors import RecordError

NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]*$")
ARCH_RE = re.compile(r"^sm_\d{2,3}[af]?$")

Validator = Callable[[Any, "attrs.Attribute", Any], None]


def fail(inst_or_cls: Any, attribute: attrs.Attribute, value: Any, allowed: str) -> NoReturn:
    """Raise RecordError ``<Record>.<field>=<value!r> is invalid: must be <allowed>``.

    :param inst_or_cls: the record being built (or its class), for the record's name.
    :param attribute: the attrs field, for its name.
    :param allowed: what the field accepts, as a phrase that follows "must be".
    """
    cls = inst_or_cls if isinstance(inst_or_cls, type) else type(inst_or_cls)
    raise RecordError(f"{cls.__name__}.{attribute.name}={value!r} is invalid: must be {allowed}")


def name_field(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A lower-case name: letters, digits, ``_ . -``, starting with a letter (plugin, family, GPU names)."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        fail(inst, attribute, value, "a lower-case name of letters, digits, '_', '.', '-' starting with a letter")


def sm_arch(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """An SM architecture name: ``sm_90a``, ``sm_100a``, ``sm_120a``, ``sm_80``."""
    if not isinstance(value, str) or not ARCH_RE.match(value):
        fail(inst, attribute, value, "an SM architecture such as sm_90a, sm_100a, sm_120a")


def positive(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A number > 0 (int or float, not bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        fail(inst, attribute, value, "a positive number")


def non_negative_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """An integer >= 0 (not bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(inst, attribute, value, "an integer >= 0")


def optional(validator: Validator) -> Validator:
    """``validator``, skipped when the value is None."""
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None:
            validator(inst, attribute, value)

    return check


def one_of(*allowed: str) -> Validator:
    """One of the given values (compared with ``in``)."""
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in allowed:
            fail(inst, attribute, value, "one of " + ", ".join(allowed))

    return check


def dim3(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A tuple of three positive integers (x, y, z); pair with the :func:`to_dim3` converter."""
    if (
        not isinstance(value, tuple)
        or len(value) != 3
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value)
    ):
        fail(inst, attribute, value, "three positive integers (x, y, z)")


def to_dim3(value: Any) -> Any:
    """Accept an int, a short sequence or a dict {x,y,z}; pad to three dimensions."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, 1, 1)
    if isinstance(value, Mapping):
        value = [value.get("x", 1), value.get("y", 1), value.get("z", 1)]
    if isinstance(value, list | tuple) and 1 <= len(value) <= 3:
        return tuple(value) + (1,) * (3 - len(value))
    return value


#: a knob field's metadata ``{"keyed": WHEN_SET}``: the field is part of a candidate's identity (its knob set and
#: key) only when it differs from its default -- a knob added to a class after campaigns were recorded (CuTe's
#: Blackwell ``cta_group``, ``acc_stages``) leaves every recorded candidate's key and history as it was
WHEN_SET = "when-set"


def keyed_knobs(knob_cls: type | None, knobs: Mapping) -> dict:
    """``knobs`` without the fields keyed only when set (:data:`WHEN_SET`) that hold their defaults."""
    if knob_cls is None or not attrs.has(knob_cls):
        return dict(knobs)
    quiet = {f.name: f.default for f in attrs.fields(knob_cls) if f.metadata.get("keyed") == WHEN_SET}
    return {k: v for k, v in knobs.items() if not (k in quiet and v == quiet[k])}

