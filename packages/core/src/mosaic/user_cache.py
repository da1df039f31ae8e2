"""The user cache: what mosaic keeps between runs, under one root, measured and trimmed to a size cap.

**Root** (:func:`cache_root`): ``$MOSAIC_CACHE_DIR``, else ``$XDG_CACHE_HOME/mosaic``, else ``~/.cache/mosaic``.
A campaign directory (``mosaic run --out``) keeps none of it: its bundles, journal, report and worker logs only.
Readers and writers take :func:`usable_root`: the root, created with mode 0700, unless it or one of mosaic's
sections in it is a symbolic link, owned by someone else or writable by group or others
(:mod:`mosaic.cache_integrity`): then, with one warning line, a private temporary root of this process stands in
(nothing is read from the refused cache or written to it). Entries are sealed and verified by their cache
(:func:`mosaic.cache_integrity.seal` / :func:`~mosaic.cache_integrity.verify`).

**Sections** are the root's top-level directories; :data:`SECTIONS` names the ones mosaic writes (who writes
each, and how deep its entries sit). An **entry** is one directory (or file) at its section's depth: one
float64 reference, one nvcc build, one checkpoint, one campaign's scratch. Only these sections are ever
trimmed; anything else under the root is measured and left alone, and a root that holds something other
than mosaic's sections (``MOSAIC_CACHE_DIR`` pointed at a home directory) is not trimmed until it carries the
``CACHEDIR.TAG`` (https://bford.info/cachedir/) that mosaic writes into a root of its own.

**Recency**: an entry's last use is the newest modification time of the entry and everything in it. Readers
:func:`touch` an entry on a hit (the oracle's :class:`~mosaic.oracle.cache.ReferenceCache`, nvcc's
``build_cached``, the bundle members' cache); an entry no reader touches counts from when it was written.

**Cap**: ``MOSAIC_CACHE_MAX`` (:func:`cache_cap`; a size such as ``20GiB``, ``500MB`` or a byte count; ``off``
for none), default :data:`DEFAULT_CAP` (20 GiB: a handful of the largest float64 references, 2 GiB each at
16384 x 8192, beside the builds and a converted checkpoint). :func:`after_write` trims the cache to it, least
recently used entry first, after a writer adds an entry; ``mosaic cache info|prune`` shows and trims it by
hand. An entry in use is never removed: the entry just written, a campaign's scratch whose process is alive,
and a write in progress (a dot-named temporary less than a day old).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import attrs

from mosaic import cache_integrity
from mosaic.errors import BadInput

ROOT_ENV = "MOSAIC_CACHE_DIR"
CAP_ENV = "MOSAIC_CACHE_MAX"
DEFAULT_CAP = 20 * 1024**3
TAG = "CACHEDIR.TAG"
TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
            "# This directory is mosaic's user cache (mosaic cache info|prune); see https://bford.info/cachedir/\n")
SCRATCH = "scratch"
OWNER = "owner.json"
#: a dot-named temporary (an atomic write in progress) younger than this is in use
IN_PROGRESS_S = 24 * 3600


@attrs.frozen
class SectionKind:
    """A directory of the user cache that mosaic writes: its name, who writes it, how deep its entries are."""

    name: str
    what: str
    depth: int = 1


SECTIONS = {s.name: s for s in (
    SectionKind("oracle", "float64 oracle references, one per problem (mosaic.oracle.cache)"),
    SectionKind(SCRATCH, "live campaigns' scratch (lowerings in flight, gate bundles); removed when a campaign ends"),
    SectionKind("members", "compressed bundle members inflated for readers that need a path (mosaic.bundle)", 2),
    SectionKind("cutlass", "CUTLASS template builds (nvcc)"),
    SectionKind("kernel-file", "CUTLASS kernel-file builds (nvcc)"),
    SectionKind("cute-artifacts", "compiled CuTe DSL functions"),
    SectionKind("amk-cuda", "the megakernel VM's nvcc builds"),
    SectionKind("checkpoints", "real checkpoints converted from GGUF"),
)}


def cache_root() -> Path:
    """``$MOSAIC_CACHE_DIR``, else ``$XDG_CACHE_HOME/mosaic``, else ``~/.cache/mosaic``."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "mosaic"


_STAND_INS: dict[str, Path] = {}


def usable_root() -> Path:
    """The root the caches read and write: :func:`cache_root`, created with mode 0700 when missing, when it and
    each of mosaic's sections in it is a real directory of this user that neither group nor others can write.
    Otherwise the cache is refused: one warning line, and a private temporary root of this process (removed
    at exit) stands in for it, so everything is recomputed and nothing is read from or written to the refused
    one. A root that cannot be created (no home directory, a read-only disk) is returned as it is: its writers
    say so."""
    root = cache_root()
    try:
        why = cache_integrity.private_dir(root)
    except OSError:
        return root
    if not why:
        why = next((w for w in (cache_integrity.unsafe(root / s) for s in SECTIONS if os.path.lexists(root / s)) if w),
                   "")
    if not why:
        return root
    if str(root) not in _STAND_INS:
        stand_in = Path(tempfile.mkdtemp(prefix="mosaic-cache-"))
        atexit.register(shutil.rmtree, stand_in, True)
        _STAND_INS[str(root)] = stand_in
        cache_integrity.warn(f"cache refused: {why}; nothing is read from or written to {root} (this process caches "
                             f"in {stand_in}, removed at exit; give {ROOT_ENV} a directory only you can write)")
    return _STAND_INS[str(root)]


# -- sizes ------------------------------------------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3,
          "t": 1024**4, "tib": 1024**4, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*")


def parse_size(text: str, where: str) -> int:
    """Bytes of a size: ``20GiB``, ``20G`` (binary), ``500MB`` (decimal), ``1.5 TiB``, ``1048576``. BadInput
    naming ``where`` otherwise."""
    m = _SIZE_RE.fullmatch(str(text).lower())
    if not m or m.group(2) not in _UNITS:
        raise BadInput(f"'{text}' is not a size (e.g. 20GiB, 500MB, 1.5T or a number of bytes)", where)
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def human(n: int) -> str:
    """``1.5 GiB``-style size."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def cache_cap() -> int | None:
    """The cap in bytes from ``$MOSAIC_CACHE_MAX`` (default :data:`DEFAULT_CAP`); None when it is ``off``."""
    raw = os.environ.get(CAP_ENV, "").strip()
    if not raw:
        return DEFAULT_CAP
    if raw.lower() in ("off", "none", "unlimited"):
        return None
    return parse_size(raw, CAP_ENV)


# -- entries ----------------------------------------------------------------------------------------------------
@attrs.frozen
class Entry:
    """One entry of a section: its path, bytes on disk (file sizes) and last use (epoch seconds)."""

    section: str
    path: Path
    bytes: int
    last_used: float

    def to_json(self) -> dict:
        return {"section": self.section, "path": str(self.path), "bytes": self.bytes,
                "last_used": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.last_used))}


@attrs.frozen
class Pruned:
    """What a trim did: the entries removed (oldest use first), the bytes freed, the entries it kept because
    they were in use (with why), and the size of what it trimmed, before and after."""

    removed: tuple[Entry, ...]
    in_use: tuple[tuple[Entry, str], ...]
    before: int
    after: int

    @property
    def freed(self) -> int:
        return self.before - self.after


def _measure(path: Path) -> tuple[int, float]:
    """(bytes, newest mtime) of a file or a directory tree, links not followed; (0, 0) once it is gone."""
    try:
        st = path.lstat()
    except OSError:
        return 0, 0.0
    if not path.is_dir() or path.is_symlink():
        return st.st_size, st.st_mtime
    total, newest = 0, st.st_mtime
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    try:
                        est = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    newest = max(newest, est.st_mtime)
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                    else:
                        total += est.st_size
        except OSError:
            continue
    return total, newest


def touch(path: str | os.PathLike) -> None:
    """Mark a cache entry used now (its last-use stamp is its own modification time); never raises."""
    try:
        os.utime(path)
    except OSError:
        pass


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _related(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


@attrs.frozen
class UserCache:
    """The cache under ``root`` with cap ``cap`` bytes (None: no cap). :meth:`from_env` reads both from the
    environment."""

    root: Path = attrs.field(converter=Path)
    cap: int | None = DEFAULT_CAP

    @classmethod
    def from_env(cls) -> UserCache:
        return cls(cache_root(), cache_cap())

    # -- what is there ----------------------------------------------------------------------------------------
    def section_names(self) -> list[str]:
        """The known sections, then any other directory under the root (measured, never trimmed)."""
        try:
            present = sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            present = []
        return [*SECTIONS, *(n for n in present if n not in SECTIONS)]

    def entries(self, section: str) -> list[Entry]:
        """The section's entries, least recently used first."""
        kind = SECTIONS.get(section, SectionKind(section, "", 1))
        level = [self.root / section]
        for _ in range(kind.depth):
            nxt = []
            for d in level:
                try:
                    nxt.extend(sorted(d.iterdir()) if d.is_dir() and not d.is_symlink() else [])
                except OSError:
                    continue
            level = nxt
        found = [Entry(section, p, *_measure(p)) for p in level]
        return sorted(found, key=lambda e: (e.last_used, str(e.path)))

    def info(self) -> dict:
        """Root, cap, and per section its path, size, entry count and whether mosaic trims it; the total."""
        rows = []
        for name in self.section_names():
            es = self.entries(name)
            rows.append({"name": name, "path": str(self.root / name), "bytes": sum(e.bytes for e in es),
                         "entries": len(es), "managed": name in SECTIONS,
                         "what": SECTIONS[name].what if name in SECTIONS else "not mosaic's: never trimmed"})
        return {"root": str(self.root), "cap": self.cap, "cap_env": CAP_ENV, "sections": rows,
                "total": sum(r["bytes"] for r in rows if r["managed"])}

    # -- in use -----------------------------------------------------------------------------------------------
    def busy(self, entry: Entry, keep: Iterable[Path] = (), now: float | None = None) -> str:
        """Why ``entry`` must stay ('' when it may go)."""
        now = time.time() if now is None else now
        if any(_related(entry.path, Path(k)) for k in keep):
            return "in use by this process"
        if entry.path.name.startswith(".") and now - entry.last_used < IN_PROGRESS_S:
            return "a write in progress"
        if entry.section == SCRATCH:
            try:
                owner = json.loads((entry.path / OWNER).read_text())
            except (OSError, ValueError):
                return ""
            if not isinstance(owner, dict):
                return ""
            pid = owner.get("pid")
            if owner.get("host") != socket.gethostname():
                return f"campaign on {owner.get('host')}" if now - entry.last_used < IN_PROGRESS_S else ""
            if isinstance(pid, int) and _alive(pid):
                return f"campaign process {pid} is running"
        return ""

    def _trimmable(self) -> str:
        """'' when this root is mosaic's to trim (tagged, or holding only mosaic's sections: then it is tagged
        now), else why not."""
        if (self.root / TAG).is_file():
            return ""
        try:
            others = sorted(p.name for p in self.root.iterdir() if p.name not in SECTIONS and p.name != TAG)
        except FileNotFoundError:
            return ""
        except OSError as exc:
            return f"cannot list it ({exc.strerror})"
        if others:
            return (f"it holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}, not mosaic's sections, "
                    f"and no {TAG}")
        self.tag()
        return ""

    def tag(self) -> None:
        """Write ``CACHEDIR.TAG`` into the root (creating it): mosaic's own cache, and backups skip it."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if not (self.root / TAG).is_file():
                (self.root / TAG).write_text(TAG_TEXT)
        except OSError:
            pass

    # -- trimming ---------------------------------------------------------------------------------------------
    def trim(self, max_bytes: int, section: str | None = None, keep: Iterable[Path] = ()) -> Pruned:
        """Remove least recently used entries (of ``section``, else of every section mosaic writes) until what
        is left of them is at most ``max_bytes``; entries in use (:meth:`busy`, ``keep``) stay. BadInput for an
        unknown section or a root that is not mosaic's."""
        if section is not None and section not in SECTIONS:
            raise BadInput(f"no cache section '{section}' (sections: {', '.join(SECTIONS)})", "--section")
        why = self._trimmable()
        if why:
            raise BadInput(f"not trimming a cache root that is not mosaic's: {why}", str(self.root))
        keep = [Path(k) for k in keep]
        entries = sorted((e for name in ([section] if section else SECTIONS) for e in self.entries(name)),
                         key=lambda e: (e.last_used, str(e.path)))
        before = total = sum(e.bytes for e in entries)
        now = time.time()
        removed, in_use = [], []
        for e in entries:
            if total <= max_bytes:
                break
            reason = self.busy(e, keep, now)
            if reason:
                in_use.append((e, reason))
                continue
            _remove(e.path)
            removed.append(e)
            total -= e.bytes
            parent = e.path.parent
            while parent != self.root / e.section and parent != self.root:  # an emptied bucket (members/ab/)
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent
        return Pruned(tuple(removed), tuple(in_use), before, total)


def after_write(entry: str | os.PathLike) -> Pruned | None:
    """Trim the user cache to its cap after a writer added ``entry`` (kept, with anything else in use). None
    when ``entry`` is not under the cache root, the cap is off, the total is within it, or the root is not
    mosaic's to trim. BadInput for a bad ``MOSAIC_CACHE_MAX``."""
    cap = cache_cap()
    cache = UserCache(cache_root(), cap)
    entry = Path(entry)
    try:
        inside = cache.root.resolve() in entry.resolve().parents
    except OSError:
        return None
    if cap is None or not inside:
        return None
    try:
        return cache.trim(cap, keep=[entry.resolve(), entry])
    except BadInput:  # a root that is not mosaic's: never trimmed behind the user's back
        return None


# -- a campaign's scratch ---------------------------------------------------------------------------------------
def make_scratch(owner: str | os.PathLike, label: str = "") -> Path:
    """A fresh scratch directory for ``owner`` (a campaign directory) in this process:
    ``<root>/scratch/<12 hex of owner's path>-<label>-<pid>/``, with ``owner.json`` saying whose it is.
    Scratch left by a process of this machine that has ended is removed first. The caller removes its own
    (:func:`remove_scratch`) when it is done."""
    cache = UserCache(usable_root(), None)
    base = cache.root / SCRATCH
    try:
        refused = cache_integrity.private_dir(base)
    except OSError as exc:
        raise BadInput(f"cannot create the scratch directory of the user cache ({exc.strerror}); set "
                       f"{ROOT_ENV} to a writable directory", str(base)) from None
    if refused:
        raise BadInput(f"the scratch directory of the user cache is refused: {refused}", str(base))
    if not cache._trimmable():
        now = time.time()
        for e in cache.entries(SCRATCH):
            if (e.path / OWNER).is_file() and not cache.busy(e, now=now):
                _remove(e.path)
    ident = hashlib.sha256(str(Path(owner).resolve()).encode()).hexdigest()[:12]
    path = base / "-".join(p for p in (ident, label, str(os.getpid())) if p)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    (path / OWNER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                          "campaign": str(Path(owner).resolve()), "label": label,
                                          "started": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1) + "\n")
    return path


def remove_scratch(path: str | os.PathLike | None) -> None:
    """Remove a scratch directory made by :func:`make_scratch` (nothing when it is None or gone)."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
