"""The tokenizer cache: a GGUF's built tokenizer, stored once, loaded in tens of ms.

Building a tokenizer from GGUF metadata (decoding 50k-260k token strings, detecting special
tokens, parsing merges) took 0.1-0.35 s of every start.  The result depends only
on the metadata and on the code that builds it, so it is kept under paths.tokenizer_cache_dir(),
one file per (metadata sha256, version):

    <metadata sha256>.<version>.ltc

The metadata digest covers the header bytes up to the last metadata entry
(GGUFFile.metadata_sha256: a few MB, hashed in milliseconds, no trust in file names or stat):
another file with the same metadata shares the entry, a file whose metadata changed misses.
version digests this package's sources, the GGUF string decoder, the entry format and the Python
version (marshal's format may change between versions).  An entry is a magic, the CRC-32 of the
rest, and marshal data of plain types only (never pickle: loading it cannot run code):
{"key": ..., "state": tokenizer/state.py's description}.  It is written atomically; one that
does not check out (short, wrong magic or checksum, another key, a malformed state) is rebuilt,
one that cannot be written is skipped.  Writing an entry removes the same metadata's entries at
other versions and, past MAX_ENTRIES, the least recently used ones (a hit refreshes the mtime);
`localinfer rm` drops the model's.  LOCALINFER_TOKENIZER_CACHE=0 turns the cache off.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
import zlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer import paths
from localinfer.atomic_file import atomic_write, remove_stale_temps
from localinfer.errors import LocalInferError
from localinfer.tokenizer.base import Tokenizer
from localinfer.tokenizer.state import from_state, to_state

if TYPE_CHECKING:
    from localinfer.gguf_file import GGUFFile

MAGIC = b"LITOKC\x00\x01"
FORMAT = 1
SUFFIX = ".ltc"
MAX_ENTRIES = 16  # a few MB each; files deleted by hand leave theirs until they age out
_CRC_BYTES = 4
_MARSHAL_VERSION = 4


def enabled() -> bool:
    return os.environ.get("LOCALINFER_TOKENIZER_CACHE", "1").lower() not in (
        "0", "off", "no", "false")


def load_tokenizer(g: GGUFFile) -> Tokenizer:
    """The tokenizer g's metadata describes (Tokenizer.from_gguf), from the cache when it holds
    an entry for this metadata; raises TokenizerError like from_gguf."""
    version = _version() if enabled() else None
    if version is None:
        return Tokenizer.from_gguf(g.metadata)
    digest = g.metadata_sha256()
    folder = paths.tokenizer_cache_dir()
    target = folder / f"{digest}.{version}{SUFFIX}"
    key = {"format": FORMAT, "metadata_sha256": digest, "version": version}
    tok = read_entry(target, key)
    if tok is not None:
        with contextlib.suppress(OSError):
            os.utime(target)  # recently used: the last to be evicted
        return tok
    tok = Tokenizer.from_gguf(g.metadata)
    # a full or read-only disk, or data the format cannot hold: run uncached
    with contextlib.suppress(OSError, ValueError, OverflowError):
        write_entry(target, key, to_state(tok))
        _remove(p for p in folder.glob(f"{digest}.*{SUFFIX}") if p != target)
        _evict_least_recent(folder)
        remove_stale_temps(folder)
    return tok


def forget(gguf_path: Path) -> None:
    """Drop the cache entries of the file at `gguf_path` (before it is deleted)."""
    from localinfer.gguf_file import open_gguf

    try:
        with open_gguf(gguf_path) as g:
            digest = g.metadata_sha256()
    except LocalInferError:  # not a valid GGUF: it never had an entry
        return
    _remove(paths.tokenizer_cache_dir().glob(f"{digest}.*{SUFFIX}"))


def write_entry(target: Path, key: dict[str, Any], state: dict[str, Any]) -> None:
    payload = marshal.dumps({"key": key, "state": state}, _MARSHAL_VERSION)
    with atomic_write(target) as f:
        f.write(MAGIC + zlib.crc32(payload).to_bytes(_CRC_BYTES, "little") + payload)


def read_entry(path: Path, key: dict[str, Any]) -> Tokenizer | None:
    """The tokenizer stored at `path`, or None if it is absent or does not check out."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(MAGIC) + _CRC_BYTES
    if len(data) < head or data[:len(MAGIC)] != MAGIC:
        return None
    with memoryview(data) as view, view[head:] as payload:
        if zlib.crc32(payload) != int.from_bytes(data[len(MAGIC):head], "little"):
            return None
        try:
            entry = marshal.loads(payload)
            if not isinstance(entry, dict) or entry.get("key") != key:
                return None
            return from_state(entry.get("state"))
        except (ValueError, TypeError, EOFError, IndexError, KeyError, OverflowError,
                LocalInferError):
            return None


@cache
def _version() -> str | None:
    """A digest of everything an entry depends on besides the metadata; None (cache off) when
    the sources cannot be read, since a code change could then go unnoticed."""
    from localinfer import gguf_strings

    h = hashlib.sha256(f"{FORMAT} {sys.version_info[:2]} {marshal.version}".encode())
    sources = sorted(Path(__file__).parent.glob("*.py")) + [Path(gguf_strings.__file__)]
    try:
        for p in sources:
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    except OSError:
        return None
    return h.hexdigest()[:16]


def _evict_least_recent(folder: Path) -> None:
    dated = []
    for p in folder.glob(f"*{SUFFIX}"):
        with contextlib.suppress(OSError):
            dated.append((p.stat().st_mtime, p))
    dated.sort()
    _remove(p for _, p in dated[:max(len(dated) - MAX_ENTRIES, 0)])


def _remove(files: Any) -> None:
    for p in files:
        with contextlib.suppress(OSError):
            p.unlink()
