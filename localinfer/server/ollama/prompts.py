"""The prompt of an Ollama request, as token ids: /api/chat's `messages`, /api/generate's
`prompt` (with `system`, `suffix`, `raw`).

Ollama messages differ from OpenAI's in three ways, mapped here so the one chat path
(prompts.chat_prompt, with the tools' rendering) serves both: an assistant's `tool_calls` have
no ids and give `arguments` as an object; a `tool` message names its call by `tool_name`, not
by id; `images` may ride on any message (refused: the served models read text only).

/api/generate renders `system` + `prompt` through the model's chat template, as Ollama does
with the Modelfile's TEMPLATE; `raw: true` sends the prompt as written (special tokens such as
`<|im_start|>` parsed, as a hand-formatted prompt means them). A custom `template` is refused:
localinfer renders the GGUF's own template only (in a sandbox), never one from a request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from localinfer.server.fim import fim_prompt, require_fim
from localinfer.server.prompts import chat_prompt
from localinfer.server.protocol import invalid
from localinfer.tools.spec import ToolConfig

_OLLAMA_ONLY = ("images", "tool_name", "thinking")


def openai_messages(messages: Any) -> list[dict[str, Any]]:
    """Ollama chat messages as OpenAI ones (validated further by chat_prompt)."""
    if not isinstance(messages, list):
        raise invalid("messages", "'messages' must be a list of message objects")
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (call id, function name), oldest first
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise invalid("messages", f"messages[{i}] must be an object")
        if msg.get("images"):
            raise invalid("images", f"messages[{i}] has images, but the served models read "
                          "text only")
        converted = {k: v for k, v in msg.items() if k not in _OLLAMA_ONLY}
        calls = msg.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise invalid("messages", f"messages[{i}].tool_calls must be a list")
            converted["tool_calls"] = [_with_id(i, j, call) for j, call in enumerate(calls)]
            unanswered = [(c["id"], c["function"].get("name", ""))
                          for c in converted["tool_calls"]]
        if msg.get("role") == "tool" and "tool_call_id" not in msg:
            converted["tool_call_id"] = _answered_call(i, msg, unanswered)
        out.append(converted)
    return out


def _with_id(i: int, j: int, call: Any) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise invalid("messages", f"messages[{i}].tool_calls[{j}] must be an object with a "
                      "'function' ({name, arguments})")
    return {"id": call.get("id") or f"call_{i}_{j}", "type": "function",
            "function": call["function"]}


def _answered_call(i: int, msg: dict[str, Any], unanswered: list[tuple[str, str]]) -> str:
    """The id of the earlier call this tool result answers: the first unanswered call of
    the last assistant turn with its `tool_name`, else the first unanswered one."""
    name = msg.get("tool_name")
    for k, (call_id, fn) in enumerate(unanswered):
        if name is None or fn == name:
            del unanswered[k]
            return call_id
    named = f" named {name!r}" if name is not None else ""
    raise invalid("messages", f"messages[{i}] (role 'tool') answers no earlier assistant "
                  f"tool call{named}")


async def chat_ids(llm: Any, messages: Any, tools: ToolConfig | None) -> list[int]:
    return await asyncio.to_thread(chat_prompt, llm, openai_messages(messages), tools)


async def generate_ids(llm: Any, body: dict[str, Any], model: str) -> list[int]:
    """/api/generate's prompt as token ids."""
    text = {}
    for name in ("prompt", "system", "suffix", "template"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise invalid(name, f"'{name}' must be a string")
        text[name] = value or ""
    if text["template"]:
        raise invalid("template", "'template' is not supported: the model's own chat template "
                      "is used; send 'raw': true with a prompt formatted yourself instead")
    if body.get("images"):
        raise invalid("images", "'images' are not supported: the served models read text only")
    if body.get("context"):
        raise invalid("context", "'context' is not supported (answers do not carry it); send "
                      "the conversation as messages to /api/chat")
    raw = body.get("raw")
    if raw is not None and not isinstance(raw, bool):
        raise invalid("raw", "'raw' must be a boolean")
    if text["suffix"]:  # fill in the middle: prompt is the code before the cursor
        fim = require_fim(llm, model, "suffix")
        return fim_prompt(llm, fim, text["prompt"], text["suffix"])
    if raw:
        ids = llm.tokenizer.encode(text["prompt"], add_special=True, parse_special=True)
        if not ids:
            raise invalid("prompt", "the prompt has no tokens")
        return ids
    messages = [{"role": "user", "content": text["prompt"]}]
    if text["system"]:
        messages.insert(0, {"role": "system", "content": text["system"]})
    return await asyncio.to_thread(chat_prompt, llm, messages)
