"""Tool calling: OpenAI `tools` in, a grammar for the model's call format, `tool_calls` out."""

from localinfer.tools.spec import ToolConfig, parse_tools

__all__ = ["ToolConfig", "parse_tools"]
