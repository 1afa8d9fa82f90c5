"""Structured output: constraints (JSON Schema, regex, Lark grammars, choices, tool calls)
compiled by llguidance into per-sequence token masks that the engine applies to the logits."""

from localinfer.structured.spec import StructuredOutput, StructuredOutputError

__all__ = ["StructuredOutput", "StructuredOutputError"]
