"""`localinfer bench chat`: the real chat app, headless, against the engine on the real SmolLM2
model; every number is written and the ratio printed. No timing assertions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("textual")

from test_bench import bench  # noqa: E402  (`localinfer bench --quick --threads 1 ...`)


def test_bench_chat_real_model(smollm2_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "chat.json"
    proc = bench("chat", "--model", str(smollm2_path), "--tokens", "24", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["threads"] == 1 and doc["tokens"] == 24 and len(doc["rows"]) == 1
    row = doc["rows"][0]
    # greedy on both sides: the chat and the engine generate the same tokens
    assert row["tokens"] == row["engine_tokens"] > 1
    assert row["frames"] >= 1
    assert row["engine_tps"] > 0 and row["visible_tps"] > 0 and doc["ratio"] > 0
    assert "visible / engine" in proc.stdout and "tok/s" in proc.stdout


def test_bench_chat_bad_tokens_is_one_line_error() -> None:
    proc = bench("chat", "--tokens", "0")
    assert proc.returncode != 0
    assert proc.stderr.startswith("localinfer: error: invalid --tokens")
