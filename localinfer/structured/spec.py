"""StructuredOutput: what a request constrains its output to, as vLLM's structured outputs.

Exactly one of: a JSON Schema (`json`), any JSON object (`json_object`), a regular expression
(`regex`, Rust regex syntax, anchored at both ends), a Lark grammar in llguidance's syntax
(`grammar`), or one of several strings (`choice`). `grammar_text()` turns it into the grammar
llguidance compiles; nothing here imports llguidance until a grammar is built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from localinfer.errors import InvalidRequestError

# JSON as models write it: `{"a": 1, "b": [2, 3]}`. No free whitespace, so a small model cannot
# wander into an endless run of newlines inside a value that the schema leaves open.
JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
# An integer the schema leaves unbounded is kept within I-JSON's interoperable range (RFC 7493,
# +-(2**53 - 1), 16 digits, as llama.cpp's schema converter does): a small model that starts
# repeating a digit must then close the number instead of writing zeros until max_tokens.
SAFE_INTEGER = 2**53 - 1
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "contains", "not", "if", "then", "else",
                  "unevaluatedProperties", "unevaluatedItems", "propertyNames")


class StructuredOutputError(InvalidRequestError):
    """A constraint that cannot be enforced: invalid schema, regex or grammar, or a feature
    the constraint engine does not implement (the message names it)."""


@dataclass(slots=True, frozen=True)
class StructuredOutput:
    json: dict[str, Any] | str | None = None  # a JSON Schema, as an object or its text
    json_object: bool = False  # any JSON object
    regex: str | None = None
    grammar: str | None = None  # Lark, llguidance's dialect (`%json {...}` inlines a schema)
    choice: tuple[str, ...] | None = None
    # grammar_text(), once: the server compiles a request's constraint on a worker thread and
    # the engine thread then needs the same text only to find the compiled prototype
    _grammar: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.choice is not None and not isinstance(self.choice, tuple):
            if isinstance(self.choice, str) or not isinstance(self.choice, list):
                raise StructuredOutputError("choice must be a list of strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        kinds = [name for name in ("json", "regex", "grammar", "choice")
                 if getattr(self, name) is not None]
        if self.json_object:
            kinds.append("json_object")
        if len(kinds) != 1:
            found = ", ".join(kinds) or "none"
            raise StructuredOutputError(
                f"a structured output needs exactly one of json, json_object, regex, grammar, "
                f"choice (got {found})")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise StructuredOutputError("json must be a JSON Schema object (or its text)")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise StructuredOutputError(f"{name} must be a non-empty string")
        if self.choice is not None and (
                not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise StructuredOutputError("choice must be a non-empty list of non-empty strings")

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        return next(n for n in ("json", "regex", "grammar", "choice")
                    if getattr(self, n) is not None)

    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema (parsed), for json and json_object; None otherwise."""
        if self.json_object:
            return {"type": "object"}
        if self.json is None:
            return None
        if isinstance(self.json, dict):
            return self.json
        try:
            schema = json.loads(self.json)
        except ValueError as exc:
            raise StructuredOutputError(f"the JSON Schema is not valid JSON: {exc}") from exc
        if not isinstance(schema, dict):
            raise StructuredOutputError("the JSON Schema must be a JSON object")
        return schema

    def grammar_text(self) -> str:
        """The llguidance grammar (its JSON form) that enforces this constraint."""
        if self._grammar is None:
            object.__setattr__(self, "_grammar", self._build_grammar())
        assert self._grammar is not None
        return self._grammar

    def _build_grammar(self) -> str:
        from llguidance import LLMatcher

        schema = self.schema()
        if schema is not None:
            try:
                return LLMatcher.grammar_from_json_schema(bound_integers(schema),
                                                          defaults=JSON_STYLE)
            except (ValueError, TypeError) as exc:
                raise StructuredOutputError(f"invalid JSON Schema: {exc}") from exc
        if self.regex is not None:
            return LLMatcher.grammar_from_regex(self.regex)
        if self.grammar is not None:
            return LLMatcher.grammar_from_lark(self.grammar)
        assert self.choice is not None
        return LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c) for c in self.choice))

    def describe(self) -> str:
        """What kind of constraint this is, for error messages."""
        return {"json": "JSON Schema", "json_object": "JSON object", "regex": "regex",
                "grammar": "grammar", "choice": "choice"}[self.kind]


def bound_integers(schema: Any) -> Any:
    """A copy of the schema whose unbounded integers are kept within +-SAFE_INTEGER."""
    if isinstance(schema, list):
        return [bound_integers(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: bound_integers(v) for k, v in out[key].items()}
    for key in (*_SUBSCHEMA_LISTS, *_SUBSCHEMA_ONE):
        if key in out:
            out[key] = bound_integers(out[key])
    types = out.get("type")
    if types == "integer" or (isinstance(types, list) and "integer" in types):
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = SAFE_INTEGER
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -SAFE_INTEGER
    return out
