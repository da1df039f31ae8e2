"""Cache entries that are checked before they are believed.

Every cache mosaic reads back (the oracle's float64 references, nvcc's builds, the CuTe artifact store) keeps
one directory per entry and uses the same four calls:

* :func:`seal` (the writer, on the entry's temporary directory before it is renamed into place): strips the
  group/other write bits of everything in it and writes :data:`MANIFEST`, the SHA-256 and size of every file
  with the key the entry was made for;
* :func:`verify` (the reader, before it reads, loads or dlopens anything of the entry): '' when the entry is a
  real directory owned by this user that only this user can write, every file in it is a regular file of this
  user that only this user can write, the files are exactly the manifest's, each still hashes to it, and the
  manifest names the expected key; otherwise why not, naming the file. A failed check is a miss: the reader
  :func:`warn` s (one line on stderr), :func:`discard` s the entry and recomputes; an entry without a manifest
  (written before manifests existed) is such a miss too;
* :func:`private_dir` (the cache's directories): created with mode 0700; an existing one that is a symbolic
  link, owned by someone else or writable by group or others is refused, and the cache then stores nothing and
  reads nothing there.

Paths are examined with ``lstat``: a link is never followed. The check is of this user's own directories: what
another user could have written is refused, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import uuid
from pathlib import Path

MANIFEST = "integrity.json"
FORMAT = "mosaic-cache-entry/1"
_CHUNK = 1 << 20


def warn(message: str) -> None:
    """One line on stderr."""
    print(f"warning: {' '.join(message.split())}", file=sys.stderr)


def unsafe(path: str | os.PathLike) -> str:
    """'' when ``path`` (not following a link) is a directory or a regular file owned by this user that neither
    group nor others can write; else why not, naming ``path``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} is missing"
    except OSError as exc:
        return f"{path} cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return f"{path} is not a regular file or directory"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit)
        return f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def private_dir(path: str | os.PathLike) -> str:
    """Make directory ``path`` (and its missing parents) with mode 0700; '' when it is usable for a cache,
    else why it is refused (:func:`unsafe`, or not a directory). Raises OSError when it cannot be created."""
    path = Path(path)
    missing = []
    p = path
    while not os.path.lexists(p) and p.parent != p:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # whatever the umask
    why = unsafe(path)
    if not why and not path.is_dir():
        why = f"{path} is not a directory"
    return why


def _files(entry: Path) -> tuple[dict[str, Path], str]:
    """The entry's files by relative path (the manifest excluded), and the first thing in it that is not a
    safe file or directory ('' when none)."""
    found, stack = {}, [entry]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in sorted(it, key=lambda e: e.name):
                p = Path(e.path)
                why = unsafe(p)
                if why:
                    return found, why
                if e.is_dir(follow_symlinks=False):
                    stack.append(p)
                elif p != entry / MANIFEST:
                    found[p.relative_to(entry).as_posix()] = p
    return found, ""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def seal(entry: str | os.PathLike, key: str) -> None:
    """Write ``entry``'s manifest: the SHA-256 and size of each of its files and ``key``. Strips the group and
    other write bits of the entry, its directories and files first (a umask of 002 would leave them
    group-writable: refused on the next read)."""
    entry = Path(entry)
    for dirpath, dirnames, filenames in os.walk(entry):
        for name in [*dirnames, *filenames, ""]:
            p = Path(dirpath, name) if name else Path(dirpath)
            st = os.lstat(p)
            if st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode):
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o022)
    files, _ = _files(entry)
    manifest = {"format": FORMAT, "key": key,
                "files": {rel: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for rel, p in sorted(files.items())}}
    target = entry / MANIFEST
    target.write_text(json.dumps(manifest, sort_keys=True, separators=(",", ":")))
    os.chmod(target, 0o644)


def verify(entry: str | os.PathLike, key: str) -> str:
    """'' when ``entry`` is intact (see the module docstring) and was made for ``key``; else why not, naming the
    file. Never raises."""
    entry = Path(entry)
    why = unsafe(entry) or unsafe(entry / MANIFEST)
    if why:
        return f"{why} (an entry without an intact manifest is not believed)" if "is missing" in why else why
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        listed = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(listed, dict):
            return f"{entry / MANIFEST} is not a {FORMAT} manifest"
        if manifest.get("key") != key:
            return f"{entry / MANIFEST} was written for key {str(manifest.get('key'))[:64]!r}, not {key[:64]!r}"
        files, why = _files(entry)
        if why:
            return why
        extra, absent = sorted(set(files) - set(listed)), sorted(set(listed) - set(files))
        if extra or absent:
            rel = (extra or absent)[0]
            return f"{entry / rel} is {'not in the manifest' if extra else 'missing'}"
        for rel, p in files.items():
            want = listed[rel]
            if p.stat().st_size != want["bytes"] or _sha256(p) != want["sha256"]:
                return f"{p} changed since it was written (its SHA-256 differs from the manifest's)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{entry / MANIFEST} is unreadable ({type(exc).__name__}: {exc})"
    return ""


def discard(entry: str | os.PathLike) -> None:
    """Remove ``entry``: renamed aside first (a dot-named sibling), so no reader sees it half removed."""
    entry = Path(entry)
    if not os.path.lexists(entry):
        return
    aside = entry.with_name(f".discarded-{entry.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(entry, aside)
    except OSError:
        aside = entry
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        try:
            aside.unlink()
        except OSError:
            pass
