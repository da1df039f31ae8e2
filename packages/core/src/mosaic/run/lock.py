"""One ``mosaic run`` at a time per campaign directory.

A run that writes a campaign directory (a live run's ``--out``, ``--offline``'s ``--out``, ``--resume DIR``)
holds ``DIR/.mosaic-run.lock`` (an OS lock through :mod:`filelock`: released when the process ends, ``kill -9``
included) for as long as it writes. ``DIR/.mosaic-run.holder.json`` names the holder (pid, host, start time,
command line), so a second run at once is refused with one line saying who has the directory.
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

from mosaic.errors import BadInput

LOCK = ".mosaic-run.lock"
HOLDER = ".mosaic-run.holder.json"


def holder_of(directory: Path) -> str:
    """Who holds ``directory``'s lock, as the holder file says (or that it does not say)."""
    from mosaic import limits

    try:
        h = limits.read_json(directory / HOLDER)
        return (f"pid {int(h['pid'])} on {str(h['host'])[:64]} since {str(h['started'])[:32]}: "
                f"{str(h['command'])[:120]}")
    except (BadInput, OSError, KeyError, TypeError, ValueError):
        return "a process that has not written its name yet"


@contextmanager
def campaign_lock(directory: str | os.PathLike) -> Iterator[Path]:
    """Hold ``directory``'s campaign lock (creating the directory), or refuse naming the holder."""
    from filelock import FileLock, Timeout

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise BadInput("a campaign directory must be a directory, not a file", str(directory))
    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(directory / LOCK, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise BadInput(f"another mosaic run is writing this campaign directory ({holder_of(directory)}); wait "
                       "for it to end or choose another directory", str(directory)) from None
    holder = directory / HOLDER
    try:
        tmp = directory / f".{HOLDER}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   "command": " ".join(["mosaic", *sys.argv[1:]])}) + "\n")
        os.replace(tmp, holder)
        yield directory
    finally:
        try:
            holder.unlink()
        except OSError:
            pass
        lock.release()
