"""A campaign's float64 reference, computed once and read back after its key is verified.

Every numerics gate of a campaign runs its kernel on the same seeded inputs, so the oracle's float64
reference (the expected values, the guard band, and where it applies the bit-exact mask and values) is the
same for all of them; for a 4096^3 GEMM it costs seconds of CPU per gate. ``ReferenceCache(root)`` keeps it:

* **key**: family, input format, output format, the reference function (module, name and the SHA-256 of
  its module's source, so an edited oracle never reads an old reference) and, per input array, its name,
  shape, dtype and the SHA-256 of its bytes (the epilogue's ``scale``/``bias`` are inputs, so they are in
  it). The inputs in hand are hashed on every call: nothing is trusted from a name or a seed.
* **on disk**: ``root/<family>-<dtype>-<out dtype>-<input shapes>-<epilogue>/`` holds ``key.json``, one
  ``.npy`` per array and the manifest of :mod:`mosaic.cache_integrity` (the SHA-256 of each file, for the
  SHA-256 of the key). An entry is read only when its ``key.json`` equals the key computed now and every file
  still hashes to the manifest; a mismatch (other inputs, another oracle) or an unreadable entry recomputes
  and replaces it (written to a temporary directory, sealed, then renamed). A changed entry (a poisoned
  ``expected`` array) is never believed: one warning line names the file, the entry is discarded and the
  reference computed again. ``root`` is made with mode 0700; a root that is a link, another user's or
  writable by group or others is refused (one warning line): the reference is then computed and kept in
  memory only.
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

from mosaic import cache_integrity, user_cache
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
        self._refused = ""  # the refusal last warned about: one line, not one per gate
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
        why, unusable = "no cache directory", "no cache directory"
        if where is not None:
            unusable = self._usable_root()
            got, why = self._read(where, key, digest) if not unusable else (None, unusable)
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
        stored = self._write(where, key, digest, got) if not unusable else f"not stored ({unusable})"
        self._memory = (key, got)
        self.last = {"source": "computed", **note, "why": why, "stored": stored,
                     "compute_seconds": round(computed_s, 3), "seconds": round(time.monotonic() - t0, 3)}
        return got

    # -- disk -------------------------------------------------------------------------------------------------
    def _usable_root(self) -> str:
        """'' when the root is (made) a private directory; else why nothing is read or stored there."""
        try:
            refused = cache_integrity.private_dir(self.root)
        except OSError as exc:  # an unwritable cache root (no home directory): the reference stays in memory
            return str(exc)
        if refused and refused != self._refused:
            cache_integrity.warn(f"oracle cache refused: {refused}; the reference is computed and kept in memory")
        self._refused = refused
        return f"cache directory refused: {refused}" if refused else ""

    @staticmethod
    def _read(where: Path, key: dict, digest: str) -> tuple[dict[str, Expectation] | None, str]:
        meta_path = where / "key.json"
        if not os.path.lexists(where):
            return None, "no entry"
        bad = cache_integrity.unsafe(where) or cache_integrity.unsafe(meta_path)
        if not bad:  # the key first: another input's entry is an ordinary miss, not worth hashing
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError) as exc:
                return None, f"unreadable key.json ({exc})"
            if not isinstance(meta, dict) or meta.get("key") != key:
                old = (meta.get("key") if isinstance(meta, dict) else None) or {}
                old = old if isinstance(old, dict) else {}
                diff = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k))
                return None, f"key mismatch ({', '.join(diff) or 'key'} differ)"
            bad = cache_integrity.verify(where, digest)
        if bad:
            cache_integrity.warn(f"oracle cache entry not believed: {bad}; discarded, the reference is recomputed")
            cache_integrity.discard(where)
            return None, f"unreadable entry (integrity: {bad})"
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
    def _write(where: Path, key: dict, digest: str, got: Mapping[str, Expectation]) -> str:
        try:  # an unwritable cache root (no home directory) leaves the reference in memory only
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
            cache_integrity.seal(tmp, digest)
            cache_integrity.discard(where)
            os.replace(tmp, where)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            return f"not stored ({exc})"
        pruned = user_cache.after_write(where)
        if pruned is not None and pruned.removed:
            return (f"stored; the user cache was trimmed to its cap: {len(pruned.removed)} least recently used "
                    f"entries removed ({user_cache.human(pruned.freed)})")
        return "stored"
