"""The loaded models: GET /api/ps (Ollama's shape, plus a `localinfer` object per model with
memory, KV use, requests in flight and keep-alive) and POST /api/unload (ours: `localinfer stop`
calls it; `{"model": NAME}` unloads the model now, or when its running requests finish)."""

from __future__ import annotations

import datetime
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localinfer.server.models.slot import ModelSlot, SlotState
from localinfer.server.ollama.shapes import card, model_field, ollama_errors, tagged
from localinfer.server.state import ServerState, read_body

# what Ollama reports for a model that never expires
FAR_FUTURE = "2318-01-01T00:00:00+00:00"


@ollama_errors
async def ps(request: Request) -> Response:
    state: ServerState = request.app.state.server
    entries = []
    for slot in list(state.pool.slots.values()):
        if slot.state is SlotState.READY:
            entries.append(await _entry(state, slot))
    return JSONResponse({"models": entries})


async def _entry(state: ServerState, slot: ModelSlot) -> dict[str, Any]:
    c = await card(slot.model, slot.llm.path)
    held = state.pool.plan.held(slot)
    stats = slot.loop.stats() if slot.loop is not None else None
    left = slot.expires_in()
    if slot.keep_alive is None:
        expires_at = FAR_FUTURE
    else:  # busy: the keep-alive counts from now, as Ollama shows it
        seconds = slot.keep_alive if left is None else left
        expires_at = _iso(time.time() + seconds)
    need = slot.need
    return {"name": tagged(slot.id), "model": tagged(slot.id), "size": held,
            "digest": c.digest, "details": c.details, "expires_at": expires_at,
            "size_vram": 0, "context_length": slot.max_model_len,
            "localinfer": {
                "in_flight": slot.in_flight, "keep_alive_s": slot.keep_alive,
                "expires_in_s": left, "loaded_at": _iso(slot.loaded_at),
                "weights_bytes": need.weights_bytes if need else None,
                "kv_bytes": need.kv_bytes if need else None,
                "kv_blocks_used": stats.kv_blocks_used if stats else 0,
                "kv_blocks_total": stats.kv_blocks_total if stats else 0,
                "budget_bytes": state.pool.plan.budget}}


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).astimezone().isoformat()


@ollama_errors
async def unload(request: Request) -> Response:
    state, body = await read_body(request)
    name = model_field(body)
    unloaded, pending = await state.pool.unload_name(name)
    return JSONResponse({"model": name, "unloaded": unloaded, "pending": pending})


ROUTES = [
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/unload", unload, methods=["POST"]),
]
