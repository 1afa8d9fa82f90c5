"""A request's output constraints: `response_format`, vLLM's `structured_outputs` (and its older
`guided_*` fields), and `tools` with `tool_choice`, mapped onto one StructuredOutput.

Every constraint is compiled before anything is generated, so an invalid schema, regex or
grammar, or a schema feature llguidance does not enforce, is a 400 naming the parameter and
the feature — never an unconstrained answer in its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localinfer.errors import InvalidRequestError
from localinfer.server.protocol import invalid
from localinfer.structured.spec import StructuredOutput, StructuredOutputError
from localinfer.tools.hermes import CLOSE, OPEN, call_grammar
from localinfer.tools.spec import ToolConfig, ToolRequestError, parse_tools

# vLLM's structured_outputs keys, and the guided_* fields it had before
_KINDS = ("json", "regex", "choice", "grammar", "json_object")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


@dataclass(slots=True)
class Constraints:
    structured: StructuredOutput | None = None
    param: str | None = None  # the request field the constraint came from
    tools: ToolConfig | None = None  # offered tools (None: no tools, or tool_choice "none")

    def bind_tools(self, tokenizer: Any) -> None:
        """Offered tools constrain the answer to the call format, whose grammar names the
        `<tool_call>` tags as special tokens where the model's vocabulary has them so."""
        if self.tools is None:
            return
        from localinfer.structured.tokenizer import is_special

        ids = [tokenizer.vocab.token_to_id.get(tag) for tag in (OPEN, CLOSE)]
        special = all(i is not None and is_special(tokenizer, i) for i in ids)
        self.structured = StructuredOutput(grammar=call_grammar(self.tools, special))
        self.param = "tools"


def parse_constraints(body: dict[str, Any], *, chat: bool) -> Constraints:
    found: list[tuple[str, StructuredOutput]] = []
    fmt = _response_format(body)
    if fmt is not None:
        found.append(("response_format", fmt))
    so = body.get("structured_outputs")
    if so is not None:
        found.append(("structured_outputs", _structured_outputs(so)))
    for name, kind in _GUIDED.items():
        if body.get(name) is not None:
            found.append((name, _make(name, {kind: body[name]})))
    tools = None
    if chat:
        try:
            tools = parse_tools(body)
        except ToolRequestError as exc:
            raise invalid(exc.param, str(exc)) from exc
    else:
        for name in ("tools", "tool_choice"):
            if body.get(name) is not None:
                raise invalid(name, f"'{name}' is only supported by /v1/chat/completions")
    if len(found) > 1:
        raise invalid(found[1][0], f"'{found[0][0]}' and '{found[1][0]}' both constrain the "
                      "output; give one")
    if tools is not None and tools.active and found:
        raise invalid(found[0][0], f"'{found[0][0]}' cannot be combined with 'tools' (use "
                      "tool_choice 'none' for a constrained answer without tools)")
    if tools is not None and not tools.active:
        tools = None
    if found:
        return Constraints(found[0][1], found[0][0])
    return Constraints(tools=tools)


def compile_constraint(guides: Any, spec: StructuredOutput, param: str) -> None:
    """Compile (and cache) the constraint now; a 400 naming `param` if it cannot be enforced.
    Blocking (llguidance's compiler): call it off the event loop."""
    try:
        guides.prepare(spec)
    except StructuredOutputError as exc:
        raise invalid(param, f"{param}: {exc}", code="invalid_constraint") from exc


def _response_format(body: dict[str, Any]) -> StructuredOutput | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise invalid("response_format", "'response_format' must be an object with a 'type'")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise invalid("response_format", "response_format.json_schema must be an object "
                          "with 'name' and 'schema'")
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            raise invalid("response_format", "response_format.json_schema.name must be a string")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise invalid("response_format", "response_format.json_schema.schema must be a "
                          "JSON Schema object")
        if not isinstance(spec.get("strict", False), (bool, type(None))):
            raise invalid("response_format", "response_format.json_schema.strict must be a "
                          "boolean")
        return _make("response_format", {"json": schema})
    raise invalid("response_format", f"response_format type {kind!r} is not one of 'text', "
                  "'json_object', 'json_schema'")


def _structured_outputs(so: Any) -> StructuredOutput:
    if not isinstance(so, dict):
        raise invalid("structured_outputs", "'structured_outputs' must be an object")
    given = {k: v for k, v in so.items() if k in _KINDS and v not in (None, False)}
    unknown = [k for k in so if k not in _KINDS and so[k] is not None]
    if unknown:
        raise invalid("structured_outputs", f"structured_outputs: unsupported field "
                      f"{unknown[0]!r} (supported: {', '.join(_KINDS)})")
    return _make("structured_outputs", given)


def _make(param: str, fields: dict[str, Any]) -> StructuredOutput:
    if fields.get("json_object") is not None:
        fields["json_object"] = bool(fields["json_object"])
    try:
        return StructuredOutput(**fields)
    except (StructuredOutputError, InvalidRequestError, TypeError) as exc:
        raise invalid(param, f"{param}: {exc}") from exc
