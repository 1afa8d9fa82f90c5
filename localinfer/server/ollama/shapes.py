"""The Ollama API's shapes shared by its routes: error bodies `{"error": "..."}`, tagged
names, a model's list entry (/api/tags, /api/ps), and reading a request body.

Ollama names carry a tag (`smollm2-135m:latest`); requests may send either form (see
models/served.py), answers use the tagged one as Ollama does.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localinfer.server.models.cards import ModelCard, card_for
from localinfer.server.models.served import ServedModel
from localinfer.server.protocol import APIError

# the Ollama release whose API these routes follow (clients such as VS Code's Ollama provider
# check it); our own version is reported beside it
OLLAMA_API_VERSION = "0.9.0"
_cards: dict[tuple[str, str, int, int], ModelCard] = {}

Handler = Callable[[Request], Awaitable[Response]]


def ollama_errors(handler: Handler) -> Handler:
    """Answer an APIError as Ollama does: `{"error": message}` with the HTTP status."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status,
                                headers=exc.headers)

    return wrapped


def tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def model_field(body: dict[str, Any]) -> str:
    """The request's model name (`model`, or the older `name`)."""
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise APIError(400, "'model' must be a model name (a string)")
    return name


async def card(model: ServedModel, path: Path) -> ModelCard:
    """The model's card, read once per file version."""
    st = path.stat()
    key = (model.id, str(path), st.st_size, st.st_mtime_ns)
    if key not in _cards:
        _cards[key] = await asyncio.to_thread(card_for, model, path)
    return _cards[key]


def list_entry(model: ServedModel, c: ModelCard) -> dict[str, Any]:
    return {"name": tagged(model.id), "model": tagged(model.id), "modified_at": c.modified_at,
            "size": c.size, "digest": c.digest, "details": c.details}
