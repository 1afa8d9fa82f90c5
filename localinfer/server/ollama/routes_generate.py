"""POST /api/chat and POST /api/generate: Ollama's generation routes on the one engine path.

The request is mapped onto the fields the OpenAI routes use (options.py: `options`,
`format`, `tools`; prompts.py: `messages`, `prompt`, `system`, `suffix`, `raw`), takes
its model through `state.acquire` (with `keep_alive`), runs as a generation Job and answers as
Ollama does (answers.py): NDJSON lines by default, one object with `"stream": false`.
Errors are `{"error": "..."}` with a 4xx status, before any line is sent.

As in Ollama, a request without a prompt (generate) or without messages (chat) only loads the
model, or with `keep_alive: 0` unloads it (`done_reason` "load" / "unload").
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localinfer.errors import InvalidRequestError
from localinfer.server.generation import Job, refuse_if_busy
from localinfer.server.models.keep_alive import parse_keep_alive
from localinfer.server.ollama.answers import OllamaReply, created_at
from localinfer.server.ollama.options import generation_fields
from localinfer.server.ollama.prompts import chat_ids, generate_ids
from localinfer.server.ollama.shapes import model_field, ollama_errors
from localinfer.server.prompts import check_context
from localinfer.server.protocol import get_bool, invalid
from localinfer.server.routes_generate import compile_constraint_of
from localinfer.server.state import ServerState, read_body
from localinfer.server.streaming import whole_answer


@ollama_errors
async def chat(request: Request) -> Response:
    return await _answer(request, chat=True)


@ollama_errors
async def generate(request: Request) -> Response:
    return await _answer(request, chat=False)


async def _answer(request: Request, *, chat: bool) -> Response:
    started = time.perf_counter()
    state, body = await read_body(request)
    name = model_field(body)
    stream = get_bool(body, "stream", True)
    _refuse_unsupported(body, name)
    if not (body.get("messages") if chat else body.get("prompt") or body.get("suffix")):
        return await _load_or_unload(state, body, name, chat)
    lease = await state.acquire(name, body.get("keep_alive"))
    load_s = time.perf_counter() - started
    with lease.released_on_error():  # until the job takes the lease over
        refuse_if_busy(lease)
        llm = lease.llm
        fields = generation_fields(body, llm, lease.max_model_len, name, tools=chat)
        fields.bind_tools(llm.tokenizer)
        if chat:
            ids = await chat_ids(llm, body.get("messages"), fields.constraints.tools)
        else:
            ids = await generate_ids(llm, body, name)
        check_context(len(ids), lease.max_model_len, "messages" if chat else "prompt")
        await compile_constraint_of(llm, fields)
        job = Job.submit(state, lease, "ollama", [ids], fields)
    reply = OllamaReply(job, name, chat=chat, tools=fields.constraints.tools is not None,
                        started=started, load_s=load_s)
    if stream:
        return reply.stream()
    return await whole_answer(request, job, reply.whole)


def _refuse_unsupported(body: dict[str, Any], name: str) -> None:
    """Fields that would change the answer are refused, never ignored."""
    if body.get("think") not in (None, False):
        raise invalid("think", f"'think': model '{name}' does not support thinking")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise invalid("logprobs", "'logprobs' is not supported on the Ollama routes; "
                      "/v1/chat/completions returns logprobs")


async def _load_or_unload(state: ServerState, body: dict[str, Any], name: str,
                          chat: bool) -> Response:
    keep_alive = body.get("keep_alive")
    try:
        unload = keep_alive is not None and parse_keep_alive(keep_alive) == 0
    except InvalidRequestError as exc:
        raise invalid("keep_alive", str(exc)) from exc
    if unload:
        await state.pool.unload_name(name)  # now, or when its running requests finish
    else:
        with await state.acquire(name, keep_alive):
            pass  # loaded (and its keep-alive set); nothing to generate
    answer: dict[str, Any] = {"model": name, "created_at": created_at()}
    if chat:
        answer["message"] = {"role": "assistant", "content": ""}
    else:
        answer["response"] = ""
    answer.update({"done": True, "done_reason": "unload" if unload else "load"})
    return JSONResponse(answer)


ROUTES = [
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
]
