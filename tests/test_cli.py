"""The installed CLI end to end: one-line errors for every bad-input class, a real run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_factory import QT, TensorSpec, build_gguf, tiny_llama_parts, write_tiny_llama


def cli(*args: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localinfer", *args],
        input=stdin, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )


def assert_clean_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("localinfer: error: "), proc.stderr
    for f in fragments:
        assert f.lower() in lines[0].lower(), proc.stderr
    assert "Traceback" not in proc.stderr


def unsupported_arch(folder: Path) -> Path:
    path = folder / "arch.gguf"
    kvs, tensors = tiny_llama_parts()
    kvs[0] = ("general.architecture", kvs[0][1], "mamba9")
    path.write_bytes(build_gguf(kvs, tensors))
    return path


def unsupported_type(folder: Path) -> Path:
    path = folder / "iq2xxs.gguf"
    kvs, tensors = tiny_llama_parts(n_embd=256, n_ff=256, n_heads=4, n_kv_heads=2)
    tensors = [TensorSpec(t.name, t.shape, QT.IQ2_XXS) if t.name == "blk.0.ffn_up.weight" else t for t in tensors]
    path.write_bytes(build_gguf(kvs, tensors))
    return path


def hostile_counts(folder: Path) -> Path:
    path = folder / "hostile.gguf"
    path.write_bytes(build_gguf([], [], n_tensors=2**63, n_kv=2**64 - 1))
    return path


@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        (lambda p: p / "missing.gguf", ("not found",)),
        (lambda p: (p / "notes.gguf").write_text("hello, I am not a model") and p / "notes.gguf", ("magic",)),
        (lambda p: (p / "empty.gguf").write_bytes(b"") or p / "empty.gguf", ("empty",)),
        (hostile_counts, ("tensors", "cannot fit")),
        (unsupported_arch, ("architecture", "mamba9")),
        (unsupported_type, ("IQ2_XXS", "blk.0.ffn_up.weight")),
    ],
    ids=["missing", "not-gguf", "empty", "hostile-counts", "unsupported-arch", "unsupported-type"],
)
def test_bad_model_files_give_one_line_errors(tmp_path: Path, make, fragments) -> None:
    path = make(tmp_path)
    assert_clean_error(cli("run", "--model", str(path), "hello"), *fragments)


def test_truncated_real_model(tmp_path: Path, smollm2_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        cut.write_bytes(f.read(5_000_000))
    assert_clean_error(cli("run", "--model", str(cut), "hello"))
    assert_clean_error(cli("info", str(cut)))


def test_unknown_catalog_name() -> None:
    assert_clean_error(cli("run", "--model", "no-such-model", "hello"), "unknown model")


def test_debug_shows_traceback(tmp_path: Path) -> None:
    proc = cli("--debug", "run", "--model", str(tmp_path / "missing.gguf"), "hi")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_over_long_prompt_is_an_error(smollm2_path: Path) -> None:
    proc = cli("run", "--model", str(smollm2_path), "--ctx", "64", "--raw", "word " * 200)
    assert_clean_error(proc, "context length is 64")
    assert proc.stdout == ""


def test_bad_sampling_parameter(smollm2_path: Path) -> None:
    assert_clean_error(cli("run", "--model", str(smollm2_path), "--temperature", "-1", "hi"), "temperature")


def test_run_tiny_model_with_stats_and_stdin(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    # greedy: a sampled token could be EOS before the 5th
    proc = cli("run", "--model", str(model), "--max-tokens", "5", "-t", "0", "--stats", "--raw",
               stdin="hello world")
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stderr and "decode" in proc.stderr
    assert "generated 5 tokens" in proc.stderr


def test_run_real_model_answers(smollm2_path: Path) -> None:
    proc = cli("run", "--model", str(smollm2_path), "--max-tokens", "24", "--temperature", "0",
               "Explain what a computer is in one sentence.")
    assert proc.returncode == 0, proc.stderr
    # llama.cpp's own greedy answer starts "A computer is a device that processes information",
    # every one of those tokens with a clear lead (no near-tie a kernel change could flip)
    assert "computer is a device" in proc.stdout.lower()


def test_info_and_list(smollm2_path: Path) -> None:
    proc = cli("info", str(smollm2_path))
    assert proc.returncode == 0, proc.stderr
    for word in ("llama", "Q4_1", "8192", "chat template", "134.5M", "memory"):
        assert word in proc.stdout
    listing = cli("list")
    assert listing.returncode == 0 and "smollm2-135m" in listing.stdout
