"""The serving benchmark against its peers, one server after another on the same GGUF file:

    python -m localinfer.bench.serve_peers --llama-server PATH/llama-server [--model FILE]
        [--threads 2] [--concurrency 1,4,16] [--requests N] [--prompt-len 128]
        [--max-tokens 128] [--json FILE]

Servers (--peers picks some, in this order by default):
  localinfer           `localinfer serve` (numba backend)
  localinfer-llamacpp  `localinfer serve --backend llamacpp --kv-unified off` with one KV
                       stream per sequence, each as big as a llama-server slot
  llama-server         llama.cpp's own server, -np 16 slots, -t THREADS
  llama-cpp-python     `python -m llama_cpp.server --interrupt_requests False` (its default,
                       True, aborts a running stream whenever another request arrives)

Each is started, waited for, warmed up with one short request, driven by `localinfer bench
serve`'s load generator (streamed /v1/completions, prompts of ~P tokens, T output tokens, at
each concurrency) and stopped; then one table is printed. Run it on a quiet machine: the
numbers are only comparable within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localinfer.server import loadgen

PEERS = ("localinfer", "localinfer-llamacpp", "llama-server", "llama-cpp-python")
READY_TIMEOUT_S = 900.0  # a cold Numba kernel compile on a small machine takes minutes
CTX_SLACK = 64  # per-slot context beyond prompt + output (BOS, template, tokenizer drift)


@dataclass(slots=True)
class Peer:
    name: str
    cmd: list[str]
    ready_path: str  # GET answers 200 once the model is loaded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_command(name: str, a: argparse.Namespace, port: int, max_c: int) -> Peer:
    t, model = str(a.threads), a.model
    if name in ("localinfer", "localinfer-llamacpp"):
        cmd = [sys.executable, "-m", "localinfer", "serve", "--model", model, "--port",
               str(port), "--threads", t, "--max-num-seqs", str(max(16, max_c)),
               "--log-level", "warning"]
        if name == "localinfer-llamacpp":
            # one KV stream per sequence of as many cells as a llama-server slot below
            slots = max(16, max_c)
            cmd += ["--backend", "llamacpp", "--kv-unified", "off",
                    "--kv-cache-mb", f"{kv_cache_mb(model, slots * slot_ctx(a)):.4f}"]
        return Peer(name, cmd, "/health")
    if name == "llama-server":
        if not a.llama_server:
            raise SystemExit("llama-server: pass --llama-server PATH (or --peers without it)")
        slots = max(16, max_c)
        ctx = slots * slot_ctx(a)
        return Peer(name, [a.llama_server, "-m", model, "-np", str(slots), "-c", str(ctx),
                           "-t", t, "-tb", t, "--host", "127.0.0.1", "--port", str(port)],
                    "/health")
    if name == "llama-cpp-python":
        return Peer(name, [sys.executable, "-m", "llama_cpp.server", "--model", model,
                           "--n_threads", t, "--n_threads_batch", t, "--host", "127.0.0.1",
                           "--port", str(port), "--interrupt_requests", "False"],
                    "/v1/models")
    raise SystemExit(f"unknown peer {name!r} (known: {', '.join(PEERS)})")


def slot_ctx(a: argparse.Namespace) -> int:
    """KV cells of one llama-server slot (and of one localinfer-llamacpp stream)."""
    return -(-(a.prompt_len + a.max_tokens + CTX_SLACK) // 16) * 16


def kv_cache_mb(model: str, cells: int) -> float:
    """--kv-cache-mb for a llamacpp-backend pool of `cells` KV cells (16-token blocks)."""
    from localinfer.backend import get_backend
    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    with open_gguf(model) as g:
        config = ModelConfig.from_gguf(g, strict_arch=False)
    per_token = get_backend("llamacpp").kv_bytes_per_token(config)
    return (cells + 8) * per_token / 2**20  # a few cells spare: the engine rounds down


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    import httpx

    end = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"exited with {proc.returncode}: " + " | ".join(tail))
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def load_args(a: argparse.Namespace, url: str, **override: Any) -> argparse.Namespace:
    """The load generator's options (`localinfer bench serve`) for one run."""
    opts = {"url": url, "requests": a.requests, "prompt_len": a.prompt_len,
            "max_tokens": a.max_tokens, "api_key": None, "timeout": a.timeout,
            "no_ignore_eos": False}
    return argparse.Namespace(**{**opts, **override})


def end_of_generation_bias(model: str) -> dict[str, Any]:
    """llama-cpp-python's server ignores `ignore_eos`: a -100 logit bias on the model's
    end-of-generation tokens keeps its replies as long as the others'."""
    from localinfer.gguf_file import open_gguf
    from localinfer.tokenizer import Tokenizer

    with open_gguf(model) as g:
        eog = Tokenizer.from_gguf(g.metadata).eog_ids
    return {"logit_bias": {str(t): -100.0 for t in sorted(eog)}}


def bench_peer(peer: Peer, a: argparse.Namespace, port: int, levels: list[int],
               logdir: Path) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}"
    extra = end_of_generation_bias(a.model) if peer.name == "llama-cpp-python" else None
    log = logdir / f"{peer.name}.log"
    print(f"[{peer.name}] starting: {' '.join(peer.cmd)} (log: {log})", file=sys.stderr)
    with open(log, "wb") as out:
        proc = subprocess.Popen(peer.cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    rows: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        wait_ready(url + peer.ready_path, proc, log)
        print(f"[{peer.name}] ready in {time.perf_counter() - t0:.1f} s; warm-up",
              file=sys.stderr)
        warm = load_args(a, url, requests=1, max_tokens=4, extra_body=extra)
        asyncio.run(loadgen.run_once(warm, 1, None))
        for c in levels:
            print(f"[{peer.name}] concurrency {c}", file=sys.stderr)
            r = asyncio.run(loadgen.run_once(load_args(a, url, extra_body=extra), c, None))
            rows.append({"server": peer.name, **asdict(r)})
            for e in r.errors:
                print(f"[{peer.name}]   error: {e}", file=sys.stderr)
    except RuntimeError as exc:
        print(f"[{peer.name}] failed: {exc}", file=sys.stderr)
        rows.append({"server": peer.name, "error": str(exc)})
    finally:
        stop(proc)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| server | concurrency | requests | failed | output tok/s | TTFT p50 | TTFT p99 | "
            "latency p50 | latency p99 | output tok/req |")
    out = [head, "|" + "---|" * 10]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['server']} | - | - | - | failed to start: {r['error'][:80]} "
                       "| | | | | |")
            continue
        out.append(f"| {r['server']} | {r['concurrency']} | {r['requests']} | {r['failed']} | "
                   f"{r['output_tok_s']:.1f} | {r['ttft_p50_s']:.2f} s | {r['ttft_p99_s']:.2f} s "
                   f"| {r['latency_p50_s']:.2f} s | {r['latency_p99_s']:.2f} s | "
                   f"{r['mean_output_tokens']:.0f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--model", "-m", help="catalog name or .gguf path (default: the catalog's "
                    "default model)")
    ap.add_argument("--llama-server", default=shutil.which("llama-server"),
                    help="path to llama.cpp's llama-server binary (default: on PATH)")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma list, in order")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests", type=int, help="requests per run (default 2x concurrency)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=1800.0, help="per-request timeout, s")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    a = ap.parse_args(argv)
    from localinfer.catalog import Catalog

    a.model = str(Catalog.load().resolve(a.model, progress=True).resolve())
    levels = [int(c) for c in a.concurrency.split(",")]
    names = [n.strip() for n in a.peers.split(",") if n.strip()]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="localinfer-serve-peers-") as tmp:
        logdir = Path(os.environ.get("LOCALINFER_BENCH_LOGS", tmp))
        logdir.mkdir(parents=True, exist_ok=True)
        for name in names:
            port = free_port()
            rows += bench_peer(peer_command(name, a, port, max(levels)), a, port, levels,
                               logdir)
    print(f"serving benchmark: {Path(a.model).name}, {a.threads} threads, prompts "
          f"~{a.prompt_len} tokens, {a.max_tokens} output tokens, streamed /v1/completions")
    print(table(rows))
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all("error" not in r and r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
