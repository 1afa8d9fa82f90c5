"""A server for `localinfer fuzz http` to fuzz when no --url is given: `build_server` (what
`localinfer serve` runs) on a free loopback port, in a thread of this process.

Its catalog's model folder is an empty temporary one: the fuzzer calls /api/delete and
/api/pull, which must never touch the user's pulled models (the served model is given by path).
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from localinfer.catalog import Catalog
from localinfer.errors import LocalInferError
from localinfer.server.config import ServerConfig
from localinfer.server.runner import build_server

READY_TIMEOUT_S = 600.0  # a cold kernel compile on a busy machine is slow


@contextlib.contextmanager
def own_server(model: str, *, max_model_len: int = 256, threads: int | None = None
               ) -> Iterator[str]:
    """Serve `model` (a catalog name or a .gguf path) until the block ends; yields its URL."""
    path = Catalog.load().resolve(model)
    with tempfile.TemporaryDirectory(prefix="localinfer-fuzz-") as empty:
        catalog = Catalog.load(models_dir=Path(empty))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = ServerConfig(model=str(path), served_model_name=Path(model).stem, port=port,
                              max_model_len=max_model_len, threads=threads,
                              log_level="error")
        server = build_server(config, model_path=path, catalog=catalog)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, thread)
            yield url
        finally:
            server.should_exit = True
            thread.join(timeout=30)


def _wait_ready(url: str, thread: threading.Thread) -> None:
    end = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < end:
        if not thread.is_alive():
            raise LocalInferError("the fuzzed server stopped before it was ready")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise LocalInferError(f"the fuzzed server was not ready after {READY_TIMEOUT_S:.0f} s")
