"""Turn chat messages and completion prompts into token ids, and check them against the context.

Context policy: a prompt longer than the context is a 400 `context_length_exceeded` (both
numbers in the message) before anything is generated or streamed. A prompt that fits but
leaves less room than max_tokens is accepted; generation stops at the context limit with
finish_reason "length". The prompt itself is never truncated.
"""

from __future__ import annotations

from typing import Any

from localinfer.chat_template import validate_messages
from localinfer.errors import ChatTemplateError, InvalidRequestError
from localinfer.server.protocol import APIError, invalid
from localinfer.tools.messages import for_template
from localinfer.tools.spec import ToolConfig, ToolRequestError


def chat_prompt(llm: Any, messages: Any, tools: ToolConfig | None = None) -> list[int]:
    """Token ids of the chat, with the offered tools (and earlier tool turns) rendered the
    way the model's template expects, or described as text where it has no tool support."""
    try:
        checked = validate_messages(messages)
        checked, template_vars = for_template(checked, tools, llm.chat_template.renders_tools)
    except ToolRequestError as exc:
        raise invalid(exc.param, str(exc)) from exc
    except InvalidRequestError as exc:
        raise invalid("messages", str(exc)) from exc
    try:
        return llm.encode(checked, **template_vars)
    except ChatTemplateError as exc:
        raise invalid("messages", str(exc)) from exc


def completion_prompts(llm: Any, prompt: Any) -> list[list[int]]:
    """`prompt` may be a string, token ids, or a list of either (a batch)."""
    if isinstance(prompt, str):
        return [_text_prompt(llm, prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, (int, float)) for t in prompt):  # ids; bools and floats fail
            return [check_token_ids(llm, prompt, "prompt")]
        if all(isinstance(p, str) for p in prompt):
            return [_text_prompt(llm, p) for p in prompt]
        if all(isinstance(p, list) for p in prompt):
            return [check_token_ids(llm, p, "prompt") for p in prompt]
    raise invalid("prompt", "'prompt' must be a string, a list of token ids, or a "
                  "non-empty list of strings or of token-id lists")


def _text_prompt(llm: Any, text: str) -> list[int]:
    ids = llm.tokenizer.encode(text, add_special=True, parse_special=False)
    if not ids:
        raise invalid("prompt", "the prompt has no tokens")
    return ids


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_token_ids(llm: Any, ids: Any, param: str) -> list[int]:
    n_vocab = llm.tokenizer.n_vocab
    if not isinstance(ids, list) or not ids:
        raise invalid(param, f"'{param}' must be a non-empty list of token ids",
                      code="invalid_tokens")
    for t in ids:
        if not _is_int(t) or not 0 <= t < n_vocab:
            raise invalid(param, f"invalid token id {t!r}: token ids must be integers in "
                          f"[0, {n_vocab})", code="invalid_tokens")
    return ids


def check_context(prompt_len: int, max_model_len: int, param: str) -> None:
    if prompt_len > max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens, but the prompt "
            f"has {prompt_len} tokens. Shorten the prompt.",
            param=param, code="context_length_exceeded",
        )
