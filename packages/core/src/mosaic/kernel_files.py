"""Kernels from files: the language-neutral contract a user's kernel file follows (docs/kernel-files.md).

A kernel file names, in the file itself, its **entry point**, its **inputs** and **outputs** (each with its
dimensions, named after the family's: ``x[rows,cols]``) and its **knobs**: a frozen class whose fields all
have defaults (jax's ``TuningConfig`` shape). Two syntaxes carry the same contract:

* C++/CUDA (``.cu``, ``.cuh``): comment lines ``// mosaic:entry NAME``, ``// mosaic:inputs x[rows,cols]
  w[cols]``, ``// mosaic:outputs y[rows,cols]`` (optional ``// mosaic:knobs NAME``, default ``Knobs``) and
  ``struct Knobs { static constexpr int threads = 256; ... };`` -- frozen means every member is ``static
  constexpr`` with a literal value.
* Python (``.py``, CuTe DSL or Pallas): module-level ``ENTRY = "name"``, ``INPUTS = {"x": ("rows", "cols"),
  ...}``, ``OUTPUTS = {...}`` (optional ``KNOBS = "Name"``, default ``Knobs``) and a class decorated
  ``@dataclasses.dataclass(frozen=True)`` (or ``@attrs.frozen``) whose annotated fields have literal defaults.

:func:`read_kernel_file` reads the contract **without running the file** (the parent CLI process only
parses: Python through :mod:`ast`, C++ through the comment lines and the ``Knobs`` struct), so a missing
entry point, a knob class that is not frozen, an unknown ``--knob`` or a syntax error is one error line
before any child starts. Building happens in the capture's child process only (:func:`capture_file`,
``python -m mosaic.kernel_files REQUEST.json``): the language's backend offers ``kernel_file(kfile)``, an
object with the :mod:`mosaic.backend` methods for that one file; the child imports a Python file there and
nowhere else. The bundle keeps the file (``source/<name>``) and the manifest's ``kernel_file`` section
records its SHA-256, entry, operands and knob values.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mosaic.errors import BadInput

MAX_FILE_BYTES = 4 * 2**20
SYNTAXES = {".cu": "c++", ".cuh": "c++", ".py": "python"}
KNOB_TYPES = ("int", "float", "bool", "str")
_CXX_TYPES = {"int": "int", "unsigned": "int", "long": "int", "size_t": "int", "int32_t": "int",
              "int64_t": "int", "uint32_t": "int", "bool": "bool", "float": "float", "double": "float"}
_OPERAND_RE = re.compile(r"^([A-Za-z_]\w*)\[([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\]$")
_DIRECTIVE_RE = re.compile(r"^\s*//\s*mosaic:([\w-]+)[ \t]*(.*?)\s*$", re.M)
#: the nvcc flags a ``.cu`` file may ask for on its ``// mosaic:nvcc-flags`` line (each at most once), and
#: nothing else: numerics switches only, never paths, defines, tools or host-compiler options
NVCC_FLAGS = {"-use_fast_math": re.compile(r"-use_fast_math"), "-fmad": re.compile(r"-fmad=(?:true|false)"),
              "-ftz": re.compile(r"-ftz=(?:true|false)"), "-prec-div": re.compile(r"-prec-div=(?:true|false)"),
              "-prec-sqrt": re.compile(r"-prec-sqrt=(?:true|false)")}
NVCC_FLAGS_DIRECTIVE = "nvcc-flags"
_IDENT = attrs.validators.matches_re(r"[A-Za-z_]\w{0,127}")


@attrs.frozen
class Knob:
    """One field of the file's knob class: name, type (int, float, bool, str) and default."""

    name: str = attrs.field(validator=_IDENT)
    type: str = attrs.field(validator=attrs.validators.in_(KNOB_TYPES))
    default: Any = None

    def parse(self, text: Any) -> Any:
        """A ``--knob`` value (text from the command line, or already typed) in this knob's type."""
        if not isinstance(text, str):
            value = text
        elif self.type == "bool":
            low = text.strip().lower()
            if low not in ("true", "false", "1", "0"):
                raise BadInput(f"knob '{self.name}' is a bool; '{text}' is not true/false", "--knob")
            value = low in ("true", "1")
        elif self.type == "int":
            try:
                value = int(text, 0)
            except ValueError:
                raise BadInput(f"knob '{self.name}' is an int; '{text}' is not an integer", "--knob") from None
        elif self.type == "float":
            try:
                value = float(text)
            except ValueError:
                raise BadInput(f"knob '{self.name}' is a float; '{text}' is not a number", "--knob") from None
        else:
            value = text
        want = {"int": int, "float": (int, float), "bool": bool, "str": str}[self.type]
        if not isinstance(value, want) or (self.type in ("int", "float") and isinstance(value, bool)):
            raise BadInput(f"knob '{self.name}' is a {self.type}; got {value!r}", "--knob")
        if self.type == "float":
            import math

            if not math.isfinite(float(value)):
                raise BadInput(f"knob '{self.name}' must be a finite number, got {value!r}", "--knob")
            return float(value)
        return value


@attrs.frozen
class Operand:
    """An input or output of the entry point: its name (the family's array name) and its dimensions."""

    name: str = attrs.field(validator=_IDENT)
    dims: tuple = attrs.field(converter=tuple)

    def shape(self, shape: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(int(shape[d]) for d in self.dims)

    def text(self) -> str:
        return f"{self.name}[{','.join(self.dims)}]"


def _operands(items) -> tuple:
    return tuple(o if isinstance(o, Operand) else Operand(o["name"], o["dims"]) for o in items)


def _knobs(items) -> tuple:
    return tuple(k if isinstance(k, Knob) else Knob(k["name"], k["type"], k["default"]) for k in items)


@attrs.frozen
class KernelFile:
    """A kernel file's contract, read without running it. ``source`` is the text that was read and
    ``sha256`` its hash: the child builds exactly this text (it re-reads the file and refuses a change)."""

    path: str
    syntax: str = attrs.field(validator=attrs.validators.in_(tuple(set(SYNTAXES.values()))))
    entry: str = attrs.field(validator=_IDENT)
    inputs: tuple = attrs.field(converter=_operands)
    outputs: tuple = attrs.field(converter=_operands)
    knob_class: str = attrs.field(validator=_IDENT)
    knobs: tuple = attrs.field(converter=_knobs)
    sha256: str = ""
    source: str = attrs.field(default="", repr=False)
    #: ``(dim, granule)`` pairs the file declares (``MULTIPLE_OF`` / ``// mosaic:multiple-of``): the sizes of
    #: ``dim`` it handles are multiples of ``granule``, an int or the name of an int knob. The numerics gate's
    #: unseen shapes (:mod:`mosaic.gate`) stay inside them; every other dimension takes any size, odd ones too.
    multiple_of: tuple = attrs.field(default=(), converter=lambda v: tuple((str(d), g) for d, g in
                                                                           (v.items() if isinstance(v, Mapping) else v)))

    @property
    def name(self) -> str:
        return Path(self.path).name

    def knob(self, name: str) -> Knob | None:
        return next((k for k in self.knobs if k.name == name), None)

    def knob_values(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """Every knob's value: the defaults with ``overrides`` (``--knob k=v``) applied and typed; an
        unknown name is one error line naming the known ones."""
        unknown = sorted(set(overrides) - {k.name for k in self.knobs})
        if unknown:
            known = ", ".join(k.name for k in self.knobs) or "none"
            raise BadInput(f"unknown knob(s) {', '.join(unknown)} for {self.name} (class {self.knob_class}); "
                           f"known: {known}", "--knob")
        return {k.name: (k.parse(overrides[k.name]) if k.name in overrides else k.default) for k in self.knobs}

    def granules(self, overrides: Mapping[str, Any] | None = None) -> dict[str, int]:
        """``dim -> granule`` of :attr:`multiple_of` with knob names resolved to the knobs' values."""
        values = self.knob_values(overrides or {})
        return {d: int(values[g]) if isinstance(g, str) else int(g) for d, g in self.multiple_of}

    def check_family(self, dims: tuple, optional: Mapping | tuple = ()) -> None:
        """Every operand dimension must be one of the family's (``dims`` and its optional dims)."""
        known = (*dims, *optional)
        for op in (*self.inputs, *self.outputs):
            bad = [d for d in op.dims if d not in known]
            if bad:
                raise BadInput(f"{self.name}: operand {op.text()} names dimension(s) {', '.join(bad)} the "
                               f"family does not have; its dimensions: {', '.join(known)}", self.path)

    def to_json(self, with_source: bool = False) -> dict:
        d = {"path": self.path, "syntax": self.syntax, "entry": self.entry, "sha256": self.sha256,
             "inputs": [attrs.asdict(o) for o in self.inputs], "outputs": [attrs.asdict(o) for o in self.outputs],
             "knob_class": self.knob_class, "knobs": [attrs.asdict(k) for k in self.knobs]}
        for o in (*d["inputs"], *d["outputs"]):
            o["dims"] = list(o["dims"])
        if self.multiple_of:
            d["multiple_of"] = dict(self.multiple_of)
        if with_source:
            d["source"] = self.source
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> KernelFile:
        return cls(path=d["path"], syntax=d["syntax"], entry=d["entry"], inputs=d["inputs"], outputs=d["outputs"],
                   knob_class=d["knob_class"], knobs=d["knobs"], sha256=d.get("sha256", ""),
                   source=d.get("source", ""), multiple_of=d.get("multiple_of") or ())


# -- reading the contract (no code of the file runs) ------------------------------------------------

def read_kernel_file(path: str | os.PathLike) -> KernelFile:
    """Read a kernel file's contract; a file that breaks it is one :class:`BadInput` line naming the file."""
    p = Path(path)
    where = str(path)
    if not p.is_file():
        raise BadInput("kernel file not found (or not a regular file)", where)
    syntax = SYNTAXES.get(p.suffix.lower())
    if syntax is None:
        raise BadInput(f"kernel file suffix '{p.suffix}' unknown; known: {', '.join(SYNTAXES)}", where)
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise BadInput(f"kernel file is {size} bytes, more than {MAX_FILE_BYTES}", where)
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"kernel file is not UTF-8 text (byte {exc.start})", where) from None
    if "\x00" in text:
        raise BadInput("kernel file holds a NUL byte (binary?)", where)
    read = _read_cxx if syntax == "c++" else _read_python
    entry, inputs, outputs, knob_class, knobs, multiple_of = read(text, where)
    if not inputs or not outputs:
        raise BadInput("the contract needs at least one input and one output", where)
    names = [o.name for o in (*inputs, *outputs)]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BadInput(f"operand name(s) {', '.join(dup)} appear more than once", where)
    _check_multiple_of(multiple_of, {d for o in (*inputs, *outputs) for d in o.dims}, knobs, where)
    return KernelFile(path=str(p.resolve()), syntax=syntax, entry=entry, inputs=inputs, outputs=outputs,
                      knob_class=knob_class, knobs=knobs, sha256=hashlib.sha256(data).hexdigest(), source=text,
                      multiple_of=multiple_of)


MULTIPLE_OF_DIRECTIVE = "multiple-of"


def _check_multiple_of(pairs: tuple, dims: set, knobs: tuple, where: str) -> None:
    """Each declared granule names a dimension of the operands and is a positive int or an int knob's name."""
    int_knobs = {k.name for k in knobs if k.type == "int"}
    for dim, g in pairs:
        if dim not in dims:
            raise BadInput(f"MULTIPLE_OF names dimension '{dim}' that no operand has; the operands': "
                           f"{', '.join(sorted(dims))}", where)
        if isinstance(g, bool) or not (isinstance(g, int) and 1 <= g <= 2**20 or isinstance(g, str) and g in int_knobs):
            raise BadInput(f"MULTIPLE_OF['{dim}'] = {g!r}: a granule is an int in [1, 2^20] or the name of an int knob "
                           f"({', '.join(sorted(int_knobs)) or 'none'})", where)


def _cxx_multiple_of(value: str, where: str) -> tuple:
    """``// mosaic:multiple-of rows=block_rows cols=64`` -> (("rows", "block_rows"), ("cols", 64))."""
    out = []
    for item in value.split():
        dim, sep, g = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_]\w*", dim) or not re.fullmatch(r"\d+|[A-Za-z_]\w*", g):
            raise BadInput(f"mosaic:{MULTIPLE_OF_DIRECTIVE} item '{item}' is not dim=INT or dim=KNOB", where)
        out.append((dim, int(g) if g.isdigit() else g))
    return tuple(out)


def _operand_list(text: str, what: str, where: str) -> tuple:
    out = []
    for item in re.findall(r"[A-Za-z_]\w*\[[^\]]*\]|\S+", text):
        m = _OPERAND_RE.match(item.replace(" ", ""))
        if not m:
            raise BadInput(f"mosaic:{what} entry '{item}' is not name[dim,dim,...]", where)
        out.append(Operand(m.group(1), tuple(d.strip() for d in m.group(2).split(","))))
    return tuple(out)


def _blank_comments(text: str) -> str:
    """C++ text with comments and string contents replaced by spaces (same length: offsets stay)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [ch if ch == "\n" else " " for ch in text[i:j]]
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out[i + 1:j] = " " * max(0, j - i - 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


@attrs.frozen
class CxxKnobSite:
    """Where a knob's value sits in the C++ text (so a build can substitute another)."""

    name: str
    start: int
    end: int


def cxx_knob_sites(text: str, knob_class: str, where: str = "") -> tuple[list[Knob], list[CxxKnobSite]]:
    """The knobs of ``struct <knob_class> { static constexpr T name = literal; ... };`` and the spans of
    their values. Any other member makes the struct not frozen: one BadInput line."""
    clean = _blank_comments(text)
    m = re.search(rf"\b(?:struct|class)\s+{re.escape(knob_class)}\s*\{{", clean)
    if not m:
        raise BadInput(f"no 'struct {knob_class} {{ ... }};' knob class (the contract's frozen knobs)", where)
    depth, i = 1, m.end()
    while i < len(clean) and depth:
        depth += {"{": 1, "}": -1}.get(clean[i], 0)
        i += 1
    if depth:
        raise BadInput(f"struct {knob_class} is not closed", where)
    body_start, body_end = m.end(), i - 1
    knobs: list[Knob] = []
    sites: list[CxxKnobSite] = []
    member = re.compile(r"^\s*static\s+constexpr\s+([A-Za-z_][\w:]*)\s+([A-Za-z_]\w*)\s*=\s*(.*?)\s*$", re.S)
    pos = body_start
    for stmt in clean[body_start:body_end].split(";"):
        start, pos = pos, pos + len(stmt) + 1
        if not stmt.strip() or stmt.strip() in ("public:", "private:"):
            continue
        mm = member.match(stmt)
        line = clean.count("\n", 0, start + len(stmt) - len(stmt.lstrip())) + 1
        if not mm:
            raise BadInput(f"knob class {knob_class} is not frozen: line {line} '{' '.join(stmt.split())[:80]}' is "
                           "not 'static constexpr TYPE name = literal'", where)
        ctype, name, value = mm.group(1).split("::")[-1], mm.group(2), mm.group(3)
        kind = _CXX_TYPES.get(ctype)
        if kind is None:
            raise BadInput(f"knob '{name}' has type '{ctype}'; a C++ knob is one of {', '.join(sorted(_CXX_TYPES))}",
                           where)
        default = _cxx_literal(value, kind)
        if default is None:
            raise BadInput(f"knob '{name}' = '{value}' is not a {kind} literal", where)
        vstart = start + mm.start(3)
        knobs.append(Knob(name, kind, default))
        sites.append(CxxKnobSite(name, vstart, vstart + len(value)))
    return knobs, sites


def _cxx_literal(text: str, kind: str) -> Any:
    t = text.strip()
    if kind == "bool":
        return {"true": True, "false": False}.get(t)
    if kind == "int":
        t = re.sub(r"[uUlL]+$", "", t)
        try:
            return int(t, 0)
        except ValueError:
            return None
    try:
        return float(re.sub(r"[fF]$", "", t))
    except ValueError:
        return None


def cxx_value(value: Any, kind: str) -> str:
    """A knob value as a C++ literal."""
    if kind == "bool":
        return "true" if value else "false"
    if kind == "float":
        return repr(float(value))
    return str(int(value))


def substitute_cxx_knobs(kfile: KernelFile, values: Mapping[str, Any]) -> str:
    """The file's text with each knob's literal replaced by ``values[name]`` (what nvcc compiles)."""
    _, sites = cxx_knob_sites(kfile.source, kfile.knob_class, kfile.path)
    text = kfile.source
    for site in sorted(sites, key=lambda s: -s.start):
        knob = kfile.knob(site.name)
        text = text[:site.start] + cxx_value(values[site.name], knob.type) + text[site.end:]
    return text


def parse_nvcc_flags(value: str, where: str = "") -> tuple[str, ...]:
    """The flags of a ``// mosaic:nvcc-flags`` line, checked against :data:`NVCC_FLAGS` (the whitelist): any
    other word, or one option given twice, is one BadInput line. Nothing of the line is ever run."""
    flags, seen = [], {}
    for word in value.split():
        option = next((name for name, pattern in NVCC_FLAGS.items() if pattern.fullmatch(word)), None)
        if option is None:
            allowed = "-use_fast_math, -fmad=true|false, -ftz=true|false, -prec-div=true|false, -prec-sqrt=true|false"
            raise BadInput(f"mosaic:{NVCC_FLAGS_DIRECTIVE} flag '{word[:60]}' is not allowed; allowed: {allowed}",
                           where)
        if option in seen:
            raise BadInput(f"mosaic:{NVCC_FLAGS_DIRECTIVE} gives {option} twice ({seen[option]}, {word})", where)
        seen[option] = word
        flags.append(word)
    return tuple(flags)


def cxx_nvcc_flags(text: str, where: str = "") -> tuple[str, ...]:
    """The nvcc flags a C++ kernel file asks for (its ``// mosaic:nvcc-flags`` line; none without one)."""
    lines = [m.group(2) for m in _DIRECTIVE_RE.finditer(text) if m.group(1) == NVCC_FLAGS_DIRECTIVE]
    if len(lines) > 1:
        raise BadInput(f"contract line 'mosaic:{NVCC_FLAGS_DIRECTIVE}' appears twice", where)
    return parse_nvcc_flags(lines[0], where) if lines else ()


def _read_cxx(text: str, where: str):
    found: dict[str, str] = {}
    for m in _DIRECTIVE_RE.finditer(text):
        key, value = m.group(1), m.group(2)
        if key not in ("entry", "inputs", "outputs", "knobs", NVCC_FLAGS_DIRECTIVE, MULTIPLE_OF_DIRECTIVE):
            raise BadInput(f"unknown contract line 'mosaic:{key}'; known: entry, inputs, outputs, knobs, "
                           f"{NVCC_FLAGS_DIRECTIVE}, {MULTIPLE_OF_DIRECTIVE}", where)
        if key in found:
            raise BadInput(f"contract line 'mosaic:{key}' appears twice", where)
        found[key] = value
    parse_nvcc_flags(found.get(NVCC_FLAGS_DIRECTIVE, ""), where)
    for key in ("entry", "inputs", "outputs"):
        if key not in found:
            raise BadInput(f"no '// mosaic:{key} ...' line (the contract names entry, inputs and outputs)", where)
    entry = found["entry"]
    if not re.fullmatch(r"[A-Za-z_]\w*", entry):
        raise BadInput(f"mosaic:entry '{entry}' is not a C identifier", where)
    clean = _blank_comments(text)
    if not re.search(rf"__global__[^;{{]*\b{re.escape(entry)}\s*\(", clean):
        raise BadInput(f"entry point '{entry}' is not defined as a __global__ function", where)
    knob_class = found.get("knobs", "Knobs")
    if not re.fullmatch(r"[A-Za-z_]\w*", knob_class):
        raise BadInput(f"mosaic:knobs '{knob_class}' is not a C identifier", where)
    knobs, _ = cxx_knob_sites(text, knob_class, where)
    return (entry, _operand_list(found["inputs"], "inputs", where), _operand_list(found["outputs"], "outputs", where),
            knob_class, tuple(knobs), _cxx_multiple_of(found.get(MULTIPLE_OF_DIRECTIVE, ""), where))


def _literal(node: ast.AST, what: str, where: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise BadInput(f"{what} must be a literal (the contract is read without running the file)", where) from None


def _py_operands(value: Any, what: str, where: str) -> tuple:
    if not isinstance(value, dict) or not value:
        raise BadInput(f"{what} must be a dict of name -> tuple of dimension names, e.g. {{'x': ('rows', 'cols')}}",
                       where)
    out = []
    for name, dims in value.items():
        if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_]\w*", name)) or not isinstance(dims, tuple | list) \
                or not all(isinstance(d, str) and re.fullmatch(r"[A-Za-z_]\w*", d) for d in dims):
            raise BadInput(f"{what} entry {name!r}: {dims!r} is not name -> tuple of dimension names", where)
        out.append(Operand(name, tuple(dims)))
    return tuple(out)


_FROZEN_DECORATORS = {"attrs.frozen", "attr.frozen", "frozen", "attr.s", "attrs.define", "define",
                      "dataclasses.dataclass", "dataclass", "attr.attrs"}


def _decorator_is_frozen(dec: ast.AST) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    name = ast.unparse(target)
    if name not in _FROZEN_DECORATORS:
        return False
    if name in ("attrs.frozen", "attr.frozen", "frozen"):
        return True
    if isinstance(dec, ast.Call):
        return any(k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in dec.keywords)
    return False


def _read_python(text: str, where: str):
    try:
        tree = ast.parse(text, filename=where)
    except SyntaxError as exc:
        raise BadInput(f"syntax error at line {exc.lineno}: {exc.msg}", where) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise BadInput(f"cannot parse: {type(exc).__name__}", where) from None
    consts: dict[str, ast.AST] = {}
    defined: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    consts[t.id] = node.value
                    defined[t.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            consts[node.target.id] = node.value
            defined[node.target.id] = node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined[node.name] = node
    for key in ("ENTRY", "INPUTS", "OUTPUTS"):
        if key not in consts:
            raise BadInput(f"no module-level {key} = ... (the contract names ENTRY, INPUTS and OUTPUTS)", where)
    entry = _literal(consts["ENTRY"], "ENTRY", where)
    if not isinstance(entry, str) or not re.fullmatch(r"[A-Za-z_]\w*", entry):
        raise BadInput(f"ENTRY must be the name of a function in the file, got {entry!r}", where)
    if entry not in defined or not isinstance(defined[entry], ast.FunctionDef | ast.ClassDef | ast.Assign):
        raise BadInput(f"entry point '{entry}' is not defined at module level", where)
    knob_class = _literal(consts["KNOBS"], "KNOBS", where) if "KNOBS" in consts else "Knobs"
    if not isinstance(knob_class, str) or not re.fullmatch(r"[A-Za-z_]\w*", knob_class):
        raise BadInput(f"KNOBS must be the name of the knob class, got {knob_class!r}", where)
    cls = defined.get(knob_class)
    if not isinstance(cls, ast.ClassDef):
        raise BadInput(f"no knob class '{knob_class}' at module level (a frozen dataclass of the knobs)", where)
    if not any(_decorator_is_frozen(d) for d in cls.decorator_list):
        raise BadInput(f"knob class {knob_class} is not frozen: decorate it @dataclasses.dataclass(frozen=True) or "
                       "@attrs.frozen", where)
    knobs = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            kind = ast.unparse(node.annotation)
            if kind not in KNOB_TYPES:
                raise BadInput(f"knob '{node.target.id}' is annotated '{kind}'; a knob is one of "
                               f"{', '.join(KNOB_TYPES)}", where)
            if node.value is None:
                raise BadInput(f"knob '{node.target.id}' has no default (every knob needs one)", where)
            default = _literal(node.value, f"knob '{node.target.id}' default", where)
            knobs.append(Knob(node.target.id, kind, Knob(node.target.id, kind).parse(default)))
    multiple_of = _literal(consts["MULTIPLE_OF"], "MULTIPLE_OF", where) if "MULTIPLE_OF" in consts else {}
    if not isinstance(multiple_of, dict) or not all(isinstance(d, str) for d in multiple_of):
        raise BadInput("MULTIPLE_OF must be a dict of dimension name -> int or knob name", where)
    return (entry, _py_operands(_literal(consts["INPUTS"], "INPUTS", where), "INPUTS", where),
            _py_operands(_literal(consts["OUTPUTS"], "OUTPUTS", where), "OUTPUTS", where), knob_class, tuple(knobs),
            tuple(multiple_of.items()))


# -- the child: importing a Python kernel file happens here only -------------------------------------

def load_python_module(kfile: KernelFile, name: str = "mosaic_kernel_file"):
    """Import the file's checked text as a module (the capture's child process only) and check the
    contract against the live objects: the entry is callable, the knob class a frozen dataclass/attrs class."""
    import dataclasses
    import importlib.util

    current = Path(kfile.path).read_bytes()
    if hashlib.sha256(current).hexdigest() != kfile.sha256:
        raise BadInput("kernel file changed after it was read; run the command again", kfile.path)
    spec = importlib.util.spec_from_file_location(name, kfile.path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file: one line, not a traceback
        raise BadInput(f"importing the kernel file raised {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                       kfile.path) from None
    entry = getattr(module, kfile.entry, None)
    if not callable(entry):
        raise BadInput(f"entry point '{kfile.entry}' is not callable", kfile.path)
    cls = getattr(module, kfile.knob_class, None)
    frozen = (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen) or \
        (attrs.has(cls) and getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs")
    if not isinstance(cls, type) or not frozen:
        raise BadInput(f"knob class {kfile.knob_class} is not frozen", kfile.path)
    return module


def make_knobs(module, kfile: KernelFile, values: Mapping[str, Any]):
    """An instance of the file's knob class with ``values``; a value it refuses is one line."""
    cls = getattr(module, kfile.knob_class)
    try:
        return cls(**values)
    except Exception as exc:  # noqa: BLE001 - the user's class validates
        raise BadInput(f"knob class {kfile.knob_class} refused {values}: {exc}", kfile.path) from None


def failure(what: str, exc: BaseException, where: str):
    """The one-line :class:`~mosaic.backend.Unbuildable` for a user's kernel that a language's compiler or
    lowering refused: ``"<what>: <ExceptionType>: <first non-blank line of its message>"`` (at most 400
    characters of that line; the type alone when the message is empty). Raise it ``from None``."""
    from mosaic.backend import Unbuildable

    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return Unbuildable(f"{what}: {type(exc).__name__}" + (f": {first[:400]}" if first else ""), where)


class FileBackend:
    """What every language's backend for one kernel file shares (the plugins subclass it): the knobs are the
    file's own class, and ``check`` (in the child) holds the file's operands to the family's dimensions and
    its knob values to its knob class's types."""

    def __init__(self, kfile: KernelFile):
        self.kfile = kfile

    def knobs(self, family: str) -> type:
        raise BadInput("a kernel file's knobs are its own class (mosaic.kernel_files)", "--knob")

    def check_family(self, spec) -> None:
        """Every operand dimension is one of ``spec.family``'s (an unknown family: one line)."""
        from mosaic.families import get

        fam = get(spec.family)
        if fam is None:
            raise BadInput(f"no family '{spec.family}'", "--family")
        self.kfile.check_family(tuple(fam.dims), fam.optional_dims)

    def check(self, spec) -> None:
        self.check_family(spec)
        self.kfile.knob_values(spec.knobs)


class PythonFileBackend(FileBackend):
    """A file backend for a Python kernel file: the file is imported (once, in the child) as
    :attr:`module_name`, and ``check`` also builds the file's own knob instance from the spec's knobs."""

    module_name = "mosaic_kernel_file"

    def __init__(self, kfile: KernelFile):
        super().__init__(kfile)
        self._module = None

    def module(self):
        if self._module is None:
            self._module = load_python_module(self.kfile, self.module_name)
        return self._module

    def knob_instance(self, spec):
        """The file's knob class instantiated with the spec's knobs over its defaults."""
        return make_knobs(self.module(), self.kfile, self.kfile.knob_values(spec.knobs))

    def check(self, spec) -> None:
        self.check_family(spec)
        self.knob_instance(spec)


def file_backend(kfile: KernelFile, language: str):
    """The language backend's object for this one file (``backend.kernel_file(kfile)``)."""
    from mosaic.plugins import host

    lang = host().get("languages", language)
    make = getattr(lang.backend, "kernel_file", None)
    if make is None:
        raise BadInput(f"language '{language}' builds no kernel files (its backend has no kernel_file())", "--lang")
    return make(kfile)


def check_language(kfile: KernelFile, language: str) -> None:
    """In the parent: the language reads files of this syntax (``kernel_file_syntax`` on its backend)."""
    from mosaic.plugins import host

    lang = host().get("languages", language)
    syntax = getattr(lang.backend, "kernel_file_syntax", None)
    if syntax is None:
        raise BadInput(f"language '{language}' builds no kernel files", "--lang")
    if syntax != kfile.syntax:
        raise BadInput(f"language '{language}' builds {syntax} kernel files; {kfile.name} is {kfile.syntax}", "--file")


def capture_file(kfile: KernelFile, spec, gpu_name: str, out: str | os.PathLike, opts=None,
                 ignored_knobs: list[str] | tuple = (), extra: Mapping | None = None,
                 prefix: tuple[str, ...] | list[str] = ()):
    """Capture a kernel file like :func:`mosaic.capture.capture`, in a child process with a timeout
    (``python -m mosaic.kernel_files REQUEST.json``). A file the child finds broken (its import raises, its
    entry or knob class is not what the contract says) is ``bad-file`` with one message and no bundle.
    ``extra``: more top-level manifest keys (a campaign's reference metadata). ``prefix``: a command the
    child runs under (``mosaic.profile``'s ``ncu ...``)."""
    from mosaic.capture import CaptureOptions, run_child

    opts = opts or CaptureOptions()
    out = Path(out)
    # the manifest names the file, not where it lay on this machine (the bundle holds the file itself)
    extra = {**dict(extra or {}),
             "kernel_file": {**kfile.to_json(), "path": kfile.name, "knob_values": dict(spec.knobs)}}
    if ignored_knobs:  # a source candidate's spec named knobs its file's class has not
        extra["kernel_file"]["ignored_knobs"] = list(ignored_knobs)
    with tempfile.TemporaryDirectory(prefix="mosaic-kfile-req-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps({"spec": spec.to_json(), "gpu": gpu_name, "out": str(out.resolve()),
                                   "options": attrs.asdict(opts), "result": str(res), "extra": extra,
                                   "kernel_file": kfile.to_json(with_source=True)}))
        return run_child([*prefix, sys.executable, "-m", "mosaic.kernel_files", str(req)], res, spec, gpu_name,
                         out, opts, extra)


# -- a campaign's files: the reference and the start kernel of `mosaic run --reference/--start` ------

#: the language of a Python kernel file, by the top-level package it imports (the first that matches an
#: installed language reading Python files); C++ files go to the one installed language that reads them
PYTHON_IMPORTS = (("cutlass", "cute"), ("jax", "pallas"))


def file_language(kfile: KernelFile, flag: str = "--reference") -> str:
    """The installed language that builds this file: the only one reading its syntax, or for Python the one
    its imports name (:data:`PYTHON_IMPORTS`); else one line asking for the language."""
    from mosaic.plugins import host

    readers = sorted(name for name, lang in host().items("languages").items()
                     if getattr(lang.backend, "kernel_file_syntax", None) == kfile.syntax)
    if not readers:
        raise BadInput(f"no installed language builds {kfile.syntax} kernel files like {kfile.name}", flag)
    if len(readers) == 1:
        return readers[0]
    imported = set()
    for node in ast.parse(kfile.source).body:
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    named = [lang for package, lang in PYTHON_IMPORTS if package in imported and lang in readers]
    if len(named) != 1:
        raise BadInput(f"cannot tell which of {', '.join(readers)} {kfile.name} is written in "
                       f"({'it imports ' + ', '.join(sorted(imported)) if imported else 'it imports nothing'}): "
                       "name it with --source / --target", flag)
    return named[0]


def check_campaign_file(path: str | os.PathLike, language: str, family: str, flag: str) -> KernelFile:
    """A campaign's reference or start file: its contract read, built by ``language``, shaped for ``family``."""
    from mosaic.families import get

    kfile = read_kernel_file(path)
    try:
        check_language(kfile, language)
    except BadInput as exc:
        raise BadInput(exc.what, flag) from None
    fam = get(family)
    if fam is not None:
        kfile.check_family(tuple(fam.dims), fam.optional_dims)
    return kfile


def knob_class(kfile: KernelFile) -> type:
    """The file's knob class as a frozen attrs class built from its contract (never by importing the file):
    each field's default the file's literal, a value typed and checked by the knob's type. The loop and the
    proposers take it where a template language gives its own knob class."""
    def typed(knob: Knob):
        def convert(value):
            if isinstance(value, str) and knob.type != "str":  # a value is typed already: no text parsing here
                raise ValueError(f"knob '{knob.name}' of {kfile.name} is a {knob.type}; got {value!r}")
            try:
                return knob.parse(value)
            except BadInput as exc:
                raise ValueError(f"{exc.what} ({kfile.name})") from None
        return convert

    fields = {k.name: attrs.field(default=k.default, converter=typed(k)) for k in kfile.knobs}
    return attrs.make_class(kfile.knob_class, fields, frozen=True)


# -- source-level candidates: a proposer's edited file text, built like the file it edits -------------

DEFAULT_NAMES = {"c++": "kernel.cu", "python": "kernel.py"}


def _source_name(spec) -> str:
    """The candidate's file name: ``spec.name`` when it is one, else ``kernel.cu`` / ``kernel.py`` after the
    syntax its language builds."""
    name = spec.name
    if not name:
        from mosaic.plugins import host

        syntax = getattr(host().get("languages", spec.language).backend, "kernel_file_syntax", None)
        if syntax is None:
            raise BadInput(f"language '{spec.language}' builds no kernel files", "source")
        return DEFAULT_NAMES[syntax]
    if Path(name).name != name or Path(name).suffix.lower() not in SYNTAXES:
        raise BadInput(f"a source candidate's spec.name must be the kernel file's name (e.g. rmsnorm.cu), got "
                       f"{name!r}", "spec.name")
    return name


def source_knobs(spec, kfile: KernelFile) -> tuple[dict[str, Any], list[str]]:
    """The knob values a source candidate builds with: the spec's knobs that the file's knob class has (typed,
    over its defaults), and the names of those it has not (a knob-set of another kernel: recorded, not used)."""
    known = {k: v for k, v in spec.knobs.items() if kfile.knob(k) is not None}
    return kfile.knob_values(known), sorted(set(spec.knobs) - set(known))


def write_source(spec, source: str, directory: str | os.PathLike) -> KernelFile:
    """Write a candidate's source text as ``directory/<spec.name>`` and read its contract (BadInput: one line)."""
    if not isinstance(source, str) or len(source.encode()) > MAX_FILE_BYTES:
        raise BadInput(f"a source candidate must be text of at most {MAX_FILE_BYTES} bytes", "source")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / _source_name(spec)
    path.write_text(source)
    return read_kernel_file(path)


def lower_source(spec, source: str, gpu_name: str, out: str | os.PathLike, opts=None):
    """Lower a source candidate (``spec.name`` is its file name, else ``kernel.cu``/``kernel.py`` after its
    language; ``source`` the whole file; the spec's knobs its class has are applied) into the bundle
    ``out``, in a child process, as ``mosaic capture --file --lower-only`` would. A text that breaks the
    contract, fails to import or to compile is ``unbuildable`` with one line, and the bundle records it
    with the text -- a candidate, not an error of the caller."""
    from mosaic.bundle import save_bundle
    from mosaic.capture import CaptureOptions, CaptureResult

    opts = opts or CaptureOptions(lower_only=True)
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="mosaic-source-") as tmp:
        try:
            kfile = write_source(spec, source, tmp)
            check_language(kfile, spec.language)
            values, ignored = source_knobs(spec, kfile)
        except BadInput as exc:
            reason = exc.line()
        else:
            result = capture_file(kfile, attrs.evolve(spec, knobs=values), gpu_name, out, attrs.evolve(opts),
                                  ignored_knobs=ignored)
            if result.status != "bad-file":
                return result
            reason = result.message
    try:
        name = _source_name(spec)
    except BadInput:
        name = "edited.txt"
    save_bundle(out, kernel=spec, language=spec.language, overwrite=True, gpu=gpu_name,
                files={f"source/{name}": ("source", source), "capture.log": ("log", f"unbuildable: {reason}\n")},
                extra={"capture": {"status": "unbuildable", "lower_only": opts.lower_only,
                                   "options": attrs.asdict(opts), "summary": {"error": reason}}})
    return CaptureResult("unbuildable", out, reason, {"error": reason})


def captured_file_source(bundle) -> str | None:
    """The text of the kernel file a bundle was captured from (the bundle's own copy, ``source/<name>``), or
    None for a bundle of a language's own kernel. A timing session rebuilds a file reference from it."""
    section = bundle.manifest.get("kernel_file")
    if not section:
        return None
    for path in bundle.find("source"):
        if path.name == section.get("path"):
            return path.read_text()
    raise BadInput(f"the bundle records kernel file {section.get('path')!r} but holds no copy of it",
                   str(bundle.root))


def prepare_source(spec, source: str, gpu, workdir: str | os.PathLike, inputs: Mapping[str, Any]):
    """In a GPU child: the Runnable of a source candidate (its language's file backend's ``prepare``)."""
    kfile = write_source(spec, source, Path(workdir) / "source")
    values, _ = source_knobs(spec, kfile)
    spec = attrs.evolve(spec, knobs=values)
    backend = file_backend(kfile, spec.language)
    backend.check(spec)
    return backend.prepare(spec, gpu, Path(workdir), dict(inputs))


def _child(request_path: str) -> int:
    from mosaic.capture import CaptureOptions, capture_in_process
    from mosaic.records import KernelSpec

    req = json.loads(Path(request_path).read_text())
    spec = KernelSpec.from_json(req["spec"])
    opts = CaptureOptions(**req["options"])
    kfile = KernelFile.from_json(req["kernel_file"])
    try:
        backend = file_backend(kfile, spec.language)
        backend.check(spec)  # imports a Python file here, in the child; BadInput on a broken contract
    except BadInput as exc:
        Path(req["result"]).write_text(json.dumps({"status": "bad-file", "bundle": None, "message": exc.line(),
                                                   "summary": {"error": exc.line()}}))
        return 0
    result = capture_in_process(spec, req["gpu"], Path(req["out"]), opts, extra=req.get("extra"), backend=backend)
    if result.bundle is not None:
        _keep_source(result.bundle, kfile)
    Path(req["result"]).write_text(json.dumps(result.to_json()))
    return 0


def _keep_source(root: Path, kfile: KernelFile) -> None:
    """A build that failed before lowering returned its source still keeps the file in its bundle."""
    from mosaic.bundle import load_bundle, save_bundle

    reserved = ("format", "schema_version", "created", "kernel", "language", "gpu", "toolchain", "files")
    b = load_bundle(root)
    if b.find("source"):
        return
    files = {f.path: (f.role, b.member(f.path)) for f in b.files}
    files[f"source/{kfile.name}"] = ("source", kfile.source)
    save_bundle(root, kernel=b.kernel, language=b.language, files=files, gpu=b.gpu,
                toolchain=b.manifest.get("toolchain") or {}, overwrite=True,
                extra={k: v for k, v in b.manifest.items() if k not in reserved})


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
