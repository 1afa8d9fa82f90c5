"""Crash-safe file placement: write to a temp file beside the target, fsync, rename.

Killed at any point or out of disk, the target is either absent or the old complete file,
and no temp file is left behind (RELIABILITY.md #31).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_write(
    target: Path, validate: Callable[[Path], None] | None = None
) -> Iterator[BinaryIO]:
    """Yield a binary file; on success it is fsynced, validated and renamed onto `target`."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a model or output file is not a secret
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if validate is not None:
            validate(tmp)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _fsync_dir(path: Path) -> None:
    # The rename itself is durable only once the directory entry is flushed.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temps(folder: Path, older_than_s: float = 120.0) -> None:
    """Remove temp files left by a killed process (SIGKILL skips cleanup).

    A live writer touches its temp file continuously, so only files idle for a while go.
    """
    if not folder.is_dir():
        return
    now = time.time()
    for p in folder.glob(".*.part"):
        with contextlib.suppress(OSError):
            if now - p.stat().st_mtime > older_than_s:
                p.unlink()
