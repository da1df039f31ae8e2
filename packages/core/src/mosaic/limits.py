"""Resource limits on everything read from a user's files, as data, and the readers that enforce them.

Every file that ``mosaic`` reads on a user's behalf (bundles, campaign directories, PTX/SASS listings,
``.npz`` arrays, JSON records, TOML campaigns) goes through these readers, so a hostile or broken input
is refused with one line before it costs memory or time: a device file or FIFO is never read, a file
larger than its limit is never read whole, a JSON document nested deeper than its limit or holding an
integer longer than its limit is refused, and an ``.npz`` array's element count is read from its
``.npy`` header before a byte of data is loaded.

A limit can be raised for one run with an environment variable ``MOSAIC_LIMIT_<NAME>`` (for example
``MOSAIC_LIMIT_ARRAY_ELEMENTS=300000000`` for a 16384² GEMM), which is what an expert with a larger
shape needs; it is never raised silently.
"""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from typing import Any

import attrs

from mosaic.errors import BadInput


@attrs.frozen
class Limit:
    """One resource limit: its name, its value and what it bounds."""

    name: str
    value: int
    unit: str
    what: str

    @property
    def env(self) -> str:
        return f"MOSAIC_LIMIT_{self.name.upper()}"


LIMITS: dict[str, Limit] = {lim.name: lim for lim in (
    Limit("text_bytes", 512 * 2**20, "bytes", "one PTX/SASS listing, log or other text file"),
    Limit("json_bytes", 64 * 2**20, "bytes", "one JSON record (manifest, launch record, journal line, config)"),
    Limit("toml_bytes", 4 * 2**20, "bytes", "one TOML file (a campaign, a schedule config)"),
    Limit("npz_bytes", 8 * 2**30, "bytes", "one .npz archive"),
    Limit("array_elements", 2**27, "elements", "one array in an .npz (2**27 = a 8192x16384 matrix)"),
    Limit("nesting_depth", 64, "levels", "the nesting of a JSON or TOML document"),
    Limit("int_digits", 40, "digits", "one integer in a JSON or TOML document"),
    Limit("schedule_tasks", 2_000_000, "tasks", "one AMK schedule"),
)}


def limit(name: str) -> int:
    """The value of limit ``name``, raised by ``MOSAIC_LIMIT_<NAME>`` when that is set to a positive integer."""
    lim = LIMITS[name]
    raw = os.environ.get(lim.env)
    if raw is None:
        return lim.value
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{lim.env}={raw!r} is not an integer", lim.env) from None
    if value <= 0:
        raise BadInput(f"{lim.env}={raw!r} must be positive", lim.env)
    return value


def refuse(name: str, actual: int, where: str) -> BadInput:
    """The one-line refusal for ``actual`` over limit ``name``."""
    lim = LIMITS[name]
    return BadInput(f"{actual:,} {lim.unit} is over the limit of {limit(name):,} {lim.unit} for {lim.what} "
                    f"(raise it with {lim.env})", where)


def regular_file(path: str | os.PathLike, where: str | None = None) -> os.stat_result:
    """``os.stat`` of ``path`` after checking it is a regular file (never a device, FIFO or socket)."""
    where = where or str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadInput("no such file", where) from None
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", where) from None
    if stat.S_ISDIR(st.st_mode):
        raise BadInput("is a directory, not a file", where)
    if not stat.S_ISREG(st.st_mode):
        raise BadInput("not a regular file (a device, FIFO or socket is never read)", where)
    return st


def read_bytes(path: str | os.PathLike, name: str = "text_bytes", where: str | None = None) -> bytes:
    """The bytes of a regular file no larger than limit ``name``."""
    where = where or str(path)
    st = regular_file(path, where)
    cap = limit(name)
    if st.st_size > cap:
        raise refuse(name, st.st_size, where)
    with open(path, "rb") as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:  # it grew while we read it
        raise refuse(name, len(data), where)
    return data


def read_text(path: str | os.PathLike, name: str = "text_bytes", where: str | None = None,
              errors: str = "replace") -> str:
    return read_bytes(path, name, where).decode("utf-8", errors=errors)


def _nesting_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text, strings skipped; linear in its length."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif ch in "]}":
            depth -= 1
    return deepest


def loads_json(text: str, where: str) -> Any:
    """Parse JSON with the nesting-depth and integer-length limits; BadInput naming ``where`` otherwise."""
    depth_cap, digits_cap = limit("nesting_depth"), limit("int_digits")
    if len(text) > limit("json_bytes"):
        raise refuse("json_bytes", len(text), where)
    depth = _nesting_depth(text)
    if depth > depth_cap:
        raise refuse("nesting_depth", depth, where)

    def bounded_int(s: str) -> int:
        if len(s.lstrip("-")) > digits_cap:
            raise refuse("int_digits", len(s.lstrip("-")), where)
        return int(s)

    def no_constant(name: str):
        raise BadInput(f"not valid JSON: {name} is not a JSON value", where)

    try:
        return json.loads(text, parse_int=bounded_int, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise BadInput(f"not valid JSON: {exc}", where) from None
    except RecursionError:
        raise refuse("nesting_depth", depth, where) from None


def read_json(path: str | os.PathLike, where: str | None = None) -> Any:
    """A JSON file read through the limits: a regular file, bounded size, depth and integers."""
    where = where or str(path)
    data = read_bytes(path, "json_bytes", where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("not valid JSON: not UTF-8 text", where) from None
    return loads_json(text, where)


def check_tree(value: Any, where: str) -> None:
    """Refuse a parsed document (TOML) nested deeper than the limit or holding an over-long integer."""
    cap, digits = limit("nesting_depth"), limit("int_digits")
    deepest, stack = 0, [(value, 0)]
    while stack:  # iterative: a hostile depth cannot exhaust Python's stack here
        v, depth = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, depth)
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10 ** digits:
            raise refuse("int_digits", len(str(abs(v))), where)
    if deepest > cap:
        raise refuse("nesting_depth", deepest, where)


def _npy_header(fh) -> tuple[tuple[int, ...], Any]:
    import numpy as np
    from numpy.lib import format as npformat

    version = npformat.read_magic(fh)
    if version == (1, 0):
        shape, _fortran, dtype = npformat.read_array_header_1_0(fh)
    elif version in ((2, 0), (3, 0)):
        shape, _fortran, dtype = npformat.read_array_header_2_0(fh)
    else:  # pragma: no cover - numpy refuses unknown versions in read_magic
        raise ValueError(f"unknown .npy version {version}")
    return tuple(int(d) for d in shape), np.dtype(dtype)


def load_npz(path: str | os.PathLike, what: str, where: str | None = None) -> dict:
    """The named arrays of an ``.npz``, each header checked (no object dtype, bounded elements) before loading.

    Nothing is unpickled. A single ``.npy`` renamed ``.npz``, a truncated archive, a header claiming a huge
    shape and an array of Python objects are each refused with one line.
    """
    import numpy as np

    where = where or str(path)
    st = regular_file(path, where)
    if st.st_size > limit("npz_bytes"):
        raise refuse("npz_bytes", st.st_size, where)
    cap = limit("array_elements")
    try:
        with open(path, "rb") as raw:
            head = raw.read(6)
            if head.startswith(b"\x93NUMPY"):
                raise BadInput(f"{what} is a single .npy array, not an .npz archive of named arrays", where)
            raw.seek(0)
            with zipfile.ZipFile(raw) as zf:
                names = [n for n in zf.namelist() if n.endswith(".npy")]
                if not names:
                    raise BadInput(f"{what} holds no arrays (.npy members)", where)
                out = {}
                for member in names:
                    key = member[:-4]
                    with zf.open(member) as fh:
                        shape, dtype = _npy_header(fh)
                        if dtype.hasobject:
                            raise BadInput(f"{what} array {key!r} holds Python objects: not readable without pickle, and nothing is unpickled", where)
                        if dtype.fields is not None or dtype.subdtype is not None:
                            # a structured or subarray element hides its size from the shape (a 1M-element
                            # subarray per element: 3.2 MB of file became 3.35 GB of memory); kernel arrays are
                            # plain numbers
                            raise BadInput(f"{what} array {key!r} has a structured dtype ({dtype.str}): kernel arrays "
                                           "hold plain numbers", where)
                        n = 1
                        for d in shape:
                            n *= d
                        if n > cap:
                            raise refuse("array_elements", n, f"{where}: {key}")
                    with zf.open(member) as fh:
                        out[key] = np.lib.format.read_array(io.BufferedReader(fh), allow_pickle=False)
                return out
    except BadInput:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise BadInput(f"{what} is not a readable .npz without pickle: {exc}", where) from None
