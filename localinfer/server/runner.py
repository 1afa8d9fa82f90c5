"""Run the app under uvicorn with a draining shutdown.

SIGTERM (or Ctrl-C): stop taking generation requests (503 + Retry-After; /health 503), let
in-flight ones finish for up to `drain_timeout` seconds, abort the rest, then let uvicorn close
connections and run the app's shutdown (EngineLoop.shutdown). A second signal exits at once.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from localinfer.catalog import Catalog
from localinfer.server.app import create_app
from localinfer.server.config import ServerConfig
from localinfer.server.state import ServerState

log = logging.getLogger("localinfer.server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self.failed = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # unlike uvicorn's, this does not re-raise the signal afterwards: the exit is clean
        if self.state.draining or self.should_exit:
            self.should_exit = True
            self.force_exit = True
            return
        self.begin_drain()

    def begin_drain(self) -> None:
        self.state.draining = True
        threading.Thread(target=self._drain, name="localinfer-drain", daemon=True).start()

    def _drain(self) -> None:
        log.info("draining %d in-flight request(s) (up to %.0f s)", self.state.in_flight,
                 self.drain_timeout)
        deadline = time.monotonic() + self.drain_timeout
        while self.state.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.state.in_flight:
            log.warning("drain timeout: aborting %d request(s)", self.state.in_flight)
            self.state.pool.abort_all()
        self.should_exit = True

    def fail(self) -> None:
        self.failed = True
        self.should_exit = True


def build_server(config: ServerConfig, model_path: Path | None = None,
                 catalog: Catalog | None = None, **uvicorn_kwargs: Any) -> DrainingServer:
    holder: list[DrainingServer] = []
    app = create_app(config, model_path=model_path, on_load_error=lambda: holder[0].fail(),
                     catalog=catalog)
    uv_config = uvicorn.Config(app, host=config.host, port=config.port,
                               log_level=config.log_level, timeout_graceful_shutdown=5,
                               **uvicorn_kwargs)
    server = DrainingServer(uv_config, app.state.server, config.drain_timeout)
    holder.append(server)
    return server
