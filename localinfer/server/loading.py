"""The default model's preload at start, so the socket is up (and /health answers 503) while
weights load and kernels compile; other models load on first use (models/pool.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from localinfer.server.state import ServerState

log = logging.getLogger("localinfer.server")


async def preload(state: ServerState, on_error: Callable[[], None] | None = None) -> None:
    default = state.served.default
    error = await state.pool.preload(default) if default is not None else None
    if error is not None:
        state.load_error = error.message
        log.error("%s", error.message)
        if on_error is not None:
            on_error()
    state.preloaded = True


def warm_structured(llm: Any) -> None:
    """llguidance's view of the vocabulary (~1 s for 151k tokens) and the mask kernel."""
    try:
        llm.engine.guides.warm_up()
    except Exception:  # the first constrained request reports it
        log.exception("warming up structured output failed")
