"""POST /v1/chat/completions and POST /v1/completions."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localinfer.server.constraints import compile_constraint
from localinfer.server.formatting import Formatter
from localinfer.server.generation import ClientGone, Job, until_disconnect
from localinfer.server.model_slot import Lease
from localinfer.server.prompts import chat_prompt, check_context, completion_prompts
from localinfer.server.protocol import GenerationFields, parse_generation
from localinfer.server.security import read_json
from localinfer.server.state import ServerState
from localinfer.server.streaming import sse_response

CLIENT_CLOSED = 499  # nginx's "client closed request"; nobody reads it


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await read_json(request, state.config.max_body_bytes)
    lease = await state.acquire(body.get("model"), body.get("keep_alive"))
    with lease.released_on_error():  # until the job takes the lease over
        fields = parse_generation(body, chat=True, max_model_len=lease.max_model_len)
        fields.constraints.bind_tools(lease.llm.tokenizer)
        fields.params.structured = fields.constraints.structured
        ids = await asyncio.to_thread(chat_prompt, lease.llm, body.get("messages"),
                                      fields.constraints.tools)
        check_context(len(ids), lease.max_model_len, "messages")
        await _compile(lease, fields)
        return await _generate(request, state, lease, [ids], fields, chat=True)


async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await read_json(request, state.config.max_body_bytes)
    lease = await state.acquire(body.get("model"), body.get("keep_alive"))
    with lease.released_on_error():
        fields = parse_generation(body, chat=False, max_model_len=lease.max_model_len)
        prompts = await asyncio.to_thread(completion_prompts, lease.llm, body.get("prompt"))
        for ids in prompts:
            check_context(len(ids), lease.max_model_len, "prompt")
        await _compile(lease, fields)
        return await _generate(request, state, lease, prompts, fields, chat=False)


async def _compile(lease: Lease, fields: GenerationFields) -> None:
    """Compile the request's constraint on a worker thread (400 if it cannot be enforced);
    the engine thread then only copies the compiled matcher."""
    spec = fields.params.structured
    if spec is not None:
        await asyncio.to_thread(compile_constraint, lease.llm.engine.guides, spec,
                                fields.constraints.param)


async def _generate(request: Request, state: ServerState, lease: Lease,
                    prompts: list[list[int]], fields: GenerationFields, *, chat: bool
                    ) -> Response:
    job = Job.submit(state, lease, "chatcmpl" if chat else "cmpl", prompts, fields)
    fmt = Formatter(job, fields.model or lease.model_id, chat, fields.logprobs is not None,
                    tools=fields.constraints.tools)
    if fields.stream:
        return sse_response(job, fmt, fields.include_usage)
    try:
        await until_disconnect(request.receive, job.collect())
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        job.close()
    return JSONResponse(fmt.response())
