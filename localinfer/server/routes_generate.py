"""POST /v1/chat/completions and POST /v1/completions."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localinfer.server.constraints import compile_constraint
from localinfer.server.echo import EchoedPrompt, prompt_texts
from localinfer.server.fim import fim_prompt, require_fim
from localinfer.server.formatting import Formatter
from localinfer.server.generation import Job, refuse_if_busy
from localinfer.server.models.slot import Lease
from localinfer.server.prompts import chat_prompt, check_context, completion_prompts
from localinfer.server.protocol import GenerationFields, invalid, parse_generation
from localinfer.server.state import ServerState, read_body
from localinfer.server.streaming import sse_response, whole_answer


async def chat_completions(request: Request) -> Response:
    state, body = await read_body(request)
    lease = await state.acquire(body.get("model"), body.get("keep_alive"))
    with lease.released_on_error():  # until the job takes the lease over
        refuse_if_busy(lease)
        fields = parse_generation(body, chat=True, max_model_len=lease.max_model_len,
                                  n_vocab=lease.llm.tokenizer.n_vocab)
        fields.bind_tools(lease.llm.tokenizer)
        ids = await asyncio.to_thread(chat_prompt, lease.llm, body.get("messages"),
                                      fields.constraints.tools)
        check_context(len(ids), lease.max_model_len, "messages")
        await compile_constraint_of(lease.llm, fields)
        return await _generate(request, state, lease, [ids], fields, chat=True)


async def completions(request: Request) -> Response:
    state, body = await read_body(request)
    lease = await state.acquire(body.get("model"), body.get("keep_alive"))
    with lease.released_on_error():
        refuse_if_busy(lease)
        llm = lease.llm
        fields = parse_generation(body, chat=False, max_model_len=lease.max_model_len,
                                  n_vocab=llm.tokenizer.n_vocab)
        suffix = body.get("suffix")
        if suffix is not None:
            prompts = _fim_prompts(llm, fields, body.get("prompt"), suffix,
                                   fields.model or lease.model_id)
        else:
            prompts = await asyncio.to_thread(completion_prompts, llm, body.get("prompt"))
        for ids in prompts:
            check_context(len(ids), lease.max_model_len, "prompt")
        echoes = None
        if fields.echo:
            texts = prompt_texts(llm, body.get("prompt"), prompts)
            echoes = [EchoedPrompt(t, ids, llm.tokenizer)
                      for t, ids in zip(texts, prompts, strict=True)]
        await compile_constraint_of(llm, fields)
        return await _generate(request, state, lease, prompts, fields, chat=False,
                               echoes=echoes)


def _fim_prompts(llm: Any, fields: GenerationFields, prompt: Any, suffix: Any,
                 model: str) -> list[list[int]]:
    """`suffix`: each prompt is the code before the cursor, `suffix` the code after it."""
    if not isinstance(suffix, str):
        raise invalid("suffix", "'suffix' must be a string")
    if fields.echo:
        raise invalid("echo", "'echo' cannot be combined with 'suffix'")
    fim = require_fim(llm, model, "suffix")
    prefixes = [prompt] if isinstance(prompt, str) else prompt
    if not (isinstance(prefixes, list) and prefixes
            and all(isinstance(p, str) for p in prefixes)):
        raise invalid("prompt", "with 'suffix', 'prompt' must be a string (the code before "
                      "the cursor) or a list of strings")
    return [fim_prompt(llm, fim, p, suffix) for p in prefixes]


async def compile_constraint_of(llm: Any, fields: GenerationFields) -> None:
    """Compile the request's constraint on a worker thread (400 if it cannot be enforced);
    the engine thread then only copies the compiled matcher."""
    spec = fields.params.structured
    if spec is not None:
        await asyncio.to_thread(compile_constraint, llm.engine.guides, spec,
                                fields.constraints.param)


async def _generate(request: Request, state: ServerState, lease: Lease,
                    prompts: list[list[int]], fields: GenerationFields, *, chat: bool,
                    echoes: list[EchoedPrompt] | None = None) -> Response:
    job = Job.submit(state, lease, "chatcmpl" if chat else "cmpl", prompts, fields)
    fmt = Formatter(job, fields.model or lease.model_id, chat, fields.logprobs is not None,
                    tools=fields.constraints.tools, echoes=echoes)
    if fields.stream:
        return sse_response(job, fmt, fields.include_usage)
    return await whole_answer(request, job, lambda _: fmt.response())
