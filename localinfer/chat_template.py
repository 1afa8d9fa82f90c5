"""Chat templates from GGUF metadata, rendered in jinja2's immutable sandbox.

A template is untrusted code from a downloaded file (CVE-2024-34359), so it gets the sandbox,
a bound on its output size and on the time it may run, and nothing else.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from localinfer.errors import ChatTemplateError, InvalidRequestError

# ChatML: what llama.cpp also falls back to when a model ships no template.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

MAX_OUTPUT_CHARS = 4 << 20
MAX_RENDER_SECONDS = 2.0
ROLES = ("system", "user", "assistant", "tool", "developer")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template error: {message}")


def _strftime_now(fmt: str) -> str:
    return time.strftime(fmt)


class _Deadline:
    """Stops a template that runs too long: a tracer on the template's own frames only."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.ticks = 0

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        self.ticks += 1
        if self.ticks & 1023 == 0 and time.monotonic() > self.end:
            raise ChatTemplateError("chat template took too long to render")
        return self._local

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == "<template>":
            return self._local
        return None


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check an OpenAI-style message list; content may be a string or a list of text parts."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of objects")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidRequestError(f"messages[{i}] must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        content = msg.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                is_text = isinstance(part, dict) and part.get("type") == "text"
                if not (is_text and isinstance(part.get("text"), str)):
                    raise InvalidRequestError(
                        f"messages[{i}].content: only text parts are supported"
                    )
                texts.append(part["text"])
            content = "".join(texts)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise InvalidRequestError(f"messages[{i}].content must be a string")
        out.append({**msg, "role": role, "content": content})
    return out


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2 import TemplateError

        self.is_fallback = not source
        self.source = source or FALLBACK_TEMPLATE
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = _bounded_environment()
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        from jinja2 import meta

        try:
            ast = env.parse(self.source)  # parsed once: compiled, and searched for `tools`
            self._template = env.from_string(ast)
            variables = meta.find_undeclared_variables(ast)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        # Qwen 2.5's template renders `tools` and tool turns itself; others get them as text
        self.renders_tools = "tools" in variables

    @classmethod
    def from_gguf(cls, metadata: dict[str, Any], tokenizer: Any | None = None) -> ChatTemplate:
        source = metadata.get("tokenizer.chat_template")
        bos = eos = ""
        if tokenizer is not None:
            if tokenizer.bos_id is not None:
                bos = tokenizer.decode([tokenizer.bos_id])
            if tokenizer.eos_id is not None:
                eos = tokenizer.decode([tokenizer.eos_id])
        return cls(source if isinstance(source, str) else None, bos_token=bos, eos_token=eos)

    def render(
        self, messages: Any, *, add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        from jinja2 import TemplateError
        from jinja2.exceptions import SecurityError

        messages = validate_messages(messages)
        context = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
        }
        pieces: list[str] = []
        size = 0
        previous = sys.gettrace()
        sys.settrace(_Deadline(MAX_RENDER_SECONDS))
        try:
            for piece in self._template.generate(**context):
                size += len(piece)
                if size > MAX_OUTPUT_CHARS:
                    raise ChatTemplateError(
                        f"chat template output exceeds {MAX_OUTPUT_CHARS} characters"
                    )
                pieces.append(piece)
        except ChatTemplateError:
            raise
        except SecurityError as exc:
            raise ChatTemplateError(f"chat template tried an unsafe operation: {exc}") from exc
        except (TemplateError, TypeError, ValueError, AttributeError, KeyError,
                IndexError, OverflowError, RecursionError) as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        finally:
            sys.settrace(previous)
        return "".join(pieces)


def _bounded_environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        # `"x" * 10**9` would allocate before any output check could see it
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and isinstance(right, int) and right > 64:
                raise ChatTemplateError("chat template uses a huge exponent")
            if operator == "*":
                seq, times = (left, right) if isinstance(left, (str, list)) else (right, left)
                if (isinstance(seq, (str, list)) and isinstance(times, int)
                        and len(seq) * times > MAX_OUTPUT_CHARS):
                    raise ChatTemplateError("chat template builds a huge string")
            return super().call_binop(context, operator, left, right)

        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            # the stock sandbox answers an unsafe attribute with a silent Undefined; a template
            # reaching for internals is hostile, so refuse loudly
            raise ChatTemplateError(
                f"chat template tried an unsafe operation: attribute {attribute!r} "
                f"of {type(obj).__name__!r}"
            )

    return BoundedEnvironment(trim_blocks=True, lstrip_blocks=True)


def _tojson(value: Any, indent: int | None = None) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, indent=indent)
