"""Ollama's answer objects for /api/chat and /api/generate, whole or as NDJSON lines.

Streamed, each line is `{model, created_at, message | response, done: false}` with the new
text; the last line has `done: true`, `done_reason` ("stop" or "length") and the timings, in
nanoseconds as Ollama gives them: `total_duration` (the request), `load_duration` (waiting for
the model to load), `prompt_eval_duration` (submission to the first token: queueing, prefill,
first sample), `eval_duration` (first to last token), with `prompt_eval_count` and
`eval_count` tokens. An error after the first line is an `{"error": ...}` line, which the
ollama client raises as ResponseError. Whatever ends the stream — done, error, the client
gone — closes the job, which aborts its sequences (no KV block outlives the request).

With tools, the text is split by the tool-call parser: content streams as it comes, each call
goes out once complete as `message.tool_calls` with `arguments` as an object.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from localinfer.server.generation import ChoiceState, Job
from localinfer.server.protocol import APIError
from localinfer.tools.parser import ToolCall, ToolCallParser

log = logging.getLogger("localinfer.server")
NDJSON = "application/x-ndjson"


def created_at() -> str:
    """RFC 3339 in UTC, as Ollama writes it."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(int(seconds * 1e9), 0)


class OllamaReply:
    """The answer of one request; `chat` selects /api/chat's `message` or /api/generate's
    `response`. `started`: when the request arrived (perf_counter); `load_s`: time spent
    waiting for the model."""

    def __init__(self, job: Job, model: str, *, chat: bool, tools: bool, started: float,
                 load_s: float) -> None:
        self.job = job
        self.model = model
        self.chat = chat
        self.started = started
        self.load_s = load_s
        self.parser = ToolCallParser() if tools else None
        self._sent_calls = 0

    def _object(self, text: str, calls: list[ToolCall] | None = None,
                done: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [_ollama_call(c) for c in calls]
            body["message"] = message
        else:
            body["response"] = text
        body["done"] = done
        return body

    def final(self, choice: ChoiceState, text: str = "",
              calls: list[ToolCall] | None = None) -> dict[str, Any]:
        body = self._object(text, calls, done=True)
        first = choice.first_token_time or time.perf_counter()
        last = choice.last_token_time or first
        body.update({
            "done_reason": choice.finish_reason,
            "total_duration": _ns(time.perf_counter() - self.started),
            "load_duration": _ns(self.load_s),
            "prompt_eval_count": choice.num_prompt_tokens,
            "prompt_eval_duration": _ns(first - self.job.arrival),
            "eval_count": choice.num_tokens,
            "eval_duration": _ns(last - first),
        })
        return body

    def whole(self, choices: list[ChoiceState]) -> dict[str, Any]:
        """The non-streamed answer: all the text (and calls) in the final object."""
        choice = choices[0]
        if self.parser is None:
            return self.final(choice, choice.text)
        self.parser.feed(choice.text)
        self.parser.finish()
        return self.final(choice, self.parser.content, self.parser.complete_calls)

    def _pieces(self, text: str, finished: bool) -> list[dict[str, Any]]:
        """The stream objects for new text: as is, or split into content and calls."""
        if self.parser is None:
            return [self._object(text)] if text else []
        events = self.parser.feed(text) + (self.parser.finish() if finished else [])
        pieces = [self._object(e[1]) for e in events if e[0] == "content"]
        done = self.parser.complete_calls
        if len(done) > self._sent_calls:
            pieces.append(self._object("", done[self._sent_calls:]))
            self._sent_calls = len(done)
        return pieces

    async def lines(self) -> AsyncIterator[str]:
        try:
            async for choice, out in self.job.outputs():
                for piece in self._pieces(out.text, out.finished):
                    yield _line(piece)
                if out.finished:
                    yield _line(self.final(choice))
        except APIError as exc:
            log.warning("ollama stream %s failed: %s", self.job.request_id, exc.message)
            yield _line({"error": exc.message})
        except Exception as exc:  # never a broken stream without a reason
            log.exception("ollama stream %s failed", self.job.request_id)
            yield _line({"error": f"internal error: {exc}"})
        finally:
            self.job.close()

    def stream(self) -> StreamingResponse:
        # the background task also closes the job if the stream never started
        return StreamingResponse(self.lines(), media_type=NDJSON,
                                 background=BackgroundTask(self.job.close))


def _ollama_call(call: ToolCall) -> dict[str, Any]:
    # complete calls hold a JSON object (the parser checked it)
    return {"function": {"name": call.name, "arguments": json.loads(call.arguments)}}


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
