"""Server-sent events for `stream: true`: OpenAI chunks, then `data: [DONE]`.

Errors are checked before the first byte (context length, bad tokens, queue full); one that
happens later — the engine raising mid-stream, a shutdown abort — becomes an error event
followed by `[DONE]`. When the client goes away Starlette cancels this generator, whose
`finally` aborts the sequences at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localinfer.server.formatting import Formatter
from localinfer.server.generation import ChoiceState, ClientGone, Job, until_disconnect
from localinfer.server.protocol import APIError

log = logging.getLogger("localinfer.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CLIENT_CLOSED = 499  # nginx's "client closed request"; nobody reads it


async def whole_answer(request: Request, job: Job,
                       body: Callable[[list[ChoiceState]], dict[str, Any]]) -> Response:
    """A non-streamed answer: the body built from the finished choices, unless the client
    went away first; the job is closed either way."""
    try:
        choices = await until_disconnect(request.receive, job.collect())
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        job.close()
    return JSONResponse(body(choices))


def event_stream(job: Job, events: AsyncIterator[str]) -> StreamingResponse:
    # the background task also closes the job if the stream never started (early disconnect)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS,
                             background=BackgroundTask(job.close))


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def sse_response(job: Job, fmt: Formatter, include_usage: bool) -> StreamingResponse:
    return event_stream(job, events(job, fmt, include_usage))


async def events(job: Job, fmt: Formatter, include_usage: bool) -> AsyncIterator[str]:
    try:
        if fmt.chat:
            for c in job.choices:
                yield sse(fmt.role_chunk(c.index, include_usage))
        echoed: set[int] = set()
        async for choice, out in job.outputs():
            if fmt.echoes and choice.index not in echoed:
                echoed.add(choice.index)  # the prompt's logprobs came with this first output
                yield sse(fmt.echo_chunk(choice, include_usage))
            if not choice.keep_output:  # echo with max_tokens 0: only the prompt is answered
                if out.finished:
                    yield sse(fmt.chunk(choice.index, None, None, choice.finish_reason,
                                        usage_null=include_usage))
                continue
            lp = out.logprobs if fmt.want_logprobs else None
            if fmt.parsers:
                deltas = fmt.tool_deltas(choice.index, out.text, out.finished)
                if lp and not deltas:
                    deltas = [{}]
                for k, delta in enumerate(deltas):
                    yield sse(fmt.delta_chunk(choice.index, delta, lp if k == 0 else None,
                                              include_usage))
            elif out.text or lp:
                offset = fmt.text_base(choice) + len(choice.text) - len(out.text)
                yield sse(fmt.chunk(choice.index, out.text, lp, None, offset, include_usage))
            if out.finished:
                yield sse(fmt.chunk(choice.index, None, None, fmt.finish_reason(choice),
                                    usage_null=include_usage))
        if include_usage:
            yield sse(fmt.usage_chunk())
    except APIError as exc:
        log.warning("stream %s failed: %s", job.request_id, exc.message)
        yield sse(exc.body())
    except Exception as exc:  # never a broken stream without a reason
        log.exception("stream %s failed", job.request_id)
        yield sse(APIError(500, f"internal error: {exc}", type="server_error").body())
    finally:
        job.close()
    yield "data: [DONE]\n\n"
