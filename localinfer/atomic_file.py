"""Crash-safe file placement: write to a temp file beside the target, fsync, rename.

Killed at any point or out of disk, the target is either absent or the old complete file
(RELIABILITY.md #31). The temp files follow one rule so that none outlives its writer:

- A temp file or folder is named `.{target}.{pid}.{token}.part` and its writer holds an
  exclusive flock on it for as long as it lives.
- On an error (a full disk included) the writer removes it itself. A SIGKILLed writer cannot,
  so every atomic write (and every cache that opens its folder) first sweeps the folder: a
  `.part` entry is stale when nobody holds its lock and its pid is not a running process on
  this machine (a zombie counts as dead). Both tests, because the lock alone has a window
  between creating the file and locking it, and the pid alone can be reused; a reused pid only
  delays the sweep until that process ends.
- Older versions' names (mkstemp's `.{target}.XXXXXXXX.part`, no pid) go once unlocked and
  idle for `older_than_s`; any other `.part` name is not ours and stays.
- A temp folder's own sweep (temp_dir) looks only at names made for the same target, since it
  may live in a shared folder such as $TMPDIR.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # Windows: no flock, the pid alone decides
    fcntl = None  # type: ignore[assignment]

SUFFIX = ".part"
_OWNED = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}\.part$")
_LEGACY = re.compile(r"^\..+\.[a-z0-9_]{8}\.part$")  # mkstemp's names, before the pid
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def temp_path(target: Path) -> Path:
    """Where this process writes `target` before the rename (see the module's naming rule)."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}{SUFFIX}")


@contextlib.contextmanager
def atomic_write(
    target: Path, validate: Callable[[Path], None] | None = None
) -> Iterator[BinaryIO]:
    """Yield a binary file; on success it is fsynced, validated and renamed onto `target`.

    Any failure removes the temp file; a full disk is re-raised as an OSError (same errno)
    that names the target and says the old file is unchanged."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target.parent)
    tmp = temp_path(target)
    # 0644: a model or output file is not a secret (mkstemp would make it 0600)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        _lock(fd)
        with os.fdopen(fd, "wb", closefd=False) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if validate is not None:
            validate(tmp)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
            raise disk_full(exc, target) from None
        raise
    finally:
        os.close(fd)  # drops the lock, after the rename or the removal


@contextlib.contextmanager
def temp_dir(parent: Path, name: str) -> Iterator[Path]:
    """A new locked folder `.{name}.{pid}.{token}.part` in `parent`, removed on exit unless the
    caller renamed it into place; a SIGKILLed owner's folder goes in the next sweep."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(parent, prefix=f".{name}.")
    tmp = temp_path(parent / name)
    tmp.mkdir()
    fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        _lock(fd)
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def place_copy(src: Path, target: Path) -> None:
    """`src` at `target`: a hard link where the file system allows, else a copy through
    atomic_write; either way the target appears whole or not at all."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target.parent)
    tmp = temp_path(target)
    try:
        os.link(src, tmp)
    except OSError:  # another file system, or links not allowed: copy
        with open(src, "rb") as s, atomic_write(target) as out:
            shutil.copyfileobj(s, out, 1 << 20)
        return
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(target.parent)


def disk_full(exc: OSError, target: Path) -> OSError:
    """The one-line error of a write that ran out of space."""
    try:
        free = f"{shutil.disk_usage(target.parent).free} bytes free"
    except OSError:
        free = "free space unknown"
    return OSError(exc.errno, f"No space left on device writing {target} ({free}); "
                              "the previous file, if any, is unchanged")


def remove_stale_temps(folder: Path, older_than_s: float = 120.0, prefix: str = ".") -> int:
    """Remove the temp files and folders of dead writers in `folder` (those whose names start
    with `prefix`); returns how many."""
    try:
        entries = [p for p in Path(folder).glob(f".*{SUFFIX}") if p.name.startswith(prefix)]
    except OSError:
        return 0
    removed = 0
    now = time.time()
    for p in entries:
        with contextlib.suppress(OSError):
            if is_stale(p, now, older_than_s):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
                removed += 1
    return removed


def is_stale(path: Path, now: float | None = None, older_than_s: float = 120.0) -> bool:
    if _locked(path):
        return False
    m = _OWNED.match(path.name)
    if m is not None:
        return not _pid_running(int(m.group(1)))
    if _LEGACY.match(path.name) is None:
        return False
    now = time.time() if now is None else now
    return now - path.lstat().st_mtime > older_than_s


def _lock(fd: int) -> None:
    if fcntl is not None:
        with contextlib.suppress(OSError):  # a file system without locks: the pid decides
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _locked(path: Path) -> bool:
    """Whether a live process holds the entry's lock (False where it cannot be told)."""
    if fcntl is None or path.is_symlink():
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the probe's own lock
    return False


def _pid_running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    except OSError:
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: it writes no more
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


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
