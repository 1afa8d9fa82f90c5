"""`localinfer bench --backend llamacpp`: localinfer's engine over llama.cpp against llama.cpp
itself (Llama.eval single stream; batched llama_decode, one sequence id per stream, as
llama-server's slots), every metric on both sides. No timing assertions: machines are noisy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_factory import write_tiny_llama

pytest.importorskip("llama_cpp")


def test_bench_on_the_llamacpp_backend(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=2048)
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "localinfer", "bench", "--quick", "--threads", "1",
         "--backend", "llamacpp", "--model", str(model), "--json", str(out)],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "llamacpp backend, 1 threads" in proc.stdout.splitlines()[0]
    doc = json.loads(out.read_text())
    assert doc["plan"]["backend"] == "llamacpp"
    for n in (1, 4, 16, 64):
        m = doc["metrics"][f"aggregate_tps_{n}"]
        assert m["localinfer"] > 0 and m["llamacpp"] > 0 and m["ratio"] > 0
    assert doc["metrics"]["decode_tps"]["ratio"] > 0
    assert "start to first token, first start" in proc.stdout  # no JIT on this backend


def test_gpu_layers_need_the_llamacpp_backend(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "localinfer", "bench", "--backend", "numba", "--n-gpu-layers",
         "4", "--model", str(tmp_path / "x.gguf")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--n-gpu-layers needs --backend llamacpp" in proc.stderr
