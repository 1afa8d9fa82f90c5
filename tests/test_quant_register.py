"""`quantize --register NAME`: the output joins the user's catalog (LOCALINFER_HOME/
user-models.toml) and `localinfer run --model NAME` finds it; names are checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gguf_factory import write_tiny_llama
from test_cli import assert_clean_error, cli

from localinfer.catalog import Catalog


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_register_then_run_by_name(home: Path, tmp_path: Path) -> None:
    src = write_tiny_llama(tmp_path / "tiny.gguf", n_embd=256, n_ff=512)
    out = tmp_path / "out" / "tiny-q8.gguf"
    proc = cli("quantize", str(src), str(out), "--type", "Q8_0", "--register", "my-tiny",
               "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "registered 'my-tiny'" in proc.stderr
    assert "[models.\"my-tiny\"]" in (home / "user-models.toml").read_text()
    catalog = Catalog.load()
    path = catalog.resolve("my-tiny")
    assert path == home / "models" / "my-tiny" / "tiny-q8.gguf"
    assert path.read_bytes() == out.read_bytes()
    assert catalog.default == "smollm2-135m" and "smollm2-135m" in catalog.entries
    assert any(r["name"] == "my-tiny" and r["pulled"] for r in catalog.rows())
    run = cli("run", "--model", "my-tiny", "--max-tokens", "3", "hello")
    assert run.returncode == 0, run.stderr
    listed = cli("list")
    assert "my-tiny" in listed.stdout

    # registering again under the same name replaces the entry, not duplicates it
    out.unlink()
    proc = cli("quantize", str(src), str(out), "--type", "Q4_0", "--register", "my-tiny",
               "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert (home / "user-models.toml").read_text().count("[models.") == 1
    assert Catalog.load().resolve("my-tiny").read_bytes() == out.read_bytes()
    assert not [p for p in (home / "models" / "my-tiny").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("name, fragment", [
    ("smollm2-135m", "built-in"), ("../evil", "invalid model name"), ("a b", "invalid"),
])
def test_bad_names_fail_before_quantizing(home: Path, tmp_path: Path, name: str,
                                          fragment: str) -> None:
    src = write_tiny_llama(tmp_path / "tiny.gguf", n_embd=256, n_ff=512)
    out = tmp_path / "o.gguf"
    assert_clean_error(cli("quantize", str(src), str(out), "--type", "Q8_0",
                           "--register", name), fragment)
    assert not out.exists() and not (home / "user-models.toml").exists()
    assert not os.path.exists(home / "models" / name)
