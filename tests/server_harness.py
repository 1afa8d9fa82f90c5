"""Test helpers for the HTTP server: a real uvicorn server on loopback in a thread, metrics."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from localinfer.server.config import ServerConfig
from localinfer.server.runner import DrainingServer, build_server
from localinfer.server.state import ServerState

READY_TIMEOUT = 600.0  # a cold kernel compile on a busy 2-core machine is slow


class ServerThread:
    """`build_server` (the same code `localinfer serve` runs) on a free loopback port."""

    def __init__(self, config: ServerConfig, model_path: Path | None,
                 catalog: Any = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config.port = self.port
        config.log_level = "warning"
        self.server: DrainingServer = build_server(config, model_path=model_path,
                                                   catalog=catalog)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def state(self) -> ServerState:
        return self.server.state

    def start(self, wait_ready: bool = True) -> ServerThread:
        self.thread.start()
        if wait_ready:
            wait_healthy(self.url)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout: float = READY_TIMEOUT, proc: Any = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}")
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200:
                return
            assert r.json().get("status") in ("loading", "draining"), r.text
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("server did not become healthy")


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def metrics(url: str, **headers: str) -> dict[str, float]:
    """Prometheus text -> {"name{labels}": value}; a name seen only with labels (the engine
    figures carry a `model` label) also gets {"name": sum over its label sets}."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    out: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            if m.group(2):
                sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
    for name, total in sums.items():
        out.setdefault(name, total)
    return out


def wait_idle(url: str, kv_baseline: float, timeout: float) -> float:
    """Seconds until /metrics shows nothing running or waiting and KV used at baseline."""
    start = time.monotonic()
    while True:
        m = metrics(url)
        if (m["localinfer_num_requests_running"] == 0
                and m["localinfer_num_requests_waiting"] == 0
                and m["localinfer_kv_blocks_used"] == kv_baseline):
            return time.monotonic() - start
        elapsed = time.monotonic() - start
        assert elapsed < timeout, f"not idle after {elapsed:.1f} s: {m}"
        time.sleep(0.02)


def sse_events(response: httpx.Response) -> list[str]:
    """The `data:` payloads of a streamed response, in order."""
    return [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
