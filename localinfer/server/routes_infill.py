"""POST /infill: llama.cpp's code-infill route for editor plugins (llama.vim, llama.vscode).

Request (llama-server's README): `input_prefix`, `input_suffix`, `input_extra` (an array of
{filename, text}), `prompt` (added after the FIM middle token), and /completion's options:
`n_predict`, `temperature`, `top_k`, `top_p`, `min_p`, `seed`, `stop`, `repeat_penalty`,
`presence_penalty`, `frequency_penalty`, `stream`. Plugin hints that do not change the
answer (t_max_prompt_ms, cache_prompt, samplers, response_fields...) are ignored, as in
llama-server. The answer is /completion's shape: {content, stop, stop_type,
tokens_predicted, tokens_evaluated, ...}; streamed, one such object per SSE event and a last
one with stop true.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localinfer.server.fim import fim_prompt, parse_extra, require_fim
from localinfer.server.generation import ChoiceState, Job, refuse_if_busy
from localinfer.server.prompts import check_context
from localinfer.server.protocol import APIError, invalid, parse_generation
from localinfer.server.state import read_body
from localinfer.server.streaming import event_stream, whole_answer

# llama.cpp's /completion names -> ours; n_predict -1 means "until the context is full"
_RENAMES = {"n_predict": "max_tokens", "repeat_penalty": "repetition_penalty"}


async def infill(request: Request) -> Response:
    state, body = await read_body(request)
    lease = await state.acquire(body.get("model"), body.get("keep_alive"))
    with lease.released_on_error():  # until the job takes the lease over
        refuse_if_busy(lease)
        llm = lease.llm
        texts = {}
        for name in ("input_prefix", "input_suffix", "prompt"):
            value = body.get(name, "")
            if not isinstance(value, str):
                raise invalid(name, f"'{name}' must be a string")
            texts[name] = value
        fields = parse_generation(_as_completion(body, lease.max_model_len), chat=False,
                                  max_model_len=lease.max_model_len,
                                  n_vocab=llm.tokenizer.n_vocab)
        model = fields.model or lease.model_id
        fim = require_fim(llm, model, "input_suffix")
        ids = fim_prompt(llm, fim, texts["input_prefix"], texts["input_suffix"],
                         middle=texts["prompt"], extra=parse_extra(body.get("input_extra")))
        check_context(len(ids), lease.max_model_len, "input_prefix")
        job = Job.submit(state, lease, "infill", [ids], fields)
    if fields.stream:
        return event_stream(job, _events(job, model))
    return await whole_answer(request, job,
                              lambda choices: _final(job, choices[0], model, choices[0].text))


def _as_completion(body: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """The request as /v1/completions fields (n_predict -> max_tokens...)."""
    fields = {k: v for k, v in body.items()
              if k not in ("input_prefix", "input_suffix", "input_extra", "prompt", "n_predict",
                           "repeat_penalty")}
    for ours_of, ours in _RENAMES.items():
        if body.get(ours_of) is not None:
            fields[ours] = body[ours_of]
    if fields.get("max_tokens") == -1 or "max_tokens" not in fields:
        fields["max_tokens"] = max_model_len  # llama-server's default: until it stops
    return fields


def _final(job: Job, choice: ChoiceState, model: str, content: str) -> dict[str, Any]:
    # "eos" also when a stop string ended it (llama-server says "word"; the engine's finish
    # reason does not tell the two apart)
    stop_type = {"stop": "eos", "length": "limit"}.get(choice.finish_reason or "", "none")
    return {"index": 0, "content": content, "model": model, "stop": True,
            "stop_type": stop_type, "tokens_predicted": choice.num_tokens,
            "tokens_evaluated": choice.num_prompt_tokens, "tokens_cached":
            choice.num_cached_tokens, "truncated": False}


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _events(job: Job, model: str) -> AsyncIterator[str]:
    try:
        async for choice, out in job.outputs():
            if out.text and not out.finished:
                yield _sse({"index": 0, "content": out.text, "stop": False})
            if out.finished:
                yield _sse(_final(job, choice, model, out.text))
    except APIError as exc:
        yield _sse(exc.body())
    finally:
        job.close()
