"""The repacked-weight cache: a backend's weights for one GGUF, stored once and mapped at load.

Repacking (requantizing Q6_K, interleaving tiles) costs seconds per start; the result depends
only on the file's content and the code that repacks it.  So it is kept under
paths.weight_cache_dir(), one file per (content sha256, family, version):

    <sha256>.<family>.<version>.lwc

family names the layout (e.g. "qwen2-tiles": architecture and weight-stack kind) and version
everything else that changes it (a layout version constant and a digest of the repacking
sources).  An entry holds a tree of dataclasses, tuples, ints and arrays: the arrays first, each
at a 64-byte aligned offset, then a JSON header describing the tree, its 8-byte length and a
magic.  It is written atomically (temp + rename), so readers see a complete entry or none, and
concurrent writers of the same entry just replace each other's complete copies.

A load maps the entry copy-on-write: the arrays are writable ndarrays (the type the kernels
are compiled for) whose pages stay clean, shared with other processes and the page cache, and
are never read from the GGUF at all.  An entry that does not check out (short, wrong magic,
another key, arrays outside the data) is rebuilt; one that cannot be written is skipped.
Writing an entry evicts the file's entries of the same family at other versions; a GGUF whose
content changed at the same path drops the old content's entries, a deleted one (seen at the
next write) its own; `localinfer rm` drops the model's.  LOCALINFER_WEIGHT_CACHE=0 turns the
cache off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import mmap
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from localinfer import paths
from localinfer.atomic_file import atomic_write, remove_stale_temps
from localinfer.file_digest import file_digest, prune, remembered
from localinfer.file_digest import forget as forget_digest

MAGIC = b"LIWCACHE"
FORMAT = 1
ALIGN = 64
SUFFIX = ".lwc"
_TAIL = struct.Struct("<Q8s")  # header length, magic
_DTYPES = frozenset({"|u1", "|i1", "|b1", "<u2", "<i2", "<f2", "<u4", "<i4", "<f4", "<i8",
                     "<u8", "<f8"})

T = TypeVar("T")


def enabled() -> bool:
    return os.environ.get("LOCALINFER_WEIGHT_CACHE", "1").lower() not in ("0", "off", "no",
                                                                          "false")


def digests_dir() -> Path:
    return paths.weight_cache_dir() / "digests"


def load_or_build(gguf_path: Path, family: str, version: str, build: Callable[[], T],
                  classes: Iterable[type]) -> tuple[T, bool]:
    """(the tree, True when it came from the cache); `build` makes it on a miss.  `classes`:
    the dataclasses the tree may contain."""
    if not enabled():
        return build(), False
    folder = paths.weight_cache_dir()
    digest, previous = file_digest(gguf_path, digests_dir())
    if previous is not None:  # the file at this path changed: its old entries are dead
        _remove(folder.glob(f"{previous}.*{SUFFIX}"))
    key = {"format": FORMAT, "sha256": digest, "family": family, "version": version}
    target = folder / f"{digest}.{family}.{version}{SUFFIX}"
    by_name = {c.__name__: c for c in classes}
    tree = read_entry(target, key, by_name)
    if tree is not None:
        return tree, True
    tree = build()
    with contextlib.suppress(OSError):  # a full or read-only disk: run uncached
        write_entry(target, key, tree)
        _remove(p for p in folder.glob(f"{digest}.{family}.*{SUFFIX}") if p != target)
        prune_dead()
        remove_stale_temps(folder)
    return tree, False


def prune_dead() -> None:
    """Files deleted since they were hashed (a model removed by hand, a test's temporary
    copy): their entries, draft copies (draft_file.py) and memos go, so the cache holds only
    what some file still needs."""
    from localinfer.engine.draft_file import drafts_dir

    gone, _ = prune(digests_dir())
    _remove(p for d in gone for p in paths.weight_cache_dir().glob(f"{d}.*{SUFFIX}"))
    _remove(p for d in gone for p in drafts_dir().glob(f"{d}.*.gguf"))


def forget(gguf_path: Path) -> None:
    """Drop the cache entries of the file at `gguf_path` (before it is deleted)."""
    from localinfer.engine.draft_file import drafts_dir

    digest = remembered(digests_dir(), gguf_path)
    if digest is not None:
        _remove(paths.weight_cache_dir().glob(f"{digest}.*{SUFFIX}"))
        _remove(drafts_dir().glob(f"{digest}.*.gguf"))  # its copy as a draft (draft_file.py)
    forget_digest(digests_dir(), gguf_path)


def _remove(files: Iterable[Path]) -> None:
    for p in files:  # a process still mapping an entry keeps its pages until it unmaps
        with contextlib.suppress(OSError):
            p.unlink()


# -- the entry format --------------------------------------------------------------------------

def _encode(tree: Any) -> tuple[Any, list]:
    """Tree -> (JSON-able skeleton, arrays in order).  Objects met twice (a tied head that is
    the embedding) are stored once and come back as one object."""
    import numpy as np

    arrays: list = []
    seen: dict[int, Any] = {}

    def enc(x: Any) -> Any:
        if id(x) in seen:
            return ["ref", seen[id(x)]]
        if isinstance(x, np.ndarray):
            seen[id(x)] = node = len(seen)
            arrays.append(x)
            return ["a", node, len(arrays) - 1]
        if isinstance(x, tuple):
            seen[id(x)] = node = len(seen)
            return ["t", node, [enc(v) for v in x]]
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            seen[id(x)] = node = len(seen)
            fields = {f.name: enc(getattr(x, f.name)) for f in dataclasses.fields(x)}
            return ["c", node, type(x).__name__, fields]
        if x is None or isinstance(x, bool | str | float):
            return ["v", x]
        if isinstance(x, int):
            return ["i", x]
        raise TypeError(f"weight cache: cannot store {type(x).__name__}")

    return enc(tree), arrays


def _decode(skeleton: Any, arrays: list, classes: dict[str, type]) -> Any:
    nodes: dict[int, Any] = {}

    def dec(n: list) -> Any:
        tag = n[0]
        if tag == "v":
            return n[1]
        if tag == "i":
            return int(n[1])
        if tag == "ref":
            return nodes[n[1]]
        if tag == "a":
            nodes[n[1]] = arrays[n[2]]
        elif tag == "t":
            nodes[n[1]] = tuple(dec(v) for v in n[2])
        elif tag == "c":
            nodes[n[1]] = classes[n[2]](**{k: dec(v) for k, v in n[3].items()})
        else:
            raise ValueError(f"unknown node {tag!r}")
        return nodes[n[1]]

    return dec(skeleton)


def write_entry(target: Path, key: dict, tree: Any) -> None:
    import numpy as np

    skeleton, arrays = _encode(tree)
    specs = []
    with atomic_write(target) as f:
        offset = 0
        for a in arrays:
            pad = -offset % ALIGN
            f.write(b"\0" * pad)
            offset += pad
            specs.append([a.dtype.str, list(a.shape), offset])
            if a.size:
                f.write(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
                offset += a.nbytes
        header = json.dumps({"key": key, "arrays": specs, "tree": skeleton,
                             "data_end": offset}).encode()
        f.write(header)
        f.write(_TAIL.pack(len(header), MAGIC))


def read_entry(path: Path, key: dict, classes: dict[str, type]) -> Any | None:
    """The stored tree with its arrays mapped from `path`, or None if absent or not valid."""
    import numpy as np

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _TAIL.size:
                return None
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError:
        return None
    try:
        n_header, magic = _TAIL.unpack(mm[size - _TAIL.size:])
        start = size - _TAIL.size - n_header
        if magic != MAGIC or start < 0:
            return None
        header = json.loads(mm[start: size - _TAIL.size])
        if header["key"] != key or not 0 <= header["data_end"] <= start:
            return None
        arrays = []
        for dtype, shape, offset in header["arrays"]:
            if dtype not in _DTYPES or offset % ALIGN:
                return None
            count = 1
            for n in shape:
                count *= int(n)
            if count == 0:  # nothing mapped: a fresh empty array of the same type
                arrays.append(np.empty(shape, dtype))
                continue
            if count < 0 or offset + count * np.dtype(dtype).itemsize > header["data_end"]:
                return None
            arrays.append(np.frombuffer(mm, dtype, count, offset).reshape(shape))
        return _decode(header["tree"], arrays, classes)
    except (ValueError, KeyError, TypeError, IndexError, struct.error, RecursionError):
        return None
