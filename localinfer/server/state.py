"""ServerState: the model pool and the server's lifecycle flags, shared by routes.

Routes get a model with `lease = await state.acquire(request_model, keep_alive=...)` (see
models/pool.py and models/slot.Lease). `llm`, `loop`, `model_id` and `max_model_len` here name
the default model (the one a request without `model` gets), as a one-model server always had.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localinfer.errors import InvalidRequestError
from localinfer.server.config import ServerConfig
from localinfer.server.metrics import ServerMetrics
from localinfer.server.models.keep_alive import parse_keep_alive
from localinfer.server.models.pool import ModelPool
from localinfer.server.models.served import ServedModels
from localinfer.server.models.slot import Lease, ModelSlot
from localinfer.server.protocol import invalid, unavailable
from localinfer.server.security import read_json

if TYPE_CHECKING:
    from starlette.requests import Request

    from localinfer.engine.engine_loop import EngineLoop


@dataclass
class ServerState:
    config: ServerConfig
    served: ServedModels
    pool: ModelPool
    metrics: ServerMetrics
    load_error: str | None = None  # the default model's preload failed
    preloaded: bool = False  # the default model's preload is over (or there is none)
    draining: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    async def acquire(self, model: Any, keep_alive: Any = None) -> Lease:
        """A lease on the model a request names (None: the default), loaded if need be.
        `keep_alive` is the request's raw field (None: not sent). 400 for a bad field, 404
        for an unknown model, 503 while draining or when the memory plan has no room, the
        load's error if it failed."""
        if model is not None and not isinstance(model, str):
            raise invalid("model", "'model' must be a string")
        ka: float | None | str = "default"
        if keep_alive is not None:
            try:
                ka = parse_keep_alive(keep_alive)
            except InvalidRequestError as exc:
                raise invalid("keep_alive", str(exc)) from exc
        if self.draining:
            raise unavailable("the server is shutting down")
        return await self.pool.acquire(model, ka)

    @property
    def ready(self) -> bool:
        return self.preloaded and self.load_error is None

    @property
    def in_flight(self) -> int:
        return self.pool.in_flight

    @property
    def model_id(self) -> str:
        default = self.served.default
        return default.id if default is not None else ""

    @property
    def default_slot(self) -> ModelSlot | None:
        default = self.served.default
        return self.pool.slots.get(default.id) if default is not None else None

    @property
    def llm(self) -> Any:
        slot = self.default_slot
        return slot.llm if slot is not None else None

    @property
    def loop(self) -> EngineLoop | None:
        slot = self.default_slot
        return slot.loop if slot is not None else None

    @property
    def max_model_len(self) -> int:
        slot = self.default_slot
        assert slot is not None and slot.llm is not None
        return slot.max_model_len

    @property
    def system_fingerprint(self) -> str:
        from localinfer import __version__

        return f"localinfer-{__version__}-{self.config.backend}"


async def read_body(request: Request) -> tuple[ServerState, dict[str, Any]]:
    """The server's state and the request's JSON object body (size-capped, 400 if not JSON)."""
    state: ServerState = request.app.state.server
    return state, await read_json(request, state.config.max_body_bytes)
