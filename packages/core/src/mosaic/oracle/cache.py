"""A campaign's float64 reference, computed once and read back after its key is verified.

Every numerics gate of a campaign runs its kernel on the same seeded inputs, so the oracle's float64
reference (the expected values, the guard band, and where it applies the bit-exact mask and values) is the
same for all of them; for a 4096^3 GEMM it costs seconds of CPU per gate. ``ReferenceCache(root)`` keeps it:

* **key**: family, input format, output format, the reference function (module, name and the SHA-256 of
  its module's source, so an edited oracle never reads an old reference) and, per input array, its name,
  shape, dtype and the SHA-256 of its bytes (the epilogue's ``scale``/``bias`` are inputs, so they are in
  it). The inputs in hand are hashed on every call: nothing is trusted from a name or a seed.
* **on disk**: ``root/<family>-<dtype>-<out dtype>-<input shapes>-<epilogue>/`` holds ``key.json`` and one
  ``.npy`` per array. An entry is read only when its ``key.json`` equals the key computed now; a mismatch
  (other inputs, another oracle) or an unreadable entry recomputes and replaces it (written to a temporary
  directory, then renamed).
* **in the user cache** (:mod:`mosaic.user_cache`; the live workbench's root is ``$MOSAIC_CACHE_DIR/oracle``):
  a hit marks its entry used, and a new entry trims the user cache to its cap (``MOSAIC_CACHE_MAX``, least
  recently used entry first; never the entry just written). These references are the cache's big entries:
  2 GiB at 16384 x 8192.
* **in memory**: the last reference, for a process that gates several kernels (the live workbench's
  persistent worker), under the same full key.

The reference is computed by the family's own function, in float64 on the CPU, as without a cache.
``last`` records how the latest one was obtained (``computed`` | ``cache-file`` | ``cache-memory``, with the
key, the seconds and, for a recompute, why); the capture writes it into the gate's bundle.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from mosaic import user_cache
from mosaic.oracle.formats import Format, fmt
from mosaic.oracle.verdict import Expectation

KEY_FORMAT = "mosaic-oracle-reference"
_ARRAYS = ("expected", "tolerance", "exact", "exact_value")


def _source_sha(fn) -> str:
    try:
        return hashlib.sha256(Path(inspect.getfile(fn)).read_bytes()).hexdigest()
    except (TypeError, OSError):
        return "unknown"


def reference_key(family: str, reference, inputs: Mapping[str, np.ndarray], in_fmt: Format, out_fmt: Format) -> dict:
    """The full key of a reference: what it was computed from (hashes the inputs' bytes)."""
    fn = getattr(reference, "reference", reference)  # core's Family wraps the module function
    arrays = {}
    for name in sorted(inputs):
        a = np.ascontiguousarray(inputs[name])
        arrays[name] = {"shape": list(a.shape), "dtype": str(a.dtype), "sha256": hashlib.sha256(a.tobytes()).hexdigest()}
    return {"format": KEY_FORMAT, "version": 1, "family": family, "dtype": in_fmt.name, "out_dtype": out_fmt.name,
            "reference": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}",
            "reference_source_sha256": _source_sha(fn), "formula": getattr(reference, "formula", ""),
            "inputs": arrays}


def entry_name(key: Mapping) -> str:
    """The entry's directory: family, formats, input shapes and epilogue (the optional inputs present)."""
    shapes = "_".join(f"{n}{'x'.join(str(d) for d in v['shape']) or 'scalar'}" for n, v in key["inputs"].items())
    epilogue = "+".join(n for n in key["inputs"] if n in ("scale", "bias")) or "plain"
    return f"{key['family']}-{key['dtype']}-{key['out_dtype']}-{shapes}-{epilogue}"


class ReferenceCache:
    """See the module docstring. ``root=None``: memory only."""

    def __init__(self, root: str | os.PathLike | None):
        self.root = Path(root) if root is not None else None
        if self.root is not None:
            user_cache.cache_cap()  # a bad MOSAIC_CACHE_MAX: one line now, not after a reference was computed
        self._memory: tuple[dict, dict[str, Expectation]] | None = None
        self.last: dict | None = None

    def expectations(self, family: str, reference: Callable, inputs: Mapping[str, np.ndarray], in_fmt: Format,
                     out_fmt: Format, validate: Callable[[], None] | None = None) -> dict[str, Expectation]:
        """The reference for these inputs; ``validate()`` (the oracle's input checks) runs before computing
        one, never on a hit: an entry is stored only after it passed on the very bytes its key hashes."""
        t0 = time.monotonic()
        key = reference_key(family, reference, inputs, in_fmt, out_fmt)
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        where = self.root / entry_name(key) if self.root is not None else None
        note = {"key_sha256": digest, "entry": str(where) if where else None}
        if self._memory is not None and self._memory[0] == key:
            self.last = {"source": "cache-memory", **note, "seconds": round(time.monotonic() - t0, 3)}
            return self._memory[1]
        why = "no cache directory"
        if where is not None:
            got, why = self._read(where, key)
            if got is not None:
                user_cache.touch(where)
                self._memory = (key, got)
                self.last = {"source": "cache-file", **note, "seconds": round(time.monotonic() - t0, 3)}
                return got
        if validate is not None:
            validate()
        t1 = time.monotonic()
        got = reference(dict(inputs), in_fmt, out_fmt)
        computed_s = time.monotonic() - t1
        stored = self._write(where, key, got) if where is not None else "not stored (no cache directory)"
        self._memory = (key, got)
        self.last = {"source": "computed", **note, "why": why, "stored": stored,
                     "compute_seconds": round(computed_s, 3), "seconds": round(time.monotonic() - t0, 3)}
        return got

    # -- disk -------------------------------------------------------------------------------------------------
    @staticmethod
    def _read(where: Path, key: dict) -> tuple[dict[str, Expectation] | None, str]:
        meta_path = where / "key.json"
        if not meta_path.is_file():
            return None, "no entry"
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return None, f"unreadable key.json ({exc})"
        if meta.get("key") != key:
            old = meta.get("key") or {}
            diff = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k))
            return None, f"key mismatch ({', '.join(diff) or 'key'} differ)"
        out: dict[str, Expectation] = {}
        try:
            for name, entry in meta["outputs"].items():
                arrays = {a: (np.load(where / f"{name}.{a}.npy", allow_pickle=False) if a in entry["arrays"] else None)
                          for a in _ARRAYS}
                if arrays["expected"].shape != tuple(entry["shape"]) or arrays["tolerance"].shape != tuple(entry["shape"]):
                    return None, f"entry arrays of '{name}' do not have the recorded shape"
                out[name] = Expectation(arrays["expected"], arrays["tolerance"], fmt(entry["out_format"]),
                                        entry["formula"], arrays["exact"], arrays["exact_value"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"unreadable entry ({type(exc).__name__}: {exc})"
        return out, ""

    @staticmethod
    def _write(where: Path, key: dict, got: Mapping[str, Expectation]) -> str:
        try:  # an unwritable cache root (no home directory) leaves the reference in memory only
            where.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=where.parent))
        except OSError as exc:
            return f"not stored ({exc})"
        try:
            outputs = {}
            for name, e in got.items():
                present = [a for a in _ARRAYS if getattr(e, a) is not None]
                for a in present:
                    np.save(tmp / f"{name}.{a}.npy", np.asarray(getattr(e, a)), allow_pickle=False)
                outputs[name] = {"arrays": present, "shape": list(np.shape(e.expected)),
                                 "out_format": e.out_format.name, "formula": e.formula}
            (tmp / "key.json").write_text(json.dumps({"key": key, "outputs": outputs}, indent=1))
            if where.exists():
                shutil.rmtree(where)
            os.replace(tmp, where)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            return f"not stored ({exc})"
        pruned = user_cache.after_write(where)
        if pruned is not None and pruned.removed:
            return (f"stored; the user cache was trimmed to its cap: {len(pruned.removed)} least recently used "
                    f"entries removed ({user_cache.human(pruned.freed)})")
        return "stored"
