"""A convergence campaign: what to port, to what, on which GPU, and the limits of the search.

Built from the ``mosaic run`` flags or from a TOML file (``mosaic run campaign.toml``, read with tomllib):

.. code-block:: toml

    source = "pallas"            # the reference's language
    target = "cute"              # the candidate's language
    family = "gemm"
    shape = "4096x4096x4096"     # or a table: shape = {m = 4096, n = 4096, k = 4096}
    dtype = "bf16"
    gpu = "h200"                 # optional; left out, `mosaic run` uses the detected device's record (mosaic gpus)
    beam = 3
    budget_min = 10.0            # device minutes
    max_candidates = 40          # timed candidates
    proposer = "knobs"           # or "command"
    command = ["python3", "agent.py"]   # the agent, for proposer = "command"
    command_timeout_s = 120
    reference_knobs = {kernel = "jax-hopper"}
    start_knobs = {kernel = "naive"}    # the naive first translation in the target language
    reference = "kernels/rmsnorm.py"    # optional: the reference is this kernel file (docs/kernel-files.md),
                                        # in `source` (default: the language the file is written in)
    start = "kernels/rmsnorm.cu"        # optional: the first candidate is this kernel file in `target`, its
                                        # knob class the file's (default: the target's template)
    check_shape = "256x256x128"  # optional: numerics gate on a smaller problem (default: the shape)
    isolation = "worker"         # live: one persistent process for gates and timings, replaced after any
                                 # failure; "step": a fresh process per gate and per timing session

Every field is validated at construction; an unknown key or a bad value is one error line naming it. The
two files' paths are relative to the TOML file's directory; ``mosaic run`` reads their contracts before
anything is built (:func:`mosaic.kernel_files.check_campaign_file`: a broken file is one line, exit 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mosaic.errors import BadInput, RecordError
from mosaic.families import parse_shape
from mosaic.fields import fail, name_field, one_of, positive
from mosaic.gpus import DEFAULT_GPU
from mosaic.records import DTYPES
from mosaic.tomlfile import read_toml

PROPOSERS_BUILTIN = ("knobs", "command")


def _finite_positive(inst, attribute, value):
    positive(inst, attribute, value)
    if not math.isfinite(value):
        fail(inst, attribute, value, "a finite positive number")


def _positive_int(inst, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail(inst, attribute, value, "a positive integer")


#: settings that must be text, and those that must be tables (checked before anything reads them)
_TEXT = ("source", "target", "family", "dtype", "gpu", "proposer", "isolation", "reference", "start")
_TABLES = ("reference_knobs", "start_knobs")


def _knob_map(inst, attribute, value):
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        fail(inst, attribute, value, "a table of knob name to value")


def _file_path(inst, attribute, value):
    if value is not None and (not isinstance(value, str) or not value.strip()):
        fail(inst, attribute, value, "the path of a kernel file")


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
    # a record built without one (tests, tools) gets DEFAULT_GPU; `mosaic run` always names the resolved record
    gpu: str = attrs.field(default=DEFAULT_GPU, validator=name_field)
    beam: int = attrs.field(default=3, validator=_positive_int)
    budget_min: float = attrs.field(default=10.0, validator=_finite_positive)
    max_candidates: int = attrs.field(default=40, validator=_positive_int)
    proposer: str = attrs.field(default="knobs", validator=name_field)
    command: tuple = attrs.field(default=(), converter=_command)
    command_timeout_s: float = attrs.field(default=120.0, validator=_finite_positive)
    reference_knobs: Mapping = attrs.field(factory=dict, converter=dict, validator=_knob_map)
    start_knobs: Mapping = attrs.field(factory=dict, converter=dict, validator=_knob_map)
    check_shape: Mapping | None = attrs.field(default=None)
    noise_blocks: int = attrs.field(default=20, validator=_positive_int)
    runs_per_block: int = attrs.field(default=20, validator=_positive_int)
    rounds: int = attrs.field(default=5, validator=_positive_int)  # A/B block pairs per interleaved comparison
    yardstick: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    isolation: str = attrs.field(default="worker", validator=one_of("worker", "step"))
    reference: str | None = attrs.field(default=None, validator=_file_path)  # the reference's kernel file
    start: str | None = attrs.field(default=None, validator=_file_path)      # the first candidate's kernel file

    def __attrs_post_init__(self):
        f = attrs.fields(Campaign)
        if self.proposer == "command" and not self.command:
            fail(self, f.command, self.command, "a program to run (proposer 'command' needs command = [...])")
        if not all(isinstance(a, str) for a in self.command):
            fail(self, f.command, self.command, "a list of strings")
        if self.noise_blocks < 10 or self.noise_blocks % 2:
            fail(self, f.noise_blocks, self.noise_blocks,
                  "even and >= 10 (the noise comes from >= 5 interleaved self-pairs of blocks)")
        if self.runs_per_block < 3:
            fail(self, f.runs_per_block, self.runs_per_block, ">= 3")

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
        values = dict(data)
        for lang, path in (("source", "reference"), ("target", "start")):  # a file's language, when not named
            if lang not in values and isinstance(values.get(path), str):
                from mosaic.kernel_files import file_language, read_kernel_file

                values[lang] = file_language(read_kernel_file(values[path]), f"{where}: {path}")
        missing = [k for k in ("source", "target", "family", "shape", "dtype") if k not in values]
        if missing:
            raise BadInput(f"campaign lacks {', '.join(missing)}", where)
        for name in _TEXT:
            if name in values and not isinstance(values[name], str) and \
                    not (name in ("reference", "start") and values[name] is None):
                raise BadInput(f"campaign setting '{name}' must be a string, not {_kind(values[name])}", where)
        for name in _TABLES:
            if name in values and not isinstance(values[name], Mapping):
                raise BadInput(f"campaign setting '{name}' must be a table of knob name to value, not "
                               f"{_kind(values[name])}", where)
        for name in ("shape", "check_shape"):
            v = values.get(name)
            if v is not None and not isinstance(v, str | Mapping):
                raise BadInput(f"campaign setting '{name}' must be a string like 4096x4096x4096 or a table, not "
                               f"{_kind(v)}", where)
        cmd = values.get("command")
        if cmd is not None and not (isinstance(cmd, str) or (isinstance(cmd, list | tuple)
                                                           and all(isinstance(a, str) for a in cmd))):
            raise BadInput("campaign setting 'command' must be a command line or a list of strings", where)
        if isinstance(cmd, str):
            import shlex

            try:
                shlex.split(cmd)
            except ValueError as exc:
                raise BadInput(f"campaign setting 'command' is not a command line: {exc}", where) from None
        values["shape"] = parse_shape(values["family"], values["shape"], f"{where}: shape")
        if values.get("check_shape") is not None:
            values["check_shape"] = parse_shape(values["family"], values["check_shape"], f"{where}: check_shape")
        try:
            return cls(**values)
        except RecordError as exc:
            raise BadInput(exc.what, where) from None
        except (TypeError, ValueError) as exc:
            raise BadInput(f"campaign: {exc}", where) from None


def _kind(value: Any) -> str:
    return {list: "a list", tuple: "a list", dict: "a table", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)


def load_campaign(path: str | Path) -> Campaign:
    data = read_toml(path)
    for name in ("reference", "start"):  # relative to the campaign file
        if isinstance(data.get(name), str) and data[name].strip():
            data[name] = str((Path(path).parent / data[name]).resolve())
    return Campaign.from_json(data, str(path))
