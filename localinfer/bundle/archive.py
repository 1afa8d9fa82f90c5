"""Archive layer of `localinfer bundle`: pack a bundle folder into one zip or tar, and unpack one.

Policy (RELIABILITY.md #31/#32):
- Every entry is checked from the archive's directory before anything is written. Refused:
  empty names, absolute paths (`/x`, `C:x`, `\\x`), any backslash or `:`, `..` components,
  control characters, symlinks, hardlinks, devices, fifos, every other entry type, duplicate
  names, and a file that is also used as a folder.
- Extraction writes only regular files ("xb": never through an existing path or link) and
  folders, into a locked temp folder beside the destination renamed onto it at the end (a new
  or empty folder): failing or killed half-way, the destination is as it was. Declared
  sizes must fit the free disk space, and no entry may yield more bytes than it declares.
  `extractall` is never used and nothing is unpickled.
- Every refusal is one BundleError line that names the entry.
- Archives are written atomically (temp file beside the target, fsync, rename) and reproducibly:
  sorted entries, fixed timestamps, owner root, modes reduced to 0o755/0o644. Zip members are
  STORED so a GGUF inside can be used in place (wheels are compressed already).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from localinfer.atomic_file import atomic_write, temp_dir
from localinfer.errors import BundleError
from localinfer.progress import ProgressBar

ARCHIVE_KINDS = ("zip", "tar")
CHUNK = 1 << 20
MAX_ENTRIES = 100_000  # a bundle has tens of entries; bounds the memory a hostile index costs
_EPOCH = 315532800  # 1980-01-01, zip's earliest date: one fixed timestamp for both kinds
_DRIVE = re.compile(r"[A-Za-z]:")
_ZIP_TYPES = {stat.S_IFLNK: "symlink", stat.S_IFCHR: "character device",
              stat.S_IFBLK: "block device", stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}
_TAR_TYPES = {tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink",
              tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device",
              tarfile.FIFOTYPE: "fifo"}
_Handle = zipfile.ZipFile | tarfile.TarFile
_READ_ERRORS = (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError, UnicodeError)


@dataclass(frozen=True)
class Member:
    name: str  # posix path relative to the archive's top, without a trailing "/"
    is_dir: bool
    size: int
    mode: int  # permission bits as declared (extraction keeps only "executable or not")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _unsafe(name: str, reason: str) -> BundleError:
    return BundleError(f"unsafe archive entry {name!r}: {reason}")


def _path_problem(name: str) -> str | None:
    """Why `name` cannot be a path below the destination on every OS, or None."""
    if not name:
        return "empty name"
    if name[0] in "/\\" or _DRIVE.match(name):
        return "absolute path"
    if "\\" in name:
        return "backslash in name (a Windows path separator)"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "control character in name"
    if ":" in name:  # a Windows drive or alternate data stream
        return "':' in name"
    parts = name.split("/")
    if ".." in parts:
        return "'..' component"
    if "" in parts:
        return "empty path component"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # tar names undecodable as UTF-8 arrive as lone surrogates
        return "name is not valid UTF-8"
    return None


def archive_kind(path: Path) -> str | None:
    """'zip' or 'tar' by suffix, else by content; None for a folder (existing or to be made)."""
    path = Path(path)
    if path.is_dir():
        return None
    if path.suffix.lower() in (".zip", ".tar"):
        return path.suffix.lower()[1:]
    if not path.exists():
        return None
    if zipfile.is_zipfile(path):
        return "zip"
    try:  # "r:" rather than is_tarfile(): only uncompressed tars are bundles
        with tarfile.open(path, "r:"):
            return "tar"
    except (OSError, tarfile.TarError):
        raise BundleError(f"{path} is neither a folder nor a zip or tar archive") from None


def _open(archive: Path) -> _Handle:
    kind = archive_kind(archive)
    if kind is None:
        raise BundleError(f"{archive} is not an archive")
    try:
        return zipfile.ZipFile(archive) if kind == "zip" else tarfile.open(archive, "r:")
    except _READ_ERRORS as exc:
        raise BundleError(f"cannot read {kind} archive {archive}: {_one_line(exc)}") from None


def _zip_entry(info: zipfile.ZipInfo) -> tuple[str, bool, int, int]:
    raw = info.orig_filename  # .filename is cut at a NUL byte; judge what the archive holds
    is_dir = raw.endswith("/")
    unix = info.external_attr >> 16
    fmt = stat.S_IFMT(unix)
    if fmt and fmt not in (stat.S_IFREG, stat.S_IFDIR):
        raise _unsafe(raw, _ZIP_TYPES.get(fmt, f"unsupported file type {fmt:#o}"))
    if fmt and (fmt == stat.S_IFDIR) != is_dir:
        raise _unsafe(raw, "file type and name disagree")
    if info.flag_bits & 0x1:
        raise _unsafe(raw, "encrypted")
    return raw, is_dir, info.file_size, stat.S_IMODE(unix) or (0o755 if is_dir else 0o644)


def _tar_entry(info: tarfile.TarInfo, archive_size: int) -> tuple[str, bool, int, int]:
    raw = info.name
    if info.type in _TAR_TYPES:
        raise _unsafe(raw, f"{_TAR_TYPES[info.type]} to {info.linkname!r}"
                      if info.type in (tarfile.SYMTYPE, tarfile.LNKTYPE)
                      else _TAR_TYPES[info.type])
    if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE):
        raise _unsafe(raw, f"unsupported tar entry type {info.type!r}")
    is_dir = info.type == tarfile.DIRTYPE
    if not is_dir and info.offset_data + info.size > archive_size:
        raise _unsafe(raw, "data runs past the end of the archive (truncated?)")
    return raw, is_dir, 0 if is_dir else info.size, stat.S_IMODE(info.mode)


def _scan(handle: _Handle, archive: Path) -> list[tuple[Member, str, Any]]:
    """Check every entry; (member, raw name, zip/tar info) in archive order."""
    entries: list[tuple[tuple[str, bool, int, int], Any]] = []
    try:
        if isinstance(handle, zipfile.ZipFile):
            entries = [(_zip_entry(i), i) for i in handle.infolist()[:MAX_ENTRIES + 1]]
        else:
            size = archive.stat().st_size
            for info in handle:  # reads headers only; data is seeked over
                entries.append((_tar_entry(info, size), info))
                if len(entries) > MAX_ENTRIES:
                    break
    except _READ_ERRORS as exc:
        raise BundleError(f"cannot read archive {archive}: {_one_line(exc)}") from None
    if len(entries) > MAX_ENTRIES:
        raise BundleError(f"{archive} has more than {MAX_ENTRIES} entries; not a bundle")
    out: list[tuple[Member, str, Any]] = []
    kinds: dict[str, bool] = {}  # normalised name -> is_dir
    for (raw, is_dir, size, mode), ref in entries:
        name = raw[:-1] if is_dir and raw.endswith("/") else raw
        problem = _path_problem(name)
        if problem:
            raise _unsafe(raw, problem)
        name = "/".join(p for p in name.split("/") if p != ".")  # `tar -C dir .` writes ./x
        if not name:
            if is_dir:  # "./": the destination itself
                continue
            raise _unsafe(raw, "empty name")
        if name in kinds:
            raise _unsafe(raw, "duplicate name")
        kinds[name] = is_dir
        out.append((Member(name, is_dir, size, mode), raw, ref))
    for member, raw, _ in out:
        parts = member.name.split("/")
        for i in range(1, len(parts)):
            if kinds.get("/".join(parts[:i])) is False:
                raise _unsafe(raw, f"its parent {'/'.join(parts[:i])!r} is a file")
    return out


def check_members(archive: Path) -> list[Member]:
    """The archive's entries, read from its directory only; BundleError for any unsafe one."""
    with _open(Path(archive)) as handle:
        return [m for m, _, _ in _scan(handle, Path(archive))]


def archive_root(members: list[Member]) -> str | None:
    """The one top-level folder every entry lies in, or None."""
    if not members:
        return None
    root = members[0].name.split("/")[0]
    for m in members:
        if (m.name == root and not m.is_dir) or (m.name != root
                                                 and not m.name.startswith(root + "/")):
            return None
    return root


def _copy(src: IO[bytes], dst: IO[bytes], bar: ProgressBar, name: str,
          limit: int | None = None) -> int:
    done = 0
    while chunk := src.read(CHUNK):
        done += len(chunk)
        if limit is not None and done > limit:  # a lying header must not fill the disk
            raise _unsafe(name, f"holds more than its declared {limit} bytes")
        dst.write(chunk)
        bar.update(len(chunk))
    return done


def _prepare_dest(dest: Path, needed: int) -> Path | None:
    """Check dest is absent or an empty folder and its file system has room; make its missing
    parent folders. Returns the topmost folder made (None if none)."""
    if dest.exists() or dest.is_symlink():
        if not dest.is_dir():
            raise BundleError(f"{dest} exists and is not a folder")
        if any(dest.iterdir()):
            raise BundleError(f"{dest} is not empty; extract into a new or empty folder")
    top = None
    parent = dest.parent
    while not parent.exists() and parent.parent != parent:
        top, parent = parent, parent.parent
    free = shutil.disk_usage(parent).free
    if needed > free:
        raise BundleError(f"the archive holds {needed} bytes but {parent} has {free} free")
    if top is not None:
        try:
            dest.parent.mkdir(parents=True)
        except OSError as exc:
            raise BundleError(f"cannot create {dest.parent}: {_one_line(exc)}") from None
    return top


def extract(archive: Path, dest: Path, *, progress: bool = True) -> Path:
    """Unpack a checked archive into dest (absent or empty); returns the bundle's root folder.

    Everything is unpacked into a locked temp folder beside dest (atomic_file.temp_dir) that
    is renamed onto dest at the end: killed or failing at any point, dest stays as it was."""
    archive, dest = Path(archive), Path(dest)
    if dest.is_symlink() and dest.is_dir():
        dest = dest.resolve()  # a link to an empty folder: fill that folder
    with _open(archive) as handle:
        entries = _scan(handle, archive)  # raises before anything is written
        top = _prepare_dest(dest, sum(m.size for m, _, _ in entries))
        try:
            with temp_dir(dest.parent, dest.name) as tmp:
                _unpack(handle, entries, archive, tmp, progress)
                os.rename(tmp, dest)  # onto an absent or empty folder: whole or not at all
        except BaseException as exc:
            if top is not None:
                shutil.rmtree(top, ignore_errors=True)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise BundleError(f"extracting {archive.name} failed: no space left on device "
                                  f"in {dest.parent}; nothing was kept") from None
            raise
    root = archive_root([m for m, _, _ in entries])
    return dest / root if root is not None else dest


def _unpack(handle: _Handle, entries: list[tuple[Member, str, Any]], archive: Path,
            dest: Path, progress: bool) -> None:
    current = ""
    try:
        with ProgressBar(sum(m.size for m, _, _ in entries), f"extracting {archive.name}",
                         enabled=None if progress else False) as bar:
            for member, current, ref in entries:
                target = dest.joinpath(*member.name.split("/"))
                if member.is_dir:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                src = handle.open(ref) if isinstance(handle, zipfile.ZipFile) \
                    else handle.extractfile(ref)
                assert src is not None  # regular tar members always have a file
                with src, open(target, "xb") as out:  # "x": O_EXCL, never through a link
                    got = _copy(src, out, bar, current, member.size)
                if got != member.size:
                    raise _unsafe(current, f"truncated: {got} of {member.size} bytes")
                os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
    except Exception as exc:
        if isinstance(exc, BundleError):
            raise
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise BundleError(f"extracting {current!r} from {archive.name} failed: "
                          f"{_one_line(exc)}; nothing was kept") from None


def _walk(src: Path) -> list[tuple[str, Path, os.stat_result]]:
    """Every folder and regular file below src, sorted (a parent sorts before its children)."""
    out, stack = [], [src]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                rel = Path(entry.path).relative_to(src).as_posix()
                if stat.S_ISDIR(st.st_mode):
                    stack.append(Path(entry.path))
                elif not stat.S_ISREG(st.st_mode):
                    what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                    raise BundleError(f"cannot archive {rel!r}: {what}")
                problem = _path_problem(rel)  # never write what extract() would refuse
                if problem:
                    raise BundleError(f"cannot archive {rel!r}: {problem}")
                out.append((rel, Path(entry.path), st))
    return sorted(out, key=lambda e: e[0])


def _mode(rel: str, st: os.stat_result) -> int:
    # *.sh too: a bundle built on Windows has no exec bits, but run.sh must stay runnable
    return 0o755 if st.st_mode & 0o111 or rel.endswith(".sh") else 0o644


class _Counted:
    """A reader that reports to the progress bar (tarfile.addfile does the copying)."""

    def __init__(self, f: IO[bytes], bar: ProgressBar) -> None:
        self.f, self.bar = f, bar

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.bar.update(len(data))
        return data


# (name in the archive, source file or None for a folder, mode, size)
_Item = tuple[str, "Path | None", int, int]


def _write_zip(f: IO[bytes], items: list[_Item], bar: ProgressBar) -> None:
    with zipfile.ZipFile(f, "w", allowZip64=True) as zf:
        for name, path, mode, size in items:
            info = zipfile.ZipInfo(name if path else name + "/", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED  # a GGUF stays usable in place
            info.create_system = 3  # unix: makes unzip apply the mode in external_attr
            fmt, dos = (stat.S_IFREG, 0) if path else (stat.S_IFDIR, 0x10)  # 0x10: MS-DOS dir
            info.external_attr = (fmt | mode) << 16 | dos
            if path is None:
                zf.writestr(info, b"")
                continue
            info.file_size = size
            with path.open("rb") as fin, zf.open(info, "w", force_zip64=True) as out:
                _copy(fin, out, bar, name)


def _write_tar(f: IO[bytes], items: list[_Item], bar: ProgressBar) -> None:
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT, copybufsize=CHUNK) as tf:
        for name, path, mode, size in items:
            info = tarfile.TarInfo(name)
            info.type = tarfile.REGTYPE if path else tarfile.DIRTYPE
            info.mode, info.size, info.mtime = mode, size, _EPOCH
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if path is None:
                tf.addfile(info)
                continue
            with path.open("rb") as fin:  # a file that shrinks meanwhile raises OSError
                tf.addfile(info, _Counted(fin, bar))  # type: ignore[arg-type]


def write_archive(src: Path, target: Path, kind: str, *, root_name: str,
                  progress: bool = True) -> None:
    """Pack folder src, under one top folder root_name/, into target (atomically)."""
    src, target = Path(src), Path(target)
    if kind not in ARCHIVE_KINDS:
        raise BundleError(f"unknown archive kind {kind!r}; expected one of {ARCHIVE_KINDS}")
    if not src.is_dir():
        raise BundleError(f"{src} is not a folder")
    if "/" in root_name or root_name in (".", "..") or _path_problem(root_name):
        raise BundleError(f"bad bundle root name {root_name!r}")
    if target.resolve().is_relative_to(src.resolve()):
        raise BundleError(f"{target} is inside {src}; the archive would contain itself")
    items: list[_Item] = [(root_name, None, 0o755, 0)]
    for rel, path, st in _walk(src):
        is_dir = stat.S_ISDIR(st.st_mode)
        items.append((f"{root_name}/{rel}", None if is_dir else path,
                      0o755 if is_dir else _mode(rel, st), 0 if is_dir else st.st_size))
    total = sum(size for _, _, _, size in items)
    try:
        with ProgressBar(total, f"writing {target.name}", enabled=None if progress else False) \
                as bar, atomic_write(target) as f:
            (_write_zip if kind == "zip" else _write_tar)(f, items, bar)
    except OSError as exc:
        raise BundleError(f"writing {target} failed: {_one_line(exc)}") from None
