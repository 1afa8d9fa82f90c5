"""The bundle archive layer: round trips, and hostile archives refused before anything is written."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from localinfer.bundle import archive as A
from localinfer.errors import BundleError


def _make_bundle(root: Path) -> Path:
    (root / "models").mkdir(parents=True)
    (root / "wheels" / "linux-x86_64").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "manifest.json").write_text('{"name": "demo"}\n')
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "run.ps1").write_text("Write-Host hi\r\n")
    (root / "models" / "m.gguf").write_bytes(os.urandom(3 * A.CHUNK + 123))
    (root / "wheels" / "linux-x86_64" / "x-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04fake")
    return root


def _tree(folder: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        out[rel] = None if p.is_dir() else p.read_bytes()
    return out


def _snapshot(folder: Path) -> list[tuple[str, int, int]]:
    return [(p.relative_to(folder).as_posix(), p.lstat().st_mode, p.lstat().st_size)
            for p in sorted(folder.rglob("*"))]


@pytest.mark.parametrize("kind", A.ARCHIVE_KINDS)
def test_round_trip(tmp_path: Path, kind: str) -> None:
    src = _make_bundle(tmp_path / "src")
    target = tmp_path / f"demo.{kind}"
    A.write_archive(src, target, kind, root_name="demo", progress=False)
    assert A.archive_kind(target) == kind
    members = A.check_members(target)
    assert A.archive_root(members) == "demo"
    assert [m.name for m in members] == sorted(m.name for m in members)
    root = A.extract(target, tmp_path / "out", progress=False)
    assert root == tmp_path / "out" / "demo"
    assert _tree(root) == _tree(src)
    assert stat.S_IMODE((root / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "run.ps1").stat().st_mode) == 0o644
    # the same input gives the same bytes
    again = tmp_path / f"again.{kind}"
    A.write_archive(src, again, kind, root_name="demo", progress=False)
    assert again.read_bytes() == target.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_zip_is_stored_with_unix_modes(tmp_path: Path) -> None:
    src = _make_bundle(tmp_path / "src")
    target = tmp_path / "demo.zip"
    A.write_archive(src, target, "zip", root_name="demo", progress=False)
    with zipfile.ZipFile(target) as zf:
        infos = {i.filename: i for i in zf.infolist()}
    assert all(i.compress_type == zipfile.ZIP_STORED for i in infos.values())
    assert infos["demo/run.sh"].external_attr >> 16 == stat.S_IFREG | 0o755
    assert infos["demo/manifest.json"].external_attr >> 16 == stat.S_IFREG | 0o644
    assert infos["demo/models/"].external_attr >> 16 == stat.S_IFDIR | 0o755


def test_tar_owner_and_format(tmp_path: Path) -> None:
    src = _make_bundle(tmp_path / "src")
    target = tmp_path / "demo.tar"
    A.write_archive(src, target, "tar", root_name="demo", progress=False)
    with tarfile.open(target, "r:") as tf:
        infos = tf.getmembers()
    assert {(i.uid, i.gid, i.uname, i.gname) for i in infos} == {(0, 0, "", "")}
    assert {i.type for i in infos} <= {tarfile.REGTYPE, tarfile.DIRTYPE}
    assert next(i for i in infos if i.name == "demo/run.sh").mode == 0o755


def test_archive_kind_by_content(tmp_path: Path) -> None:
    src = _make_bundle(tmp_path / "src")
    A.write_archive(src, tmp_path / "a.zip", "zip", root_name="r", progress=False)
    A.write_archive(src, tmp_path / "b.tar", "tar", root_name="r", progress=False)
    os.rename(tmp_path / "a.zip", tmp_path / "a.bin")
    os.rename(tmp_path / "b.tar", tmp_path / "b.bin")
    assert A.archive_kind(tmp_path / "a.bin") == "zip"
    assert A.archive_kind(tmp_path / "b.bin") == "tar"
    assert A.archive_kind(src) is None
    (tmp_path / "junk.bin").write_bytes(b"not an archive at all" * 50)
    with pytest.raises(BundleError):
        A.archive_kind(tmp_path / "junk.bin")


def test_archive_root() -> None:
    m = A.Member
    assert A.archive_root([m("r", True, 0, 0o755), m("r/a", False, 1, 0o644)]) == "r"
    assert A.archive_root([m("r/a", False, 1, 0o644), m("s/b", False, 1, 0o644)]) is None
    assert A.archive_root([m("r", False, 1, 0o644)]) is None
    assert A.archive_root([]) is None


# --- hostile archives ----------------------------------------------------------------------

def _zip(path: Path, entries: list[tuple[str, bytes, int]]) -> None:
    """entries: (name, data, unix st_mode or 0)."""
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as zf:
        warnings.simplefilter("ignore")  # zipfile warns about duplicate names
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            info.filename = name  # ZipInfo() cuts a name at NUL; keep it to test the reader
            info.external_attr = mode << 16
            zf.writestr(info, data)


def _tar(path: Path, entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            if isinstance(e, tarfile.TarInfo):
                tf.addfile(e)
            else:
                info = tarfile.TarInfo(e[0])
                info.size = len(e[1])
                tf.addfile(info, io.BytesIO(e[1]))


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


BAD_PATHS = ["../evil", "root/../../evil", "/tmp/evil", "C:/evil", "root\\..\\..\\evil",
             "\\evil", "root/a\x00b", "root/a\nb", "", "root//x"]


def _assert_refused(tmp_path: Path, archive: Path, entry: str) -> None:
    dest = tmp_path / "dest"
    before = _snapshot(tmp_path)
    tmp_evil = Path("/tmp/evil").exists()
    with pytest.raises(BundleError) as err:
        A.extract(archive, dest, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and repr(entry) in msg, msg
    assert _snapshot(tmp_path) == before
    assert not dest.exists() and not (tmp_path / "evil").exists()
    assert Path("/tmp/evil").exists() == tmp_evil
    with pytest.raises(BundleError):
        A.check_members(archive)


@pytest.mark.parametrize("name", BAD_PATHS)
def test_zip_bad_paths(tmp_path: Path, name: str) -> None:
    archive = tmp_path / "bad.zip"
    _zip(archive, [("root/ok.txt", b"fine", 0), (name, b"evil", 0)])
    _assert_refused(tmp_path, archive, name)


@pytest.mark.parametrize("name", [n for n in BAD_PATHS if "\x00" not in n])
def test_tar_bad_paths(tmp_path: Path, name: str) -> None:
    archive = tmp_path / "bad.tar"
    _tar(archive, [("root/ok.txt", b"fine"), (name, b"evil")])
    # tarfile strips a trailing "/" and "" round-trips as is; the message names tar's name
    _assert_refused(tmp_path, archive, name)


def test_tar_pax_name_with_nul(tmp_path: Path) -> None:
    # tarfile cuts a header name at NUL, but a PAX "path" record can carry one
    info = tarfile.TarInfo("root/ab")
    info.pax_headers = {"path": "root/a\x00b"}
    archive = tmp_path / "bad.tar"
    _tar(archive, [info])
    _assert_refused(tmp_path, archive, "root/a\x00b")


@pytest.mark.parametrize("mode,reason", [
    (stat.S_IFLNK | 0o777, "symlink"), (stat.S_IFCHR | 0o644, "character device"),
    (stat.S_IFIFO | 0o644, "fifo"), (stat.S_IFBLK | 0o644, "block device")])
def test_zip_special_files(tmp_path: Path, mode: int, reason: str) -> None:
    archive = tmp_path / "bad.zip"
    _zip(archive, [("root/", b"", stat.S_IFDIR | 0o755), ("root/link", b"/etc", mode),
                   ("root/link/passwd", b"evil", 0)])
    _assert_refused(tmp_path, archive, "root/link")
    with pytest.raises(BundleError, match=reason):
        A.check_members(archive)


@pytest.mark.parametrize("entry,reason", [
    (_special("root/link", tarfile.SYMTYPE, "/etc"), "symlink to '/etc'"),
    (_special("root/link", tarfile.LNKTYPE, "/etc/passwd"), "hardlink to '/etc/passwd'"),
    (_special("root/link", tarfile.CHRTYPE), "character device"),
    (_special("root/link", tarfile.BLKTYPE), "block device"),
    (_special("root/link", tarfile.FIFOTYPE), "fifo"),
    (_special("root/link", tarfile.CONTTYPE), "unsupported tar entry type"),
])
def test_tar_special_files(tmp_path: Path, entry: tarfile.TarInfo, reason: str) -> None:
    archive = tmp_path / "bad.tar"
    _tar(archive, [("root/ok.txt", b"fine"), entry, ("root/link/passwd", b"evil")])
    _assert_refused(tmp_path, archive, "root/link")
    with pytest.raises(BundleError, match=reason):
        A.check_members(archive)


def test_duplicates_and_clashes(tmp_path: Path) -> None:
    z = tmp_path / "dup.zip"
    _zip(z, [("root/a", b"1", 0), ("root/a", b"2", 0)])
    _assert_refused(tmp_path, z, "root/a")
    t = tmp_path / "dup.tar"
    _tar(t, [("root/a", b"1"), ("root/a", b"2")])
    _assert_refused(tmp_path, t, "root/a")
    c = tmp_path / "clash.tar"
    _tar(c, [("root/a", b"file"), ("root/a/b", b"below a file")])
    _assert_refused(tmp_path, c, "root/a/b")
    d = tmp_path / "dirfile.zip"
    _zip(d, [("root/a/", b"", 0), ("root/a", b"file", 0)])
    _assert_refused(tmp_path, d, "root/a")


def test_dot_prefix_is_allowed(tmp_path: Path) -> None:
    archive = tmp_path / "dot.tar"
    _tar(archive, [_special(".", tarfile.DIRTYPE), ("./root/a.txt", b"hi")])
    assert A.extract(archive, tmp_path / "out", progress=False) == tmp_path / "out" / "root"
    assert (tmp_path / "out" / "root" / "a.txt").read_bytes() == b"hi"


# --- destination, failures half-way, the writer ------------------------------------------

def test_non_empty_dest_refused(tmp_path: Path) -> None:
    src = _make_bundle(tmp_path / "src")
    A.write_archive(src, tmp_path / "b.zip", "zip", root_name="demo", progress=False)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(BundleError, match="not empty"):
        A.extract(tmp_path / "b.zip", dest, progress=False)
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert A.extract(tmp_path / "b.zip", empty, progress=False) == empty / "demo"


def test_truncated_tar_refused_before_writing(tmp_path: Path) -> None:
    src = _make_bundle(tmp_path / "src")
    archive = tmp_path / "b.tar"
    A.write_archive(src, archive, "tar", root_name="demo", progress=False)
    data = archive.read_bytes()
    archive.write_bytes(data[: data.index(b"demo/models/m.gguf") + 512 + A.CHUNK])
    _assert_refused(tmp_path, archive, "demo/models/m.gguf")


def test_truncated_zip_refused_before_writing(tmp_path: Path) -> None:
    src = _make_bundle(tmp_path / "src")
    archive = tmp_path / "b.zip"
    A.write_archive(src, archive, "zip", root_name="demo", progress=False)
    archive.write_bytes(archive.read_bytes()[: 2 * A.CHUNK])  # the central directory is gone
    before = _snapshot(tmp_path)
    with pytest.raises(BundleError, match="cannot read"):
        A.extract(archive, tmp_path / "dest", progress=False)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("dest_exists", [False, True])
def test_failure_half_way_leaves_nothing(tmp_path: Path, dest_exists: bool) -> None:
    src = _make_bundle(tmp_path / "src")
    archive = tmp_path / "b.zip"
    A.write_archive(src, archive, "zip", root_name="demo", progress=False)
    data = bytearray(archive.read_bytes())
    # corrupt run.sh's data: its CRC fails after earlier members (the GGUF) were written
    pos = data.index(b"#!/bin/sh")
    data[pos] ^= 0xFF
    archive.write_bytes(bytes(data))
    dest = tmp_path / "deep" / "dest"
    if dest_exists:
        dest.mkdir(parents=True)
    before = _snapshot(tmp_path)
    with pytest.raises(BundleError, match="'demo/run.sh'") as err:
        A.extract(archive, dest, progress=False)
    assert "\n" not in str(err.value)
    assert _snapshot(tmp_path) == before


def test_member_larger_than_declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "b.zip"
    _zip(archive, [("root/a", b"x" * 10, 0)])
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, *a, **k: io.BytesIO(b"y" * 100) if a and not k
                        else real_open(self, *a, **k))
    with pytest.raises(BundleError, match="more than its declared 10 bytes"):
        A.extract(archive, tmp_path / "dest", progress=False)
    assert not (tmp_path / "dest").exists()


def test_disk_space_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _make_bundle(tmp_path / "src")
    A.write_archive(src, tmp_path / "b.tar", "tar", root_name="demo", progress=False)
    monkeypatch.setattr(A.shutil, "disk_usage", lambda p: SimpleNamespace(free=1000))
    with pytest.raises(BundleError, match="1000 free"):
        A.extract(tmp_path / "b.tar", tmp_path / "dest", progress=False)
    assert not (tmp_path / "dest").exists()


def test_write_refuses_symlink(tmp_path: Path) -> None:
    src = _make_bundle(tmp_path / "src")
    (src / "models" / "link.gguf").symlink_to("/etc/passwd")
    with pytest.raises(BundleError, match="'models/link.gguf': a symlink"):
        A.write_archive(src, tmp_path / "b.zip", "zip", root_name="demo", progress=False)
    assert not (tmp_path / "b.zip").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_write_refuses_target_inside_src(tmp_path: Path) -> None:
    src = _make_bundle(tmp_path / "src")
    with pytest.raises(BundleError, match="inside"):
        A.write_archive(src, src / "b.tar", "tar", root_name="demo", progress=False)
