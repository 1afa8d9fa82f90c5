"""opened(): a bundle folder as is, or an archive extracted safely into a temp folder."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from localinfer.atomic_file import temp_dir
from localinfer.bundle import archive, check
from localinfer.errors import BundleError


@contextlib.contextmanager
def opened(path: Path, *, progress: bool = True) -> Iterator[Path]:
    """Yield the bundle's root folder; an archive's entries are all checked before anything
    is extracted (archive.extract), and the extraction is removed afterwards: it lives in a
    locked temp folder (atomic_file.temp_dir) that the next open sweeps if this process is
    killed."""
    if path.is_dir():
        yield path
        return
    if not path.exists():
        raise BundleError(f"{path}: no such bundle folder or archive")
    if archive.archive_kind(path) is None:
        raise BundleError(f"{path}: neither a bundle folder nor a .zip or .tar archive")
    check_archive(path)
    with temp_dir(Path(tempfile.gettempdir()), "localinfer-bundle") as tmp:
        yield archive.extract(path, tmp / "bundle", progress=progress)


def check_archive(path: Path) -> None:
    """archive.check_members, and no launcher state: a bundle zipped after it was used carries
    another machine's venv and compiled kernels in .runtime/, which must never be loaded."""
    members = archive.check_members(path)
    root = archive.archive_root(members)
    for m in members:
        rel = m.name.split("/", 1)[1] if root and "/" in m.name else m.name
        if rel == check.STATE_DIR or rel.startswith(check.STATE_DIR + "/"):
            raise BundleError(f"unsafe archive entry {m.name!r}: launcher state from another "
                              f"machine ({check.STATE_DIR}/) is never unpacked")
