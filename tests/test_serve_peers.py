"""The serving benchmark's peer script (localinfer.bench.serve_peers) end to end at toy size:
it starts each server as a process, drives it with the load generator, stops it and prints one
table. llama-server is included when its binary is on PATH or in LLAMA_SERVER."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("uvicorn")


def test_serve_peers_at_toy_size(smollm2_path: Path, tmp_path: Path) -> None:
    peers = ["localinfer-llamacpp", "llama-cpp-python"]
    server = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if server:
        peers.append("llama-server")
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "localinfer.bench.serve_peers", "--model", str(smollm2_path),
           "--peers", ",".join(peers), "--threads", "1", "--concurrency", "1,2",
           "--requests", "2", "--prompt-len", "16", "--max-tokens", "4", "--json", str(out)]
    if server:
        cmd += ["--llama-server", server]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["server"], r["concurrency"]) for r in rows] == [
        (p, c) for p in peers for c in (1, 2)]
    for r in rows:
        assert r["failed"] == 0 and r["output_tok_s"] > 0, r
        assert r["mean_output_tokens"] == 4  # ignore_eos honoured, usage (or chunks) counted
    table = proc.stdout.splitlines()
    assert table[1].startswith("| server | concurrency |") and len(table) == 3 + len(rows)
