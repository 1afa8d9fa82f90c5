"""file_digest(): a file's sha256, remembered per (path, size, mtime_ns, inode) on disk.

The repacked-weight cache is keyed by the GGUF's content, but hashing a 1 GB file on every
start would cost more than the cache saves; a file whose identity and stat are unchanged since
it was hashed is taken to have the same content (a rewrite in place changes mtime_ns; a
download or copy makes a new inode).  Memo files are tiny JSON, one per path, written
atomically; a missing or unreadable one just means hashing again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from localinfer.atomic_file import atomic_write


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def memo_path(memo_dir: Path, path: Path) -> Path:
    key = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:32]
    return memo_dir / f"{key}.json"


def remembered(memo_dir: Path, path: Path) -> str | None:
    """The digest last recorded for `path`, whether or not the file changed since (or None)."""
    try:
        with open(memo_path(memo_dir, path)) as f:
            value = json.load(f)["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) else None


def file_digest(path: Path, memo_dir: Path) -> tuple[str, str | None]:
    """(sha256 of the file, the digest recorded before it if it differs, else None)."""
    from localinfer.catalog import sha256_file

    path = Path(path)
    st = os.stat(path)
    memo = memo_path(memo_dir, path)
    old: dict = {}
    with contextlib.suppress(OSError, ValueError), open(memo) as f:
        old = json.load(f)
    if isinstance(old, dict) and old.get("stat") == _stamp(st) and isinstance(
            old.get("sha256"), str):
        return old["sha256"], None
    digest = sha256_file(path)
    if _stamp(os.stat(path)) == _stamp(st):  # not rewritten while we read it
        with contextlib.suppress(OSError), atomic_write(memo) as f:
            f.write(json.dumps({"path": str(path.resolve()), "stat": _stamp(st),
                                "sha256": digest}).encode())
    previous = old.get("sha256") if isinstance(old, dict) else None
    return digest, previous if isinstance(previous, str) and previous != digest else None


def forget(memo_dir: Path, path: Path) -> None:
    with contextlib.suppress(OSError):
        memo_path(memo_dir, path).unlink()


def prune(memo_dir: Path) -> tuple[set[str], set[str]]:
    """Drop the memos of files that no longer exist; (their digests, the live files' digests)."""
    gone, live = set(), set()
    for memo in memo_dir.glob("*.json"):
        try:
            with open(memo) as f:
                value = json.load(f)
            path, digest = value["path"], value["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if os.path.exists(path):
            live.add(digest)
            continue
        gone.add(digest)
        with contextlib.suppress(OSError):
            memo.unlink()
    return gone - live, live
