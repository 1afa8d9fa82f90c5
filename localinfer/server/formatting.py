"""OpenAI response bodies: chat completions, text completions, their stream chunks, logprobs."""

from __future__ import annotations

from typing import Any

from localinfer.engine.outputs import TokenLogprob
from localinfer.server.echo import MIN_LOGPROB, EchoedPrompt, join_logprobs
from localinfer.server.generation import ChoiceState, Job
from localinfer.tools.parser import ToolCallParser
from localinfer.tools.spec import ToolConfig


class Formatter:
    """Builds the bodies of one request; `chat` selects the chat or the completions shape."""

    def __init__(self, job: Job, model: str, chat: bool, logprobs: bool,
                 tools: ToolConfig | None = None,
                 echoes: list[EchoedPrompt] | None = None) -> None:
        self.job = job
        self.echoes = echoes  # completions with echo: one per prompt
        self.want_logprobs = logprobs
        self.model = model
        self.chat = chat
        self.tokenizer = job.lease.llm.tokenizer
        self.object = "chat.completion" if chat else "text_completion"
        # offered tools: each choice's text is split into content and tool calls
        self.parsers = {c.index: ToolCallParser() for c in job.choices} if tools else {}

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.job.request_id, "object": obj, "created": self.job.created,
                "model": self.model, "system_fingerprint": self.job.state.system_fingerprint}

    # -- whole answers --------------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        body = self._envelope(self.object)
        body["choices"] = [self._choice(c) for c in self.job.choices]
        body["usage"] = self.job.usage()
        return body

    def _choice(self, c: ChoiceState) -> dict[str, Any]:
        logprobs = self.logprobs(c.logprobs, 0) if self.want_logprobs else None
        if self.chat and self.parsers:
            parser = self.parsers[c.index]
            parser.feed(c.text)
            parser.finish()
            calls = [call.as_openai() for call in parser.complete_calls]
            message: dict[str, Any] = {"role": "assistant",
                                       "content": parser.content if parser.content or not calls
                                       else None}
            if calls:
                message["tool_calls"] = calls
            return {"index": c.index, "message": message, "logprobs": logprobs,
                    "finish_reason": self.finish_reason(c)}
        if self.chat:
            return {"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": logprobs, "finish_reason": c.finish_reason}
        if self.echoes:
            echo = self.echoes[c.prompt_index]
            if self.want_logprobs:
                logprobs = join_logprobs(echo.logprobs(c.prompt_logprobs),
                                         self.logprobs(c.logprobs, len(echo.text)))
            return {"index": c.index, "text": echo.text + c.text, "logprobs": logprobs,
                    "finish_reason": c.finish_reason}
        return {"index": c.index, "text": c.text, "logprobs": logprobs,
                "finish_reason": c.finish_reason}

    # -- stream chunks --------------------------------------------------------------------------

    def chunk(self, index: int, text: str | None, logprobs: list[TokenLogprob] | None,
              finish_reason: str | None, text_offset: int = 0,
              usage_null: bool = False) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        lp = self.logprobs(logprobs, text_offset) if logprobs else None
        if self.chat:
            delta: dict[str, Any] = {}
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": lp,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": lp,
                      "finish_reason": finish_reason}
        body["choices"] = [choice]
        if usage_null:
            body["usage"] = None
        return body

    def echo_chunk(self, c: ChoiceState, usage_null: bool) -> dict[str, Any]:
        """A streamed echo's first chunk: the prompt's text and logprobs."""
        assert self.echoes
        echo = self.echoes[c.prompt_index]
        body = self.chunk(c.index, echo.text, None, None, usage_null=usage_null)
        if self.want_logprobs:
            body["choices"][0]["logprobs"] = echo.logprobs(c.prompt_logprobs)
        return body

    def text_base(self, c: ChoiceState) -> int:
        """Where the choice's generated text starts in its answer (after an echoed prompt)."""
        return len(self.echoes[c.prompt_index].text) if self.echoes else 0

    def finish_reason(self, c: ChoiceState) -> str | None:
        """"tool_calls" when a choice that stopped on its own made calls."""
        parser = self.parsers.get(c.index)
        if parser is not None and c.finish_reason == "stop" and parser.complete_calls:
            return "tool_calls"
        return c.finish_reason

    def tool_deltas(self, index: int, text: str, final: bool) -> list[dict[str, Any]]:
        """The stream deltas of a choice's new text when tools are offered: content as
        usual, each call's id and name once, then its arguments as fragments."""
        parser = self.parsers[index]
        events = parser.feed(text) + (parser.finish() if final else [])
        deltas: list[dict[str, Any]] = []
        for event in events:
            if event[0] == "content":
                deltas.append({"content": event[1]})
            elif event[0] == "call":
                call = parser.calls[event[1]]
                deltas.append({"tool_calls": [{
                    "index": event[1], "id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}}]})
            else:
                deltas.append({"tool_calls": [{"index": event[1],
                                               "function": {"arguments": event[2]}}]})
        return deltas

    def delta_chunk(self, index: int, delta: dict[str, Any],
                    logprobs: list[TokenLogprob] | None, usage_null: bool) -> dict[str, Any]:
        body = self.chunk(index, None, logprobs, None, usage_null=usage_null)
        body["choices"][0]["delta"] = delta
        return body

    def role_chunk(self, index: int, usage_null: bool) -> dict[str, Any]:
        body = self.chunk(index, "", None, None, usage_null=usage_null)
        body["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        return body

    def usage_chunk(self) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = self.job.usage()
        return body

    # -- logprobs -------------------------------------------------------------------------------

    def _token(self, token_id: int) -> tuple[str, bytes]:
        raw = self.tokenizer.token_to_bytes(token_id)
        return raw.decode("utf-8", "replace"), raw

    def logprobs(self, items: list[TokenLogprob], text_offset: int) -> dict[str, Any]:
        if self.chat:
            content = []
            for item in items:
                text, raw = self._token(item.token_id)
                top = []
                for tid, lp in item.top:
                    t, b = self._token(tid)
                    top.append({"token": t, "logprob": max(lp, MIN_LOGPROB), "bytes": list(b)})
                content.append({"token": text, "logprob": max(item.logprob, MIN_LOGPROB),
                                "bytes": list(raw), "top_logprobs": top})
            return {"content": content}
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for item in items:
            text, _ = self._token(item.token_id)
            tokens.append(text)
            token_logprobs.append(max(item.logprob, MIN_LOGPROB))
            tops.append({self._token(tid)[0]: max(lp, MIN_LOGPROB) for tid, lp in item.top})
            offsets.append(text_offset)
            text_offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops,
                "text_offset": offsets}
