"""ServerState: the model, the engine loop and the server's lifecycle flags, shared by routes."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.server.config import ServerConfig
from localinfer.server.metrics import ServerMetrics
from localinfer.server.protocol import APIError, unavailable

if TYPE_CHECKING:
    from localinfer.engine.engine_loop import EngineLoop


@dataclass
class ServerState:
    config: ServerConfig
    model_id: str
    metrics: ServerMetrics
    llm: Any = None  # localinfer.llm.LLM once loaded
    loop: EngineLoop | None = None
    model_path: Path | None = None
    load_error: str | None = None
    draining: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def ready(self) -> bool:
        return self.loop is not None and self.load_error is None

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def max_model_len(self) -> int:
        assert self.llm is not None
        return int(self.llm.engine.max_model_len)

    @property
    def system_fingerprint(self) -> str:
        from localinfer import __version__

        return f"localinfer-{__version__}-{self.config.backend}"

    def model_names(self) -> set[str]:
        names = {self.model_id}
        if self.model_path is not None:
            names |= {self.model_path.name, self.model_path.stem, str(self.model_path)}
        if self.config.model:
            names.add(self.config.model)
        return names

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names():
            raise APIError(404, f"The model '{model}' does not exist; this server serves "
                           f"'{self.model_id}'", param="model", code="model_not_found")

    def require_ready(self) -> EngineLoop:
        if self.draining:
            raise unavailable("the server is shutting down")
        if self.load_error is not None:
            raise APIError(503, f"the model failed to load: {self.load_error}")
        if self.loop is None:
            raise unavailable("the model is still loading", retry_after=2)
        return self.loop

    def begin(self) -> None:
        """Count a generation request as in flight (SIGTERM waits for these)."""
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()
