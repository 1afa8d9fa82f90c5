"""Responses API bodies: the response object, its output items, and the streamed events.

A stream is the official sequence, every event numbered by `sequence_number`:

    response.created, response.in_progress,
    per message:  response.output_item.added, response.content_part.added,
                  response.output_text.delta..., response.output_text.done,
                  response.content_part.done, response.output_item.done
    per call:     response.output_item.added, response.function_call_arguments.delta...,
                  response.function_call_arguments.done, response.output_item.done
    response.completed (response.incomplete when max_output_tokens cut it; response.failed
    on an engine error)

With tools offered, the model's text goes through the same ToolCallParser as chat
completions, so the streamed items equal the non-streamed response's output.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from localinfer.server.generation import ChoiceState, Job
from localinfer.tools.parser import ToolCallParser


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """One response's object and events; `echo` holds the request fields a response repeats
    (instructions, max_output_tokens, temperature, top_p, tools, tool_choice...)."""

    def __init__(self, job: Job, model: str, echo: dict[str, Any], tools: bool) -> None:
        self.job = job
        self.model = model
        self.echo = echo
        self.id = _id("resp")
        self.created_at = int(time.time())
        self.parser = ToolCallParser() if tools else None
        self.sequence_number = 0
        self.output: list[dict[str, Any]] = []  # items, as they stand now
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text = ""  # the open message's text so far

    # -- whole objects --------------------------------------------------------------------------

    def response(self, status: str, choice: ChoiceState | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
        incomplete = None
        if choice is not None and choice.finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        body = {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "model": self.model, "output": list(self.output),
                "error": error, "incomplete_details": incomplete, "previous_response_id": None,
                "store": False, "metadata": {}, "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}},
                "usage": self._usage(choice) if choice is not None else None}
        body.update(self.echo)
        return body

    def _usage(self, choice: ChoiceState) -> dict[str, Any]:
        usage = self.job.usage()
        return {"input_tokens": usage["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": choice.num_cached_tokens},
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"]}

    def complete(self, choice: ChoiceState) -> dict[str, Any]:
        """The non-streamed response: the whole text split into items at once."""
        self.feed(choice.text, final=True)
        return self.response("completed", choice)

    # -- events ---------------------------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        body = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return body

    def start(self) -> list[dict[str, Any]]:
        return [self.event("response.created", response=self.response("in_progress")),
                self.event("response.in_progress", response=self.response("in_progress"))]

    def feed(self, text: str, final: bool) -> list[dict[str, Any]]:
        """The events of new output text (items open and close as content and calls come)."""
        if self.parser is None:
            parsed: list[tuple[Any, ...]] = [("content", text)] if text else []
        else:
            parsed = self.parser.feed(text) + (self.parser.finish() if final else [])
        events: list[dict[str, Any]] = []
        for item in parsed:
            if item[0] == "content":
                if self._open is None or self._open["type"] != "message":
                    events += self._close() + self._open_message()
                self._text += item[1]
                events.append(self.event("response.output_text.delta", **self._where(),
                                         delta=item[1], logprobs=[]))
            elif item[0] == "call":
                events += self._close() + self._open_call(item[1])
            else:
                self._open["arguments"] += item[2]  # type: ignore[index]
                events.append(self.event("response.function_call_arguments.delta",
                                         item_id=self._open["id"],  # type: ignore[index]
                                         output_index=len(self.output) - 1, delta=item[2]))
        if final:
            if not self.output:  # nothing generated: still one (empty) message
                events += self._open_message()
            events += self._close()
        return events

    def finish(self, choice: ChoiceState) -> dict[str, Any]:
        body = self.response("completed", choice)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return self.event(kind, response=body)

    def failed(self, error: dict[str, Any]) -> dict[str, Any]:
        self.output = [item for item in self.output if item.get("status") == "completed"]
        return self.event("response.failed", response=self.response("failed", error=error))

    # -- items ----------------------------------------------------------------------------------

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.output) - 1,
                "content_index": 0}

    def _open_message(self) -> list[dict[str, Any]]:
        self._open = {"id": _id("msg"), "type": "message", "status": "in_progress",
                      "role": "assistant", "content": []}
        self._text = ""
        self.output.append(self._open)
        return [self.event("response.output_item.added", output_index=len(self.output) - 1,
                           item=dict(self._open)),
                self.event("response.content_part.added", **self._where(),
                           part=_text_part(""))]

    def _open_call(self, index: int) -> list[dict[str, Any]]:
        assert self.parser is not None
        call = self.parser.calls[index]
        self._open = {"id": _id("fc"), "type": "function_call", "status": "in_progress",
                      "call_id": call.id, "name": call.name, "arguments": ""}
        self.output.append(self._open)
        return [self.event("response.output_item.added", output_index=len(self.output) - 1,
                           item=dict(self._open))]

    def _close(self) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = len(self.output) - 1
        item["status"] = "completed"
        if item["type"] == "message":
            part = _text_part(self._text)
            item["content"] = [part]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events = [self.event("response.output_text.done", **where, text=self._text,
                                 logprobs=[]),
                      self.event("response.content_part.done", **where, part=part)]
        else:
            events = [self.event("response.function_call_arguments.done", item_id=item["id"],
                                 output_index=index, arguments=item["arguments"])]
        return events + [self.event("response.output_item.done", output_index=index,
                                    item=dict(item))]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
