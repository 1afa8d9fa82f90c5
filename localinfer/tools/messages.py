"""Chat messages with tool calls, made ready for the model's chat template.

Clients send OpenAI messages: assistant turns with `tool_calls` (arguments as JSON strings) and
`tool` turns answering them by `tool_call_id`. A template that renders tools itself (Qwen 2.5's)
gets them as Hugging Face templates expect (arguments as objects, `tools` as a variable); for
any other template the tools are described in the system message and the calls and results are
written into the turns as text, in the same Hermes format the grammar enforces.
"""

from __future__ import annotations

import json
from typing import Any

from localinfer.tools.hermes import GENERIC_PROMPT, render_call
from localinfer.tools.spec import ToolConfig, ToolRequestError


def check_tool_turns(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool call well formed; every tool message answers an earlier call."""
    ids: set[str] = set()
    for i, msg in enumerate(messages):
        calls = msg.get("tool_calls")
        if calls is not None:
            if msg["role"] != "assistant" or not isinstance(calls, list):
                raise ToolRequestError("messages", f"messages[{i}].tool_calls must be a list "
                                       "on an assistant message")
            for j, call in enumerate(calls):
                _check_call(f"messages[{i}].tool_calls[{j}]", call)
                ids.add(call["id"])
        if msg["role"] == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in ids:
                raise ToolRequestError(
                    "messages", f"messages[{i}] (role 'tool') has tool_call_id {call_id!r}, "
                    "which answers no earlier assistant tool call")


def _check_call(where: str, call: Any) -> None:
    fn = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(call, dict) and isinstance(call.get("id"), str)
            and isinstance(fn, dict) and isinstance(fn.get("name"), str)):
        raise ToolRequestError("messages", f"{where} must have an 'id' and a 'function' with "
                               "a 'name' and 'arguments'")
    args = fn.get("arguments", "{}")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except ValueError as exc:
        raise ToolRequestError("messages", f"{where}.function.arguments is not valid JSON: "
                               f"{exc}") from exc
    if not isinstance(parsed, dict):
        raise ToolRequestError("messages", f"{where}.function.arguments must be a JSON object")


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    args = call["function"].get("arguments", "{}")
    return json.loads(args) if isinstance(args, str) else args


def for_template(messages: list[dict[str, Any]], config: ToolConfig | None,
                 template_renders_tools: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra template variables) for rendering."""
    check_tool_turns(messages)
    tools = [f.as_tool() for f in config.functions] if config and config.active else []
    if template_renders_tools:
        out = []
        for msg in messages:
            if msg.get("tool_calls"):
                calls = [{"id": c["id"], "type": "function",
                          "function": {"name": c["function"]["name"],
                                       "arguments": _arguments(c)}}
                         for c in msg["tool_calls"]]
                msg = {**msg, "tool_calls": calls}
            out.append(msg)
        return out, ({"tools": tools} if tools else {})
    return _as_text(messages, tools), {}


def _as_text(messages: list[dict[str, Any]], tools: list[dict[str, Any]]
             ) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if tools:
        described = GENERIC_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        if messages[0]["role"] == "system":
            described = messages[0]["content"] + "\n\n" + described
            messages = messages[1:]
        out.append({"role": "system", "content": described})
    for msg in messages:
        if msg.get("tool_calls"):
            text = "\n".join(render_call(c["function"]["name"], json.dumps(_arguments(c)))
                             for c in msg["tool_calls"])
            content = (msg.get("content") or "").strip()
            out.append({"role": "assistant", "content": f"{content}\n{text}".strip()})
        elif msg["role"] == "tool":
            response = f"<tool_response>\n{msg['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_tool_results": True})
        else:
            out.append(msg)
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
