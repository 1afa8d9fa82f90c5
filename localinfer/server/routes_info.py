"""GET /health, /metrics, /v1/models; POST /tokenize, /detokenize."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localinfer.server.metrics import CONTENT_TYPE
from localinfer.server.prompts import chat_prompt, check_token_ids
from localinfer.server.protocol import get_bool, invalid
from localinfer.server.security import read_json
from localinfer.server.state import ServerState


def _state(request: Request) -> ServerState:
    return request.app.state.server


async def health(request: Request) -> Response:
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
    state = _state(request)
    card: dict[str, object] = {"id": state.model_id, "object": "model",
                               "created": state.created, "owned_by": "localinfer"}
    if state.llm is not None:
        card["max_model_len"] = state.max_model_len
    return JSONResponse({"object": "list", "data": [card]})


async def tokenize(request: Request) -> Response:
    state = _state(request)
    body = await read_json(request, state.config.max_body_bytes)
    state.require_ready()
    model = body.get("model")
    state.check_model(model if isinstance(model, str) else None)
    add_special = get_bool(body, "add_special_tokens", True)
    if "messages" in body:
        ids = chat_prompt(state.llm, body["messages"])
    elif isinstance(body.get("prompt"), str):
        ids = state.llm.tokenizer.encode(body["prompt"], add_special=add_special,
                                         parse_special=False)
    else:
        raise invalid("prompt", "send 'prompt' (a string) or 'messages'")
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len})


async def detokenize(request: Request) -> Response:
    state = _state(request)
    body = await read_json(request, state.config.max_body_bytes)
    state.require_ready()
    ids = check_token_ids(state.llm, body.get("tokens"), "tokens")
    return JSONResponse({"prompt": state.llm.tokenizer.decode(ids)})
