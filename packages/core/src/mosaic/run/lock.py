"""One ``mosaic run`` at a time per campaign directory.

A run that writes a campaign directory (a live run's ``--out``, ``--offline``'s ``--out``, ``--resume DIR``)
holds ``DIR/.mosaic-run.lock`` (an OS lock through :mod:`filelock`: released when the process ends, ``kill -9``
included) for as long as it writes. ``DIR/.mosaic-run.holder.json`` names the holder (pid, host, start time,
command line), so a second run at once is refused with one line saying who has the directory.

The directory is written only when it is a real directory (:func:`mosaic.safe_paths.real_dir`): a campaign
directory, its ``bundles/`` or ``logs/`` that is a symlink is refused before anything is written, the lock file
is made without following a link, and the holder file is written to a fresh temporary file and renamed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mosaic import safe_paths
from mosaic.errors import BadInput

LOCK = ".mosaic-run.lock"
HOLDER = ".mosaic-run.holder.json"
#: the directories a run writes inside a campaign directory: never through a link
SUBDIRS = ("bundles", "logs")


def holder_of(directory: Path) -> str:
    """Who holds ``directory``'s lock, as the holder file says (or that it does not say)."""
    from mosaic import limits

    path = directory / HOLDER
    try:
        h = limits.loads_json(safe_paths.read_bytes(path, "json_bytes").decode("utf-8"), str(path))
        return (f"pid {int(h['pid'])} on {str(h['host'])[:64]} since {str(h['started'])[:32]}: "
                f"{str(h['command'])[:120]}")
    except (BadInput, OSError, KeyError, TypeError, ValueError):
        return "a process that has not written its name yet"


def writable_campaign_dir(directory: str | os.PathLike) -> Path:
    """``directory`` as a real directory (made when missing) whose ``bundles/`` and ``logs/``, where they exist,
    are real directories too; a symlink or a file is refused with one line."""
    directory = safe_paths.real_dir(directory, create=True)
    for sub in SUBDIRS:
        if os.path.lexists(directory / sub):
            safe_paths.real_dir(directory / sub, what=f"a campaign's {sub}/")
    return directory


@contextmanager
def campaign_lock(directory: str | os.PathLike) -> Iterator[Path]:
    """Hold ``directory``'s campaign lock (creating the directory), or refuse naming the holder."""
    from filelock import FileLock, Timeout

    directory = writable_campaign_dir(directory)
    lock = FileLock(str(safe_paths.touch(directory / LOCK)), timeout=0)  # made here: never through a link
    try:
        lock.acquire()
    except Timeout:
        raise BadInput(f"another mosaic run is writing this campaign directory ({holder_of(directory)}); wait "
                       "for it to end or choose another directory", str(directory)) from None
    holder = directory / HOLDER
    try:
        safe_paths.write_atomic(directory, HOLDER, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(["mosaic", *sys.argv[1:]])}) + "\n")
        yield directory
    finally:
        try:
            holder.unlink()
        except OSError:
            pass
        lock.release()
