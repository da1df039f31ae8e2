"""A convergence campaign: what to port, to what, on which GPU, and the limits of the search.

Built from the ``mosaic run`` flags or from a TOML file (``mosaic run campaign.toml``, read with tomllib):

.. code-block:: toml

    source = "pallas"            # the reference's language
    target = "cute"              # the candidate's language
    family = "gemm"
    shape = "4096x4096x4096"     # or a table: shape = {m = 4096, n = 4096, k = 4096}
    dtype = "bf16"
    gpu = "h200"
    beam = 3
    budget_min = 10.0            # device minutes
    max_candidates = 40          # timed candidates
    proposer = "knobs"           # or "command"
    command = ["python3", "agent.py"]   # the agent, for proposer = "command"
    command_timeout_s = 120
    reference_knobs = {kernel = "jax-hopper"}
    start_knobs = {kernel = "naive"}    # the naive first translation in the target language
    check_shape = "256x256x128"  # optional: numerics gate on a smaller problem (default: the shape)
    isolation = "worker"         # live: one persistent process for gates and timings, replaced after any
                                 # failure; "step": a fresh process per gate and per timing session

Every field is validated at construction; an unknown key or a bad value is one error line naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mosaic.errors import BadInput, RecordError
from mosaic.records import DTYPES, _fail, name_field, one_of, positive
from mosaic.tomlfile import read_toml

#: dimension names per family, in the order ``--shape AxBxC`` lists them
FAMILY_DIMS = {
    "gemm": ("m", "n", "k"),
    "rmsnorm": ("rows", "cols"),
    "softmax": ("rows", "cols"),
    "attention": ("batch", "seq", "heads", "head_dim"),
}
PROPOSERS_BUILTIN = ("knobs", "command")


def parse_shape(family: str, shape: Any, where: str = "--shape") -> dict[str, int]:
    """``4096x4096x4096`` (dimension order of the family), ``m=4096,n=4096,k=4096`` or a mapping."""
    if isinstance(shape, Mapping):
        out = dict(shape)
    elif isinstance(shape, str) and "=" in shape:
        out = {}
        for part in shape.split(","):
            name, _, value = part.partition("=")
            out[name.strip()] = _int(value, where)
    elif isinstance(shape, str) and re.fullmatch(r"\d+(x\d+)*", shape.strip()):
        values = [int(v) for v in shape.strip().split("x")]
        dims = FAMILY_DIMS.get(family)
        if dims is None:
            raise BadInput(f"family '{family}' has no default dimension order; write the shape as name=value,...",
                           where)
        if len(values) != len(dims):
            raise BadInput(f"{family} shape needs {len(dims)} dimensions ({'x'.join(dims)}), got {shape!r}", where)
        out = dict(zip(dims, values, strict=True))
    else:
        raise BadInput(f"shape {shape!r} is not AxBxC, name=value,... or a table", where)
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadInput(f"shape dimension {k}={v!r} must be a positive integer", where)
    dims = FAMILY_DIMS.get(family)
    if dims is not None and set(out) != set(dims):
        raise BadInput(f"{family} shape needs dimensions {', '.join(dims)}; got {', '.join(sorted(out))}", where)
    return out


def _int(text: str, where: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise BadInput(f"shape value {text!r} is not an integer", where) from None


def _knob_map(inst, attribute, value):
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        _fail(inst, attribute, value, "a table of knob name to value")


def _command(value: Any) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        import shlex

        return tuple(shlex.split(value))
    return tuple(value)


@attrs.frozen
class Campaign:
    source: str = attrs.field(validator=name_field)
    target: str = attrs.field(validator=name_field)
    family: str = attrs.field(validator=name_field)
    shape: Mapping = attrs.field(converter=dict)
    dtype: str = attrs.field(validator=one_of(*DTYPES))
    gpu: str = attrs.field(default="h200", validator=name_field)
    beam: int = attrs.field(default=3, validator=positive)
    budget_min: float = attrs.field(default=10.0, validator=positive)
    max_candidates: int = attrs.field(default=40, validator=positive)
    proposer: str = attrs.field(default="knobs", validator=name_field)
    command: tuple = attrs.field(default=(), converter=_command)
    command_timeout_s: float = attrs.field(default=120.0, validator=positive)
    reference_knobs: Mapping = attrs.field(factory=dict, converter=dict, validator=_knob_map)
    start_knobs: Mapping = attrs.field(factory=dict, converter=dict, validator=_knob_map)
    check_shape: Mapping | None = attrs.field(default=None)
    noise_blocks: int = attrs.field(default=20, validator=positive)
    runs_per_block: int = attrs.field(default=20, validator=positive)
    rounds: int = attrs.field(default=5, validator=positive)  # A/B block pairs per interleaved comparison
    yardstick: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    isolation: str = attrs.field(default="worker", validator=one_of("worker", "step"))

    def __attrs_post_init__(self):
        f = attrs.fields(Campaign)
        if self.proposer == "command" and not self.command:
            _fail(self, f.command, self.command, "a program to run (proposer 'command' needs command = [...])")
        if not all(isinstance(a, str) for a in self.command):
            _fail(self, f.command, self.command, "a list of strings")
        if self.noise_blocks < 10 or self.noise_blocks % 2:
            _fail(self, f.noise_blocks, self.noise_blocks,
                  "even and >= 10 (the noise comes from >= 5 interleaved self-pairs of blocks)")
        if self.runs_per_block < 3:
            _fail(self, f.runs_per_block, self.runs_per_block, ">= 3")

    @property
    def problem(self) -> str:
        return "x".join(str(v) for v in self.shape.values())

    def to_json(self) -> dict:
        d = attrs.asdict(self)
        d["command"] = list(self.command)
        return d

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "campaign") -> Campaign:
        if not isinstance(data, Mapping):
            raise BadInput("a campaign is a table of settings", where)
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadInput(f"unknown campaign setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                           where)
        missing = [k for k in ("source", "target", "family", "shape", "dtype") if k not in data]
        if missing:
            raise BadInput(f"campaign lacks {', '.join(missing)}", where)
        values = dict(data)
        values["shape"] = parse_shape(values["family"], values["shape"], f"{where}: shape")
        if values.get("check_shape") is not None:
            values["check_shape"] = parse_shape(values["family"], values["check_shape"], f"{where}: check_shape")
        try:
            return cls(**values)
        except RecordError as exc:
            raise BadInput(exc.what, where) from None
        except TypeError as exc:
            raise BadInput(f"campaign: {exc}", where) from None


def load_campaign(path: str | Path) -> Campaign:
    return Campaign.from_json(read_toml(path), str(path))
