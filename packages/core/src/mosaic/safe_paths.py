"""Paths of a campaign directory that are never followed through a link.

A campaign directory may come from someone else (a colleague's shared campaign, a directory in a shared ``/tmp``),
so anything in it may be a planted symlink. Every write of one goes through here:

* a directory is used only when it is a real directory (:func:`real_dir`: ``lstat``, never ``stat``), and is made
  with ``mkdir``, which never follows a link;
* a file written whole goes to a new temporary file in that directory (``O_CREAT|O_EXCL|O_NOFOLLOW``: a link at
  its name is never opened) and is renamed over its name with ``os.replace`` (:func:`write_atomic`), which
  replaces a planted link instead of writing through it;
* a file written in place (the journal, the lock) is opened with ``O_NOFOLLOW`` (:func:`open_file`), and a
  descriptor that is not a regular file is refused (``O_NONBLOCK``: a planted FIFO never blocks the open).

Every read of a campaign's files stays inside the directory given: :func:`inside` refuses a path with a symlink
anywhere below its root, or one that resolves outside it; :func:`read_bytes` reads a regular file through
``O_NOFOLLOW``. A refusal is :class:`~mosaic.errors.BadInput`: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from mosaic.errors import BadInput

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_OPEN = NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
#: what a refusal says after the name of the link
NEVER = "a campaign directory is never written or read through a link"
BUNDLES_INSIDE = "a campaign's bundles are read only inside the directory given"


def link_refused(path: Path, why: str = NEVER) -> BadInput:
    return BadInput(f"{path.name} is a symlink: {why}", str(path))


def no_link(path: str | os.PathLike, why: str = NEVER) -> Path:
    """``path``, after checking that it is not a symlink (it may not exist)."""
    path = Path(path)
    if path.is_symlink():
        raise link_refused(path, why)
    return path


def real_dir(path: str | os.PathLike, *, create: bool = False, what: str = "a campaign directory") -> Path:
    """``path`` as a real directory: not a symlink (refused, never followed), not a file; made when ``create``
    (its missing parents too: those are the user's own path)."""
    path = Path(path)
    for attempt in (0, 1):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create or attempt:
                raise BadInput(f"{what}: no such directory", str(path)) from None
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path)  # never through a link: a link of this name (planted since) makes it fail
            except FileExistsError:
                pass
            continue
        except OSError as exc:
            raise BadInput(f"{what}: cannot read: {exc.strerror}", str(path)) from None
        if stat.S_ISLNK(st.st_mode):
            raise link_refused(path, f"{what} is never written or read through a link")
        if not stat.S_ISDIR(st.st_mode):
            raise BadInput(f"{what} must be a directory, not a file", str(path))
        return path
    raise AssertionError("unreachable")


def inside(root: str | os.PathLike, path: str | os.PathLike, why: str = NEVER) -> Path:
    """``path`` (``root`` or below it), after checking that nothing between ``root`` and it is a symlink and that it
    resolves inside ``root``: what a read of a campaign's files may open."""
    root, path = Path(root), Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise BadInput(f"{path} is not inside {root}: {why}", str(path)) from None
    at = root
    for part in rel.parts:
        at = at / part
        if at.is_symlink():
            raise link_refused(at, why)
    if not path.resolve().is_relative_to(root.resolve()):
        raise BadInput(f"{path.name} resolves outside {root}: {why}", str(path))
    return path


def open_file(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags)`` that never follows a link at ``path`` and refuses what is not a regular file (a
    directory, a FIFO, a device); the descriptor is the caller's to close."""
    path = Path(path)
    try:
        fd = os.open(path, flags | _OPEN, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) or path.is_symlink():
            raise link_refused(path) from None
        if exc.errno == errno.ENXIO:  # a FIFO that nobody reads, opened for writing without blocking
            raise BadInput("not a regular file (a device, FIFO or socket is never opened)", str(path)) from None
        if exc.errno == errno.EISDIR:
            raise BadInput("is a directory, not a file", str(path)) from None
        raise BadInput(f"cannot open: {exc.strerror}", str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadInput("not a regular file (a device, FIFO or socket is never opened)", str(path))
    return fd


def write_all(fd: int, data: bytes, sync: bool = True) -> None:
    """Write ``data`` whole to ``fd`` (one ``write`` for anything that fits the pipe buffer), then ``fsync``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if sync:
        os.fsync(fd)


def read_bytes(path: str | os.PathLike, limit_name: str = "json_bytes") -> bytes:
    """The bytes of the regular file ``path`` (never through a link), no larger than limit ``limit_name``."""
    from mosaic import limits

    fd = open_file(path, os.O_RDONLY)
    try:
        cap = limits.limit(limit_name)
        size = os.fstat(fd).st_size
        if size > cap:
            raise limits.refuse(limit_name, size, str(path))
        parts, n = [], 0
        while n <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - n))
            if not chunk:
                break
            parts.append(chunk)
            n += len(chunk)
        if n > cap:  # it grew while it was read
            raise limits.refuse(limit_name, n, str(path))
        return b"".join(parts)
    finally:
        os.close(fd)


def touch(path: str | os.PathLike) -> Path:
    """Make ``path`` an (empty, when new) regular file, never through a link; an existing file is kept."""
    os.close(open_file(path, os.O_RDWR | os.O_CREAT))
    return Path(path)


def write_atomic(directory: str | os.PathLike, name: str, data: bytes | str, sync: bool = False) -> Path:
    """Write ``directory/name`` whole: to a new temporary file beside it (``O_EXCL|O_NOFOLLOW``, in ``directory``
    checked to be a real directory), then renamed over ``name`` (a link there is replaced, never written through).
    Returns the path written."""
    directory = real_dir(directory)
    if isinstance(data, str):
        data = data.encode("utf-8")
    target = directory / name
    for _ in range(16):
        tmp = directory / f".{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o666)  # the umask applies
        except FileExistsError:
            continue
        except OSError as exc:
            raise BadInput(f"cannot write: {exc.strerror}", str(target)) from None
        break
    else:
        raise BadInput("cannot make a temporary file (every name tried exists)", str(target))
    try:
        try:
            write_all(fd, data, sync)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, IsADirectoryError):
            raise BadInput("is a directory, not a file", str(target)) from None
        if isinstance(exc, OSError):
            raise BadInput(f"cannot write: {exc.strerror}", str(target)) from None
        raise
    return target
