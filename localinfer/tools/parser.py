"""ToolCallParser: the model's text, fed as it streams, split into content and tool calls.

    parser.feed(text) -> events    # ("content", text) | ("call", index, name) |
                                   # ("arguments", index, fragment)
    parser.finish()   -> events    # end of the output: what was held back
    parser.content, parser.calls   # the whole answer, for a non-streamed response

The arguments of a call are the exact characters the model wrote for its "arguments" value,
so the streamed fragments concatenate to the non-streamed `function.arguments`. Text that might
be the start of `<tool_call>` is held until it is decided; whitespace between content and a
call is dropped. A call that is not well formed (only possible where nothing constrained it,
or when max_tokens cut it) is given back as content, never a failure.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from localinfer.engine.text_stream import held_suffix
from localinfer.tools.hermes import CLOSE, OPEN

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')

Event = tuple[Any, ...]


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str = ""
    complete: bool = False

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class _Args:
    """Scans an arguments value character by character to find where it ends."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    started: bool = False

    def take(self, ch: str) -> bool:
        """Feed one character of the value; True once the value is complete."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
        self.started = True
        return self.depth == 0 and not self.in_string


@dataclass
class ToolCallParser:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    _buf: str = ""  # text not decided yet
    _state: str = "text"  # text | head | value | tail
    _raw: str = ""  # the open call's text since <tool_call>, given back if it is malformed
    _scan: _Args = field(default_factory=_Args)
    _bare: bool = False  # the open call has no <tool_call> tags
    _ws: str = ""  # whitespace dropped before the open call

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        step = {"text": self._text, "head": self._head, "value": self._value,
                "tail": self._tail}
        while self._buf and step[self._state](events):
            pass
        return events

    def finish(self) -> list[Event]:
        """The output ended; a call still open (cut by max_tokens) goes back to content."""
        events: list[Event] = []
        if self._state == "text":
            events += self._content(self._buf)
        else:
            events += self._content(self._opening + self._raw + self._buf)
        self._buf, self._raw, self._state = "", "", "text"
        return events

    @property
    def complete_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if c.complete]

    # -- states: each consumes what it can and says whether another state may go on ----------

    def _text(self, events: list[Event]) -> bool:
        if not self.content and not self.calls and self._buf.lstrip().startswith("{"):
            # an answer that is one call object without tags (small Qwen models write that;
            # under tool_choice "auto" the grammar holds such an answer to the call schema)
            self._state, self._raw, self._bare, self._ws = "head", "", True, ""
            return True
        i = self._buf.find(OPEN)
        if i >= 0:
            text = self._buf[:i].rstrip()  # whitespace before a call is dropped...
            events += self._content(text)
            self._ws = self._buf[len(text):i]  # ...unless the call is given back as text
            self._buf = self._buf[i + len(OPEN):]
            self._state, self._raw, self._bare = "head", "", False
            return True
        undecided = held_suffix(self._buf, [OPEN])
        sure = self._buf[: len(self._buf) - undecided].rstrip()  # whitespace waits too
        events += self._content(sure)
        self._buf = self._buf[len(sure):]
        return False

    def _head(self, events: list[Event]) -> bool:
        m = _HEAD.match(self._buf)
        if m is None:
            if (CLOSE in self._buf and not self._bare) or len(self._buf) > 4096:
                return self._malformed(events)
            return False
        try:
            name = json.loads(m.group(1))
        except ValueError:
            return self._malformed(events)
        self.calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", name))
        events.append(("call", len(self.calls) - 1, name))
        self._raw += self._buf[: m.end()]
        self._buf = self._buf[m.end():]
        self._state, self._scan = "value", _Args()
        return True

    def _value(self, events: list[Event]) -> bool:
        if not self._scan.started:  # whitespace before the value is not part of it
            value = self._buf.lstrip()
            self._raw += self._buf[: len(self._buf) - len(value)]
            self._buf = value
            if not value:
                return False
        taken, done = 0, False
        for ch in self._buf:
            taken += 1
            if self._scan.take(ch):
                done = True
                break
        fragment = self._buf[:taken]
        self.calls[-1].arguments += fragment
        self._raw += fragment
        self._buf = self._buf[taken:]
        events.append(("arguments", len(self.calls) - 1, fragment))
        if done:
            self._state = "tail"
        return done

    def _tail(self, events: list[Event]) -> bool:
        if self._bare:
            rest = self._buf.lstrip()
            if not rest:
                return False
            i = len(self._buf) - len(rest)  # the call object's own "}" ends a bare call
            return self._end_call(events, self._buf[: i + 1], i + 1, rest[0] == "}")
        i = self._buf.find(CLOSE)
        if i < 0:
            return False
        between = self._buf[:i]
        return self._end_call(events, between + CLOSE, i + len(CLOSE), between.strip() == "}")

    def _end_call(self, events: list[Event], tail: str, used: int, closed: bool) -> bool:
        self._raw += tail
        self._buf = self._buf[used:]
        call = self.calls[-1]
        try:
            well_formed = isinstance(json.loads(call.arguments), dict)
        except ValueError:
            well_formed = False
        if well_formed and closed:
            call.complete = True
            self._buf = self._buf.lstrip("\n")
        else:
            events += self._content(self._opening + self._raw)
        self._state, self._raw = "text", ""
        return True

    @property
    def _opening(self) -> str:
        return self._ws + ("" if self._bare else OPEN)

    def _malformed(self, events: list[Event]) -> bool:
        i = -1 if self._bare else self._buf.find(CLOSE)
        end = i + len(CLOSE) if i >= 0 else len(self._buf)
        events += self._content(self._opening + self._raw + self._buf[:end])
        self._buf = self._buf[end:]
        self._state, self._raw = "text", ""
        return True

    def _content(self, text: str) -> list[Event]:
        if not text:
            return []
        self.content += text
        return [("content", text)]
