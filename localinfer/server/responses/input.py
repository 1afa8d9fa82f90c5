"""A Responses API request (`POST /v1/responses`) as the chat-completions request it means.

`input` is a string (one user turn) or a list of items: messages ({role, content}, content a
string or parts of type input_text / output_text), earlier `function_call` items and their
`function_call_output`s. `instructions` becomes the system message. Function `tools`
({type: "function", name, parameters}) and `tool_choice` map onto chat tools; `text.format`
onto `response_format`. Fields that would change the answer and are not served here
(previous_response_id, background, conversation, images, files, built-in tools) are a 400
naming them — never ignored.
"""

from __future__ import annotations

from typing import Any

from localinfer.server.protocol import get_int, invalid

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")
_REFUSED = {
    "previous_response_id": "responses are not stored here: send the whole conversation in "
                            "'input'",
    "conversation": "conversations are not stored here: send the whole conversation in 'input'",
    "background": "background responses are not supported",
    "prompt": "stored prompt templates are not supported",
}


def chat_request(body: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """The chat-completions body for parse_generation(chat=True) and chat_prompt."""
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, False):
            raise invalid(name, f"'{name}': {why}")
    messages = input_messages(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "'instructions' must be a string")
        messages.insert(0, {"role": "system", "content": instructions})
    chat: dict[str, Any] = {"messages": messages}
    for name in ("model", "temperature", "top_p", "stream", "seed", "parallel_tool_calls"):
        if body.get(name) is not None:
            chat[name] = body[name]
    max_tokens = get_int(body, "max_output_tokens", 1, max_model_len, None)
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    return chat


def input_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "'input' must be a string or a non-empty list of input items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise invalid("input", f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(i, item))
        elif kind == "function_call":
            call = {"id": _str(item, "call_id", i), "type": "function",
                    "function": {"name": _str(item, "name", i),
                                 "arguments": _str(item, "arguments", i)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _str(item, "call_id", i),
                             "content": _str(item, "output", i)})
        else:
            raise invalid("input", f"input[{i}]: items of type {kind!r} are not supported "
                          "(message, function_call, function_call_output are)")
    return messages


def _message(i: int, item: dict[str, Any]) -> dict[str, Any]:
    role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise invalid("input", f"input[{i}].role must be one of {', '.join(_ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise invalid("input", f"input[{i}].content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise invalid("input", f"input[{i}].content[{j}]: only text parts (input_text, "
                          f"output_text) are supported, got {kind!r}")
        texts.append(part["text"])
    return {"role": role, "content": "".join(texts)}


def _str(item: dict[str, Any], name: str, i: int) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise invalid("input", f"input[{i}].{name} must be a string")
    return value


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("tools", "'tools' must be a list of tool objects")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise invalid("tools", f"tools[{i}]: only function tools are supported, got "
                          f"{kind!r}")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice  # "none" | "auto" | "required", or a bad value parse_tools names


def _text_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        if not isinstance(text, dict):
            raise invalid("text", "'text' must be an object like {\"format\": {...}}")
        return None
    if not isinstance(fmt, dict):
        raise invalid("text", "text.format must be an object")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return fmt  # {"type": "text"} | {"type": "json_object"}, checked as response_format
