"""Conversation: the messages of one chat, its system prompt and sampling settings.

Plain data with a JSON form; no Textual here, so the plain REPL shares it.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from localinfer.errors import InvalidRequestError
from localinfer.sampling_defaults import SamplingDefaults
from localinfer.sampling_params import SamplingParams

ROLES = ("user", "assistant")
# 2: sampling settings may be None (the model's recommendation); version 1 always wrote
# temperature 0.7 and top-p 0.95, its fixed defaults, which read back as None
FORMAT_VERSION = 2
V1_DEFAULTS = {"temperature": 0.7, "top_p": 0.95}
# the settings a user can set, SamplingParams' name for each
SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
            "min_p": "min_p", "repeat_penalty": "repetition_penalty"}


@dataclass(slots=True)
class ChatSettings:
    # None: the model's recommended value (GGUF general.sampling.*), else llama.cpp's
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    max_tokens: int = 512

    def overrides(self) -> dict[str, Any]:
        """SamplingParams field -> the value set here (None: not set)."""
        return {param: getattr(self, name) for name, param in SAMPLING.items()}

    def sampling_params(self, defaults: SamplingDefaults | None = None) -> SamplingParams:
        """`defaults`: the loaded model's (None: llama.cpp's, before a model is loaded)."""
        defaults = defaults or SamplingDefaults.llama_cpp()
        return defaults.params(**self.overrides(), max_tokens=self.max_tokens)

    def validate(self) -> None:
        self.sampling_params()  # raises InvalidRequestError with the offending field


def describe_settings(settings: ChatSettings, defaults: SamplingDefaults | None) -> str:
    """The effective sampling settings, each with where it came from; and max tokens."""
    defaults = defaults or SamplingDefaults.llama_cpp()
    params = settings.sampling_params(defaults)
    line = defaults.describe(params, settings.overrides(), seed=False)
    return f"{line}, max tokens {settings.max_tokens}"


@dataclass(slots=True)
class Message:
    role: str  # "user" | "assistant"
    content: str
    meta: dict[str, Any] = field(default_factory=dict)  # stopped, finish_reason, stats


def new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def is_valid_id(conv_id: str) -> bool:
    return bool(conv_id) and len(conv_id) <= 64 and all(c.isalnum() or c in "-_" for c in conv_id)


@dataclass(slots=True)
class Conversation:
    id: str = field(default_factory=new_id)
    model: str = ""
    system: str = ""
    messages: list[Message] = field(default_factory=list)
    settings: ChatSettings = field(default_factory=ChatSettings)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    title: str = ""

    def display_title(self) -> str:
        if self.title:
            return self.title
        first = next((m.content for m in self.messages if m.role == "user"), "")
        line = " ".join(first.split())
        return (line[:60] + "…") if len(line) > 60 else (line or "(empty chat)")

    def prompt_messages(self) -> list[dict[str, str]]:
        """OpenAI-style messages for the chat template: system prompt, then the turns."""
        out = [{"role": "system", "content": self.system}] if self.system.strip() else []
        out += [{"role": m.role, "content": m.content} for m in self.messages]
        return out

    def num_turns(self) -> int:
        return sum(1 for m in self.messages if m.role == "user")

    def drop_oldest_turns(self, n: int) -> int:
        """Remove the `n` oldest user turns and their replies; returns messages removed."""
        removed = 0
        for _ in range(n):
            if not self.messages:
                break
            del self.messages[0]
            removed += 1
            while self.messages and self.messages[0].role != "user":
                del self.messages[0]
                removed += 1
        return removed

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = FORMAT_VERSION
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Conversation:
        if not isinstance(data, dict):
            raise InvalidRequestError("conversation file is not a JSON object")
        try:
            messages = [
                Message(str(m["role"]), str(m["content"]), dict(m.get("meta") or {}))
                for m in data.get("messages", [])
            ]
            settings_data = dict(data.get("settings") or {})
            if int(data.get("version", 1)) < 2:
                for name, value in V1_DEFAULTS.items():
                    if settings_data.get(name) == value:
                        settings_data[name] = None
            settings = ChatSettings(**settings_data)
            conv = cls(
                id=str(data["id"]),
                model=str(data.get("model", "")),
                system=str(data.get("system", "")),
                messages=messages,
                settings=settings,
                created=float(data.get("created", 0.0)),
                updated=float(data.get("updated", 0.0)),
                title=str(data.get("title", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequestError(f"conversation file is malformed: {exc}") from exc
        if not is_valid_id(conv.id):
            raise InvalidRequestError(f"conversation file has a bad id: {conv.id!r}")
        if any(m.role not in ROLES for m in conv.messages):
            raise InvalidRequestError("conversation file has a message with an unknown role")
        return conv
