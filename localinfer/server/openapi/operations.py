"""Every route's OpenAPI operation: its request body and the answers it can give.

OPERATIONS is keyed by (path, method) with the OpenAI routes under their bare path; the
document (document.py) lists them under /v1 and bare, as app.py routes them. Errors: the OpenAI
routes answer `{"error": {message, type, param, code}}`; the Ollama routes `{"error": "..."}`,
except the guard's refusals (Host, API key, a declared body over the limit), which come before
any route and are OpenAI-shaped everywhere.
"""

from __future__ import annotations

from typing import Any

from localinfer.server.openapi import schemas as s

Operation = dict[str, Any]

JSON = "application/json"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
METRICS = "text/plain"

# the client mistakes and refusals any route with a JSON body can answer
_BODY_ERRORS = {
    "400": "invalid request (not JSON, a field out of range, a prompt over the context...)",
    "401": "missing or wrong API key",
    "403": "Host header not allowed",
    "404": "unknown model",
    "413": "request body over the limit",
    "415": "content type other than application/json",
}
_BUSY = {"429": "queue full (Retry-After)",
         "503": "shutting down, or no memory for the model (Retry-After)"}
_GUARD = {"401": _BODY_ERRORS["401"], "403": _BODY_ERRORS["403"]}


def _content(schema: s.Schema, *streams: str) -> dict[str, Any]:
    """JSON with `schema`, or one of `streams`: server-sent events (each with `data`, the
    answer's chunks as JSON, then `[DONE]`) or NDJSON lines."""
    content: dict[str, Any] = {JSON: {"schema": schema}}
    for media in streams:
        content[media] = {"schema": s.SSE_EVENT if media == SSE else {"type": "string"}}
    return content


def _errors(codes: dict[str, str], ollama: bool) -> dict[str, Any]:
    schema = {"anyOf": [s.OLLAMA_ERROR, s.OPENAI_ERROR]} if ollama else s.OPENAI_ERROR
    return {code: {"description": text, "content": _content(schema)}
            for code, text in codes.items()}


def operation(summary: str, tag: str, *, request: s.Schema | None = None,
              ok: s.Schema | None = None, streams: tuple[str, ...] = (),
              errors: dict[str, str] | None = None, ollama: bool = False,
              ok_content: dict[str, Any] | None = None,
              extra: dict[str, Any] | None = None) -> Operation:
    """One operation; `errors` default to the body errors when there is a request body."""
    if errors is None:
        errors = dict(_BODY_ERRORS) if request is not None else dict(_GUARD)
    responses: dict[str, Any] = {"200": {"description": "success"}}
    if ok_content is not None:
        responses["200"]["content"] = ok_content
    elif ok is not None:
        responses["200"]["content"] = _content(ok, *streams)
    responses.update(_errors(errors, ollama))
    responses.update(extra or {})
    op: Operation = {"summary": summary, "tags": [tag], "responses": responses}
    if request is not None:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": request}}}
    return op


_GENERATE = {**_BODY_ERRORS, **_BUSY}
_OLLAMA_BUSY = {**_BODY_ERRORS, **_BUSY}
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("/chat/completions", "POST"): operation(
        "chat completion (OpenAI)", "openai", request=s.CHAT_REQUEST, ok=s.COMPLETION,
        streams=(SSE,), errors=_GENERATE),
    ("/completions", "POST"): operation(
        "text completion (OpenAI legacy; `suffix` for fill-in-the-middle)", "openai",
        request=s.COMPLETION_REQUEST, ok=s.COMPLETION, streams=(SSE,), errors=_GENERATE),
    ("/models", "GET"): operation("the models this server can serve", "openai",
                                  ok=s.MODEL_LIST),
    ("/responses", "POST"): operation(
        "Responses API (OpenAI); nothing is stored", "openai", request=s.RESPONSES_REQUEST,
        ok=s.RESPONSE, streams=(SSE,), errors=_GENERATE),
    ("/infill", "POST"): operation(
        "code infill (llama.cpp's /infill)", "llama.cpp", request=s.INFILL_REQUEST,
        ok=s.INFILL, streams=(SSE,), errors=_GENERATE),
    ("/health", "GET"): operation(
        "readiness (public: no API key needed)", "server", ok=s.HEALTH, errors={},
        extra={"503": {"description": "loading, draining or the model failed to load",
                       "content": _content(s.HEALTH)}}),
    ("/metrics", "GET"): operation(
        "Prometheus metrics", "server",
        ok_content={METRICS: {"schema": {"type": "string"}}}),
    ("/tokenize", "POST"): operation(
        "a prompt or messages as token ids", "llama.cpp", request=s.TOKENIZE_REQUEST,
        ok=s.TOKENS, errors=_GENERATE),
    ("/detokenize", "POST"): operation(
        "token ids as text", "llama.cpp", request=s.DETOKENIZE_REQUEST, ok=s.DETOKENIZED,
        errors=_GENERATE),
    ("/openapi.json", "GET"): operation(
        "this description", "server", ok={"type": "object", "required": ["openapi", "paths"]}),
    # -- Ollama -------------------------------------------------------------------------------
    ("/api/version", "GET"): operation("the Ollama API version followed", "ollama",
                                       ok=s.OLLAMA_VERSION, ollama=True),
    ("/api/tags", "GET"): operation("pulled models (Ollama)", "ollama", ok=s.OLLAMA_MODELS,
                                    ollama=True),
    ("/api/show", "POST"): operation("a model's card (Ollama)", "ollama",
                                     request=s.OLLAMA_NAME_REQUEST, ok=s.OLLAMA_SHOW,
                                     ollama=True),
    ("/api/pull", "POST"): operation(
        "pull a catalog model (Ollama; NDJSON progress unless stream is false)", "ollama",
        request=s.OLLAMA_NAME_REQUEST, ok=s.OLLAMA_PULL, streams=(NDJSON,), ollama=True,
        extra={"500": {"description": "the download failed (Ollama's answer)",
                       "content": _content(s.OLLAMA_ERROR)}}),
    ("/api/delete", "DELETE"): operation(
        "delete a pulled catalog model (Ollama); 409 while it is loaded", "ollama",
        request=s.OLLAMA_NAME_REQUEST, ollama=True,
        errors={**_BODY_ERRORS, "409": "the model is loaded in this server"}),
    ("/api/chat", "POST"): operation(
        "chat (Ollama; NDJSON unless stream is false)", "ollama",
        request=s.OLLAMA_CHAT_REQUEST, ok=s.OLLAMA_ANSWER, streams=(NDJSON,),
        errors=_OLLAMA_BUSY, ollama=True),
    ("/api/generate", "POST"): operation(
        "generate (Ollama; NDJSON unless stream is false)", "ollama",
        request=s.OLLAMA_GENERATE_REQUEST, ok=s.OLLAMA_ANSWER, streams=(NDJSON,),
        errors=_OLLAMA_BUSY, ollama=True),
    ("/api/ps", "GET"): operation("loaded models (Ollama, plus a `localinfer` object)",
                                  "ollama", ok=s.OLLAMA_MODELS, ollama=True),
    ("/api/unload", "POST"): operation(
        "unload a model now, or when its running requests finish (localinfer stop)",
        "localinfer", request=s.OLLAMA_NAME_REQUEST, ok=s.UNLOADED, ollama=True),
}
