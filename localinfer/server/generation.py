"""Feed one HTTP request's sequences to the engine loop and read their outputs back.

A request with several prompts and `n` choices becomes len(prompts) * n engine requests (the
prefix cache shares their prompt blocks). Whatever way the request ends — done, client gone,
error — every sequence is aborted in `Job.close`, so no KV block outlives its request, and the
job's lease on its model is released (the model may then expire or be evicted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from localinfer.engine.engine_loop import (
    EngineFailure,
    EngineStoppedError,
    QueueFullError,
    RequestHandle,
)
from localinfer.engine.outputs import RequestOutput, TokenLogprob
from localinfer.errors import InvalidRequestError
from localinfer.server.models.slot import Lease
from localinfer.server.protocol import APIError, GenerationFields, invalid, unavailable
from localinfer.server.state import ServerState

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


@dataclass(slots=True)
class ChoiceState:
    index: int
    prompt_index: int
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] | None = None  # echo: prompt tokens 1..
    first_token_time: float | None = None
    last_token_time: float | None = None
    # False for echo with max_tokens 0: the one token the engine samples after the prompt is
    # dropped (text, ids, logprobs) and the choice ends with "length"
    keep_output: bool = True

    def add(self, out: RequestOutput) -> None:
        now = time.perf_counter()
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_cached_tokens = out.num_cached_tokens
        if not self.keep_output:
            if out.finished:
                self.finish_reason = "length" if out.finish_reason == "stop" else (
                    out.finish_reason)
            return
        self.text += out.text
        if out.token_ids:
            self.num_tokens += len(out.token_ids)
            if self.first_token_time is None:
                self.first_token_time = now
            self.last_token_time = now
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.finished:
            self.finish_reason = out.finish_reason


@dataclass
class Job:
    state: ServerState
    lease: Lease  # the job's model; released in close
    request_id: str
    prompts: list[list[int]]
    handles: list[RequestHandle]
    choices: list[ChoiceState]
    arrival: float
    created: int = field(default_factory=lambda: int(time.time()))
    _closed: bool = False

    @classmethod
    def submit(cls, state: ServerState, lease: Lease, prefix: str, prompts: list[list[int]],
               fields: GenerationFields) -> Job:
        """Submit every sequence; the job takes the lease over (close releases it)."""
        if state.draining:
            lease.release()
            raise unavailable("the server is shutting down")
        loop = lease.loop
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        job = cls(state, lease, request_id, prompts, [], [], time.perf_counter())
        try:
            for p, ids in enumerate(prompts):
                for j in range(fields.n):
                    params = _params_for(fields, j)
                    index = p * fields.n + j
                    handle = loop.submit(ids, params, f"{request_id}-{index}", aio=True)
                    job.handles.append(handle)
                    job.choices.append(ChoiceState(index, p, num_prompt_tokens=len(ids),
                                                   keep_output=not fields.prompt_only))
        except (QueueFullError, EngineStoppedError) as exc:
            job.close()
            raise _refusal(exc) from exc
        except InvalidRequestError as exc:
            job.close()
            raise invalid(None, str(exc)) from exc
        except BaseException:
            job.close()
            raise
        return job

    def close(self) -> None:
        """Abort what is still running, record metrics; idempotent."""
        if self._closed:
            return
        self._closed = True
        for handle in self.handles:
            handle.abort()
        self.lease.release()
        now = time.perf_counter()
        for c in self.choices:
            if c.finish_reason in ("stop", "length"):
                self.state.metrics.observe(self.arrival, c.first_token_time,
                                           c.last_token_time or now, c.num_tokens)

    async def outputs(self) -> AsyncIterator[tuple[ChoiceState, RequestOutput]]:
        """Every choice's outputs, interleaved as they arrive; engine errors become APIError."""
        try:
            async for i, out in _merge(self.handles):
                choice = self.choices[i]
                choice.add(out)
                if out.finished and out.finish_reason == "abort":
                    raise unavailable("the request was aborted: the server is shutting down")
                yield choice, out
        except EngineFailure as exc:
            cause = exc.__cause__
            if isinstance(cause, InvalidRequestError):
                raise invalid(None, str(cause)) from exc
            raise APIError(500, f"the engine failed: {cause}", type="server_error",
                           code="engine_error") from exc

    async def collect(self) -> list[ChoiceState]:
        async for _ in self.outputs():
            pass
        return self.choices

    def usage(self) -> dict[str, Any]:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(c.num_tokens for c in self.choices)
        cached = sum(c.num_cached_tokens for c in self.choices if c.index % self._n == 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    @property
    def _n(self) -> int:
        return max(len(self.choices) // max(len(self.prompts), 1), 1)


def _params_for(fields: GenerationFields, j: int) -> Any:
    params = fields.params
    if fields.n > 1 and params.seed is not None:
        return dataclasses.replace(params, seed=params.seed + j)  # any int: the sampler folds it
    return dataclasses.replace(params)


async def _merge(handles: list[RequestHandle]) -> AsyncIterator[tuple[int, RequestOutput]]:
    if len(handles) == 1:
        async for out in handles[0]:
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, handle: RequestHandle) -> None:
        try:
            async for out in handle:
                queue.put_nowait((i, out))
        except Exception as exc:
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def until_disconnect(receive: Any, work: Awaitable[T]) -> T:
    """Await `work` unless the client disconnects first (then raise ClientGone). For
    non-streaming answers; the request body must have been read already."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise ClientGone()
    finally:
        for t in (task, watcher):
            t.cancel()


async def _disconnected(receive: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def refuse_if_busy(lease: Lease) -> None:
    """429 (queue full) or 503 (stopping) now if the model's loop would refuse a new request:
    the generation routes ask first, before rendering and tokenizing the prompt, so a refusal
    under overload costs a body parse (`bench soak --overload` saw ~150 refusals a second,
    each tokenized, taking CPU from the requests being served). Job.submit still refuses what
    arrives between the two."""
    try:
        lease.loop.check_admission()
    except (QueueFullError, EngineStoppedError) as exc:
        raise _refusal(exc) from exc


def _refusal(exc: QueueFullError | EngineStoppedError) -> APIError:
    if isinstance(exc, QueueFullError):
        return unavailable(f"the server is busy: {exc}; retry later", status=429)
    return unavailable("the server is shutting down")
