"""ToolConfig: a request's `tools`, `tool_choice` and `parallel_tool_calls`, checked.

Every mistake raises InvalidRequestError with the OpenAI parameter it concerns (`param`), so
the server can answer 400 naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from localinfer.errors import InvalidRequestError

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names


class ToolRequestError(InvalidRequestError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True, frozen=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON Schema of the arguments object
    strict: bool = False

    def as_tool(self) -> dict[str, Any]:
        """OpenAI's tool shape, as chat templates expect it."""
        fn: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


@dataclass(slots=True, frozen=True)
class ToolConfig:
    functions: tuple[Function, ...]
    choice: str  # "none" | "auto" | "required" | "function" (one named function)
    forced: str | None = None  # the function tool_choice names
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Tools are offered to the model (rendered into the prompt, parsed from the output)."""
        return bool(self.functions) and self.choice != "none"

    def allowed(self) -> tuple[Function, ...]:
        if self.forced is not None:
            return tuple(f for f in self.functions if f.name == self.forced)
        return self.functions


def parse_tools(body: dict[str, Any]) -> ToolConfig | None:
    """The request's tool settings; None when it has no tools (and asks for none)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise ToolRequestError("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise ToolRequestError("functions", "'functions' and 'function_call' are deprecated; "
                               "use 'tools' and 'tool_choice'")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise ToolRequestError("tool_choice", "'tool_choice' needs 'tools'")
        return None
    if not isinstance(tools, list):
        raise ToolRequestError("tools", "'tools' must be a list of tool objects")
    functions = tuple(_function(i, t) for i, t in enumerate(tools))
    names = [f.name for f in functions]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ToolRequestError("tools", f"tools: function name {dup!r} is defined twice")
    mode, forced = _choice(choice, names)
    return ToolConfig(functions, mode, forced, parallel)


def _function(i: int, tool: Any) -> Function:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ToolRequestError("tools", f"{where} must be an object with type 'function'")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ToolRequestError("tools", f"{where}.function must be an object")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolRequestError("tools", f"{where}.function.name must be 1-64 letters, digits, "
                               "'_' or '-'")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise ToolRequestError("tools", f"{where}.function.description must be a string")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise ToolRequestError("tools", f"{where}.function.parameters must be a JSON Schema "
                               "object")
    if params.get("type", "object") != "object":
        raise ToolRequestError("tools", f"{where}.function.parameters must describe an object")
    strict = fn.get("strict") or False
    return Function(name, description, params, bool(strict))


def _choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise ToolRequestError("tool_choice", "tool_choice.function.name must be a string")
        if name not in names:
            raise ToolRequestError("tool_choice", f"tool_choice names function {name!r}, "
                                   f"which is not in 'tools' ({', '.join(names)})")
        return "function", name
    raise ToolRequestError("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' "
                           "or {'type': 'function', 'function': {'name': ...}}; got "
                           f"{json.dumps(choice)[:80]}")
