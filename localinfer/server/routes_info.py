"""GET /health, /metrics, /v1/models; POST /tokenize, /detokenize."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localinfer.server.metrics import CONTENT_TYPE
from localinfer.server.models.slot import SlotState
from localinfer.server.prompts import chat_prompt, check_token_ids
from localinfer.server.protocol import get_bool, invalid
from localinfer.server.state import ServerState, read_body


def _state(request: Request) -> ServerState:
    return request.app.state.server


async def health(request: Request) -> Response:
    """Ready once the default model's preload is over; other models load on demand."""
    state = _state(request)
    if state.load_error is not None:
        return JSONResponse({"status": "error", "error": state.load_error}, status_code=503)
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503,
                            headers={"Retry-After": "1"})
    if not state.ready:
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "2"})
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


async def models(request: Request) -> Response:
    """Every model the server can serve; loaded ones say so, with their memory share."""
    state = _state(request)
    served = await asyncio.to_thread(state.served.all)  # looks at the model cache
    cards = []
    for model in served:
        card: dict[str, object] = {"id": model.id, "object": "model",
                                   "created": state.created, "owned_by": "localinfer",
                                   "loaded": False}
        slot = state.pool.slots.get(model.id)
        if slot is not None and slot.state is SlotState.READY:
            card.update(loaded=True, max_model_len=slot.max_model_len,
                        memory_bytes=state.pool.plan.held(slot))
        cards.append(card)
    return JSONResponse({"object": "list", "data": cards})


async def tokenize(request: Request) -> Response:
    state, body = await read_body(request)
    with await state.acquire(body.get("model")) as lease:
        add_special = get_bool(body, "add_special_tokens", True)
        if "messages" in body:
            ids = chat_prompt(lease.llm, body["messages"])
        elif isinstance(body.get("prompt"), str):
            ids = lease.llm.tokenizer.encode(body["prompt"], add_special=add_special,
                                             parse_special=False)
        else:
            raise invalid("prompt", "send 'prompt' (a string) or 'messages'")
        return JSONResponse({"tokens": ids, "count": len(ids),
                             "max_model_len": lease.max_model_len})


async def detokenize(request: Request) -> Response:
    state, body = await read_body(request)
    with await state.acquire(body.get("model")) as lease:
        ids = check_token_ids(lease.llm, body.get("tokens"), "tokens")
        return JSONResponse({"prompt": lease.llm.tokenizer.decode(ids)})
