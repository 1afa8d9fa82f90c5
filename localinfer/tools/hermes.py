"""The Hermes tool-call format (Qwen 2.5, Hermes, and our generic format): each call is

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

calls separated by a newline. `call_grammar` constrains it in llguidance's Lark dialect: from
the first token for `required` and a named function; for `auto` the text is free until the
model opens a call, then the call must be well formed (a lazy lexeme ends the text at the
trigger, as llguidance's tool-calling recipe does). Where the vocabulary has `<tool_call>` as
a special token (Qwen) the grammar names that token; elsewhere the tag is plain text.
"""

from __future__ import annotations

import json
from typing import Any

from localinfer.structured.spec import JSON_STYLE, bound_integers
from localinfer.tools.spec import Function, ToolConfig

OPEN, CLOSE = "<tool_call>", "</tool_call>"

# for chat templates that do not render `tools` themselves (a system message describing them)
GENERIC_PROMPT = (
    "You can call functions to help answer the user. The functions, as JSON signatures "
    "within <tools></tools> tags:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, answer with one JSON object per call, with the function name and "
    "its arguments, within <tool_call></tool_call> tags:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>\n"
    "Results come back within <tool_response></tool_response> tags. If no function is "
    "needed, answer normally."
)


def call_schema(functions: tuple[Function, ...]) -> dict[str, Any]:
    """The JSON Schema of one call object: {"name": one of them, "arguments": its schema}."""
    options = [{
        "type": "object",
        "properties": {"name": {"const": f.name}, "arguments": f.parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for f in functions]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**bound_integers(schema), "x-guidance": JSON_STYLE}


def call_grammar(config: ToolConfig, special_tags: bool) -> str:
    """The Lark grammar for the model's answer under `config` (choice auto/required/named)."""
    if special_tags:
        open_tag, close_tag = OPEN, CLOSE  # <tool_call> names the special token
    else:
        open_tag, close_tag = json.dumps(OPEN), json.dumps(CLOSE)
    args = f"args: %json {json.dumps(call_schema(config.allowed()))}"
    call = f'call: {open_tag} "\\n" args "\\n" {close_tag}'
    if config.choice != "auto":
        # a named function is called once (as OpenAI's tool_choice does); required: 1 or more
        many = config.parallel and config.choice == "required"
        calls = 'call ("\\n" call)*' if many else "call"
        return "\n".join([f"start: {calls}", call, args])
    # auto: free text (not starting with "{"), or calls, each after optional text; an answer
    # that starts with "{" is one call object without tags. From the tag (or the brace) on,
    # the call is constrained.
    if special_tags:
        head = f"call_hd: {open_tag} | TEXT {open_tag}"
    else:  # a lazy lexeme: the text ends where the tag is first written
        head = f"call_hd[lazy]: TEXT? {open_tag}"
    many = "+" if config.parallel else ""
    return "\n".join([
        f"start: TEXT | tool_call{many} | args",
        f'tool_call: call_hd "\\n" args "\\n" {close_tag}',
        head,
        "TEXT: /[^{](.|\\n)*/",
        args,
    ])


def render_call(name: str, arguments: str) -> str:
    """One call as the model writes it (for templates that do not render tool_calls)."""
    return f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n{CLOSE}'
